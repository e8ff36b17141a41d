"""Tests for common/algorithms/sac.py: targets, temperature, fused == split, checkpoints."""

from __future__ import annotations

import io
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from tests import helpers
from spreeze.common.algorithms.sac import SACConfig
from spreeze.common.algorithms.base import fused_step
from spreeze.common.algorithms.build import make_parts
from spreeze.common.algorithms.sac import SACActorPart, SACCriticPart

torch.set_num_threads(1)
CPU = torch.device("cpu")
OBS, ACT = 3, 2
LOW, HIGH = np.array([-1.0, -2.0]), np.array([1.0, 2.0])
SMALL = SACConfig(hidden=(32, 32))


def parts(cfg: SACConfig = SMALL, shared: bool = True,
          seed: int = 0) -> tuple[SACActorPart, SACCriticPart]:
    a, c = make_parts("sac", OBS, ACT, LOW, HIGH, cfg, CPU, shared, seed)
    assert isinstance(a, SACActorPart) and isinstance(c, SACCriticPart)
    return a, c


def make_batches(n: int, size: int = 64, seed: int = 0, done: float = 1.0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        obs = torch.rand(size, OBS, generator=g) * 2 - 1
        act = (torch.rand(size, ACT, generator=g) * 2 - 1) * torch.tensor([1.0, 2.0])
        reward = obs.sum(-1) - ((act - torch.tensor([0.5, -1.0])) ** 2).sum(-1)
        out.append({"obs": obs, "action": act, "reward": reward,
                    "next_obs": torch.rand(size, OBS, generator=g) * 2 - 1,
                    "done": torch.full((size,), done)})
    return out


def flat(*modules: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for m in modules for p in m.parameters()])


@pytest.mark.parametrize("field,value", [("tau", 1.5), ("gamma", -0.1), ("actor_lr", 0.0),
                                         ("alpha_lr", -1.0), ("init_alpha", 0.0),
                                         ("target_entropy", math.inf), ("log_std_min", 3.0)])
def test_config_validation_names_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"sac\.{field}={value!r}"):
        replace(SACConfig(), **{field: value}).validate()


def test_default_config_valid_and_algo_mismatch_rejected() -> None:
    SACConfig().validate()
    with pytest.raises(ValueError, match="algo='td3'"):
        make_parts("td3", OBS, ACT, LOW, HIGH, SACConfig(), CPU, True)


def test_td_target_uses_entropy_bonus() -> None:
    _, critic = parts(replace(SMALL, init_alpha=0.5))
    batch = make_batches(1, done=0.0)[0]
    batch["done"][:8] = 1.0
    state = critic.generator.get_state()
    y = critic.td_target(batch)
    critic.generator.set_state(state)
    with torch.no_grad():
        a, logp = critic.actor(batch["next_obs"], generator=critic.generator)
        q1, q2 = critic.critic_target(batch["next_obs"], a)
    v = torch.minimum(q1, q2) - 0.5 * logp
    expected = batch["reward"] + 0.99 * (1 - batch["done"]) * v
    assert torch.allclose(y, expected, atol=1e-5)
    assert torch.equal(y[:8], batch["reward"][:8])


def test_fused_learning_critic_loss_falls() -> None:
    actor, critic = parts()
    batches = make_batches(32)
    probe, best = torch.rand(256, OBS) * 2 - 1, torch.tensor([0.5, -1.0])

    def distance() -> float:  # of the deterministic action from the reward's maximum
        with torch.no_grad():
            return float((actor.actor(probe, deterministic=True)[0] - best).norm(dim=-1).mean())

    start = distance()
    first = critic.update(batches[0])["critic_loss"]
    losses = [fused_step(actor, critic, batches[i % 32])["critic_loss"] for i in range(1, 500)]
    assert np.mean(losses[-20:]) < 0.05 * first
    assert distance() < 0.5 * start  # entropy bonus keeps it off the exact maximum


def test_temperature_autotune_direction_and_fixed_alpha() -> None:
    batch = make_batches(1)[0]
    low_target, _ = parts(replace(SMALL, target_entropy=-50.0))  # entropy far above target
    high_target, _ = parts(replace(SMALL, target_entropy=50.0))  # entropy far below target
    fixed, _ = parts(replace(SMALL, autotune=False, init_alpha=0.2))
    for _ in range(20):
        low_target.update(batch), high_target.update(batch)
        metrics = fixed.update(batch)
    assert low_target.extras()["alpha"] < 0.995 < 1.005 < high_target.extras()["alpha"]
    assert fixed.extras()["alpha"] == pytest.approx(0.2) and "alpha_loss" not in metrics
    assert set(low_target.update(batch)) == {"actor_loss", "alpha", "entropy", "alpha_loss"}


def test_actor_update_leaves_critic_untouched() -> None:
    actor, critic = parts()
    before = flat(critic.critic)
    actor.update(make_batches(1)[0])
    assert torch.equal(flat(critic.critic), before)
    assert all(p.grad is None for p in critic.critic.parameters())


def test_split_with_exchange_every_update_equals_fused_exactly() -> None:
    batches = make_batches(10, done=0.0)
    fa, fc = parts(shared=True)
    for b in batches:
        fused_step(fa, fc, b)
    sa, sc = parts(shared=False)
    helpers.run_split(sa, sc, batches)
    assert torch.equal(flat(fa.actor), flat(sa.actor))
    assert torch.equal(flat(fc.critic, fc.critic_target), flat(sc.critic, sc.critic_target))
    assert torch.equal(fa.log_alpha, sa.log_alpha) and torch.equal(sc.log_alpha, sa.log_alpha)
    assert fa.log_alpha.item() < 0.0  # alpha actually moved


def test_load_actor_accepts_alpha_alone() -> None:
    actor, critic = parts(shared=False)
    critic.load_actor(actor.actor_state(), None, {"alpha": 0.25})
    assert critic.log_alpha.item() == pytest.approx(math.log(0.25))


@pytest.mark.parametrize("shared", [True, False])
def test_save_load_round_trip_restores_optimizer_and_rng(shared: bool) -> None:
    batches = make_batches(8, done=0.0)
    a1, c1 = parts(shared=shared)
    helpers.run_split(a1, c1, batches[:5])
    buf = io.BytesIO()
    torch.save({"actor": a1.save(), "critic": c1.save()}, buf)
    helpers.run_split(a1, c1, batches[5:])
    buf.seek(0)
    saved = torch.load(buf)
    a2, c2 = parts(shared=shared, seed=7)
    a2.load(saved["actor"])
    c2.load(saved["critic"])
    helpers.run_split(a2, c2, batches[5:])
    assert torch.equal(flat(a1.actor), flat(a2.actor))
    assert torch.equal(a1.log_alpha, a2.log_alpha)
    assert torch.equal(flat(c1.critic, c1.critic_target), flat(c2.critic, c2.critic_target))
