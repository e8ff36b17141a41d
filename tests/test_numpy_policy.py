"""Tests for common/numpy_policy.py: the description of each actor, run in numpy, equals the torch
forward; exploration; in-place load; bounds that do not fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from spreeze.common.algorithms.base import module_state
from spreeze.common.errors import PolicyParamError, PolicyShapeError
from spreeze.common.networks import DeterministicActor, GaussianActor, ObsNorm, Residual
from spreeze.common.numpy_policy import NumpyActor
from spreeze.common.policy_export import describe_actor

torch.set_num_threads(1)
LOW = np.array([-1.0, -2.0, 0.0], dtype=np.float32)
HIGH = np.array([1.0, 3.0, 0.5], dtype=np.float32)
OBS = 6


def torch_actor(algo: str, hidden: tuple[int, ...] = (32, 16), seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if algo == "td3":
        return DeterministicActor(OBS, 3, hidden, LOW, HIGH)
    return GaussianActor(OBS, 3, hidden, LOW, HIGH, -5.0, 2.0)


def numpy_actor(actor: nn.Module, noise: float = 0.0) -> NumpyActor:
    return NumpyActor(describe_actor(actor, noise), module_state(actor), LOW, HIGH)


def torch_mean_action(actor: nn.Module, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        x = torch.from_numpy(obs)
        out = actor(x) if isinstance(actor, DeterministicActor) else actor(x, True)[0]
    return out.numpy()


@pytest.mark.parametrize("algo", ["td3", "sac"])
@pytest.mark.parametrize("hidden", [(32, 16), (64,), (8, 8, 8)])
@pytest.mark.parametrize("envs", [1, 7, 64])
def test_deterministic_matches_torch(algo: str, hidden: tuple[int, ...], envs: int) -> None:
    actor = torch_actor(algo, hidden)
    np_actor = numpy_actor(actor)
    obs = np.random.default_rng(envs).standard_normal((envs, OBS)).astype(np.float32)
    a = np_actor.act(obs, np.random.default_rng(0), explore=False)
    assert a.shape == (envs, 3) and a.dtype == np.float32
    np.testing.assert_allclose(a, torch_mean_action(actor, obs), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np_actor.mean_action(obs), a, atol=1e-6, rtol=0)


def test_sac_sample_equals_torch_given_the_same_normal_draw() -> None:
    """Exploring, the tanh-Gaussian head draws standard normals [E, act_dim] from the rng, as torch's
    actor does from `eps`: the same draw gives the same action."""
    actor = torch_actor("sac", (32, 32))
    obs = np.random.default_rng(4).standard_normal((9, OBS)).astype(np.float32)
    a = numpy_actor(actor).act(obs, np.random.default_rng(5), explore=True)
    eps = np.random.default_rng(5).standard_normal((9, 3), dtype=np.float32)
    with torch.no_grad():
        ref = actor(torch.from_numpy(obs), eps=torch.from_numpy(eps))[0].numpy()
    np.testing.assert_allclose(a, np.clip(ref, LOW, HIGH), atol=1e-5, rtol=0)


def test_td3_exploration_noise_comes_from_the_description() -> None:
    actor = torch_actor("td3")
    np_actor = numpy_actor(actor, 0.1)
    obs = np.zeros((20000, OBS), np.float32)
    det = np_actor.act(obs, np.random.default_rng(0), explore=False)
    a = np_actor.act(obs, np.random.default_rng(1), explore=True)
    assert np.all(a >= LOW) and np.all(a <= HIGH)
    inside = (a > LOW) & (a < HIGH)
    expected_std = 0.1 * (HIGH - LOW) / 2
    noise_std = np.array([(a - det)[inside[:, j], j].std() for j in range(3)])
    np.testing.assert_allclose(noise_std, expected_std, rtol=0.1)
    big = numpy_actor(actor, 10.0)
    b = big.act(obs[:2000], np.random.default_rng(2), explore=True)
    assert np.all(b >= LOW) and np.all(b <= HIGH) and np.any(b == HIGH) and np.any(b == LOW)
    quiet = numpy_actor(actor, 0.0)  # no noise: exploring acts deterministically (same batch size: a
    # matrix product over 5 rows may round differently from one over 20,000, by 1e-8 in CI once)
    np.testing.assert_array_equal(quiet.act(obs[:5], np.random.default_rng(3), True),
                                  np_actor.act(obs[:5], np.random.default_rng(0), explore=False))


def test_sac_sampling_matches_torch_distribution() -> None:
    actor = torch_actor("sac")
    np_actor = numpy_actor(actor)
    obs = np.tile(np.random.default_rng(0).standard_normal((1, OBS)).astype(np.float32), (20000, 1))
    a = np_actor.act(obs, np.random.default_rng(1), explore=True)
    with torch.no_grad():
        ref = actor(torch.from_numpy(obs), generator=torch.Generator().manual_seed(1))[0].numpy()
    assert np.all(a >= LOW) and np.all(a <= HIGH)
    np.testing.assert_allclose(a.mean(0), ref.mean(0), atol=0.03)
    np.testing.assert_allclose(a.std(0), ref.std(0), rtol=0.05, atol=0.01)
    det = np_actor.act(obs[:1], np.random.default_rng(1), explore=False)
    assert np.abs(a.std(0)).min() > 0.01 and not np.allclose(a[:1], det)


class Rich(nn.Module):
    """An actor with every body op: obs norm, layer norm, residual blocks, each activation."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = ObsNorm(OBS, eps=1e-6, clip=3.0)
        self.net = nn.Sequential(
            nn.Linear(OBS, 16), nn.LayerNorm(16), nn.ELU(alpha=0.7),
            Residual(nn.Sequential(nn.Linear(16, 16), nn.SiLU(), nn.Linear(16, 16, bias=False))),
            nn.Tanh(), Residual(nn.Sequential(nn.LayerNorm(16, elementwise_affine=False), nn.ReLU())),
            nn.Identity(), nn.Linear(16, 3))
        self.actor = DeterministicActor(3, 3, (8,), LOW, HIGH)  # its own MLP and squash head on top

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(self.net(self.norm(obs)))

    def policy_ops(self, path: str, walk: object) -> list[dict[str, object]]:
        assert callable(walk)
        return [*walk(self.norm, "norm"), *walk(self.net, "net"), *walk(self.actor, "actor")]


def test_layer_norm_residual_obs_norm_and_activations_match_torch() -> None:
    torch.manual_seed(2)
    rich = Rich()
    with torch.no_grad():
        rich.norm.mean.uniform_(-1, 1)
        rich.norm.var.uniform_(0.1, 4)
        for m in rich.modules():
            if isinstance(m, nn.LayerNorm) and m.weight is not None:
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    ops = [op["op"] for op in describe_actor(rich)["ops"]]
    assert ops[:4] == ["obs_norm", "linear", "layer_norm", "elu"] and ops.count("add") == 2
    np_actor = numpy_actor(rich)
    obs = (4 * np.random.default_rng(0).standard_normal((33, OBS))).astype(np.float32)  # some clipped
    with torch.no_grad():
        ref = rich(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(np_actor.act(obs, np.random.default_rng(0), False), ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np_actor.mean_action(obs[:1]), ref[:1], atol=1e-5, rtol=0)  # E = 1


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_load_updates_in_place(algo: str) -> None:
    np_actor = numpy_actor(torch_actor(algo, seed=0))
    weights = [own for _, own, _ in np_actor._bound]
    assert all(own.flags.writeable and own.flags.c_contiguous for own in weights)
    other = torch_actor(algo, seed=1)
    np_actor.load(module_state(other))
    assert all(a is b for a, b in zip((own for _, own, _ in np_actor._bound), weights))
    obs = np.random.default_rng(3).standard_normal((5, OBS)).astype(np.float32)
    np.testing.assert_allclose(np_actor.act(obs, np.random.default_rng(0), False),
                               torch_mean_action(other, obs), atol=1e-5, rtol=0)
    with pytest.raises(PolicyShapeError, match="shape"):
        np_actor.load(module_state(torch_actor(algo, hidden=(32, 17))))
    partial = module_state(other)
    del partial["scale"]
    with pytest.raises(PolicyParamError, match="'scale'"):
        np_actor.load(partial)


def test_weights_are_copied_so_read_only_wire_buffers_load_in_place() -> None:
    actor = torch_actor("sac")
    state = module_state(actor)
    for arr in state.values():
        arr.flags.writeable = False  # as arrays decoded from message frames are
    np_actor = NumpyActor(describe_actor(actor), state, LOW, HIGH)
    np_actor.load(state)
    assert not any(np.shares_memory(own, state[name]) for name, own, _ in np_actor._bound)


def test_obs_norm_load_refreshes_the_derived_std() -> None:
    torch.manual_seed(0)
    actor = nn.Sequential(ObsNorm(OBS), DeterministicActor(OBS, 3, (8,), LOW, HIGH))
    np_actor = numpy_actor(actor)
    with torch.no_grad():
        actor[0].var.fill_(9.0)
    np_actor.load(module_state(actor))
    obs = np.ones((2, OBS), np.float32)
    with torch.no_grad():
        ref = actor(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(np_actor.mean_action(obs), ref, atol=1e-5, rtol=0)


def test_rejects_bounds_and_weights_that_do_not_fit() -> None:
    actor = torch_actor("td3")
    with pytest.raises(PolicyShapeError, match="act_dim=3"):
        NumpyActor(describe_actor(actor), module_state(actor), LOW[:2], HIGH[:2])
    sac = torch_actor("sac")  # a SAC actor's weights under a TD3 description: the head does not fit
    with pytest.raises(PolicyParamError, match="net.0.weight"):
        NumpyActor(describe_actor(actor), module_state(sac), LOW, HIGH)
