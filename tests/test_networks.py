"""Tests for common/networks.py: shapes, bounds, and SAC's squashed-Gaussian log-prob."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import distributions as D
from torch import nn

from spreeze.common.networks import DeterministicActor, GaussianActor, TwinCritic, mlp

torch.set_num_threads(1)
LOW = np.array([-1.0, -2.0, 0.0], dtype=np.float32)
HIGH = np.array([1.0, 3.0, 0.5], dtype=np.float32)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def test_mlp_layers_are_linear_at_even_indices() -> None:
    net = mlp(5, (7, 11), 3)
    linears = [m for m in net if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(5, 7), (7, 11), (11, 3)]
    assert all(isinstance(net[i], nn.Linear) for i in (0, 2, 4))
    assert isinstance(net[-1], nn.Linear)
    trunk = mlp(5, (7,), None)
    assert isinstance(trunk[-1], nn.ReLU) and trunk(torch.randn(2, 5)).shape == (2, 7)


def test_deterministic_actor_shape_and_bounds() -> None:
    actor = DeterministicActor(4, 3, (16, 16), LOW, HIGH)
    with torch.no_grad():
        a = actor(torch.randn(512, 4) * 10)
        assert a.shape == (512, 3)
        assert torch.all(a >= torch.from_numpy(LOW)) and torch.all(a <= torch.from_numpy(HIGH))
        actor.net[-1].weight.zero_()
        for sign, bound in ((1.0, HIGH), (-1.0, LOW), (0.0, (LOW + HIGH) / 2)):
            actor.net[-1].bias.fill_(sign * 30.0)  # saturate tanh at +1 / -1, or 0
            assert torch.allclose(actor(torch.randn(4, 4)), torch.from_numpy(bound).expand(4, 3))
    assert set(actor.state_dict()) >= {"scale", "bias"}


def test_bad_bounds_rejected() -> None:
    with pytest.raises(ValueError, match="high > low"):
        DeterministicActor(4, 3, (8,), HIGH, LOW)
    with pytest.raises(ValueError, match="shape"):
        DeterministicActor(4, 2, (8,), LOW, HIGH)


def test_gaussian_actor_shapes_bounds_and_deterministic() -> None:
    actor = GaussianActor(4, 3, (16, 16), LOW, HIGH, -5.0, 2.0)
    obs = torch.randn(64, 4) * 5
    a, logp = actor(obs)
    assert a.shape == (64, 3) and logp.shape == (64,)
    assert torch.all(a >= torch.from_numpy(LOW)) and torch.all(a <= torch.from_numpy(HIGH))
    mean, log_std = actor.dist_params(obs)
    assert torch.all(log_std >= -5.0) and torch.all(log_std <= 2.0)
    det, _ = actor(obs, deterministic=True)
    expected = torch.tanh(mean) * actor.scale + actor.bias
    assert torch.allclose(det, expected, atol=1e-6)


def _reference_log_prob(actor: GaussianActor, obs: torch.Tensor, seed: int) -> torch.Tensor:
    """Float64 closed form of the same sample: N(u; mean, std) - log|d action / d u|."""
    mean, log_std = (t.double() for t in actor.dist_params(obs))
    g = torch.Generator().manual_seed(seed)
    eps = torch.randn(mean.shape, generator=g).double()
    u = mean + eps * log_std.exp()
    log_n = D.Normal(mean, log_std.exp()).log_prob(u)
    log_jac = torch.log(actor.scale.double() * (1 - torch.tanh(u) ** 2))
    return (log_n - log_jac).sum(-1)


def test_gaussian_log_prob_matches_closed_form() -> None:
    actor = GaussianActor(4, 3, (16,), LOW, HIGH)
    obs = torch.randn(256, 4)
    _, logp = actor(obs, generator=torch.Generator().manual_seed(3))
    ref = _reference_log_prob(actor, obs, 3)
    assert torch.allclose(logp.double(), ref, atol=1e-4, rtol=1e-5)


def test_gaussian_log_prob_matches_transformed_distribution() -> None:
    actor = GaussianActor(4, 3, (16,), LOW, HIGH)
    obs = torch.randn(256, 4) * 0.3  # keep |u| moderate: the reference inverts with atanh
    with torch.no_grad():
        a, logp = actor(obs, generator=torch.Generator().manual_seed(0))
        mean, log_std = actor.dist_params(obs)
        dist = D.TransformedDistribution(
            D.Independent(D.Normal(mean.double(), log_std.double().exp()), 1),
            [D.TanhTransform(), D.AffineTransform(actor.bias.double(), actor.scale.double(),
                                                   event_dim=1)])
        ref = dist.log_prob(a.double())
    assert torch.allclose(logp.double(), ref, atol=2e-3)


def test_gaussian_log_prob_finite_when_saturated() -> None:
    actor = GaussianActor(4, 2, (16,), LOW[:2], HIGH[:2])
    with torch.no_grad():
        actor.head.weight.mul_(1000.0)
    _, logp = actor(torch.randn(128, 4) * 10)
    assert torch.isfinite(logp).all()


def test_gaussian_actor_gradients_flow_through_sample() -> None:
    actor = GaussianActor(4, 2, (16,), LOW[:2], HIGH[:2])
    a, logp = actor(torch.randn(32, 4))
    (a.sum() + logp.sum()).backward()
    assert all(p.grad is not None and torch.any(p.grad != 0) for p in actor.parameters())


def test_twin_critic_shapes_and_independence() -> None:
    critic = TwinCritic(4, 3, (16, 16))
    obs, act = torch.randn(10, 4), torch.randn(10, 3)
    q1, q2 = critic(obs, act)
    assert q1.shape == (10,) and q2.shape == (10,)
    assert torch.equal(critic.q1(obs, act), q1)
    assert not torch.allclose(q1, q2)
    assert math.isclose(sum(p.numel() for p in critic.qf1.parameters()),
                        sum(p.numel() for p in critic.qf2.parameters()))
