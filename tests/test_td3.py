"""Tests for common/algorithms/td3.py: targets, schedule, fused == split, checkpoints."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest
import torch

from tests import helpers
from spreeze.common.algorithms.td3 import TD3Config
from spreeze.common.algorithms.base import fused_step
from spreeze.common.algorithms.build import make_parts
from spreeze.common.algorithms.td3 import TD3ActorPart, TD3CriticPart

torch.set_num_threads(1)
CPU = torch.device("cpu")
OBS, ACT = 3, 2
LOW, HIGH = np.array([-1.0, -2.0]), np.array([1.0, 2.0])
SMALL = TD3Config(hidden=(32, 32))


def parts(cfg: TD3Config = SMALL, shared: bool = True,
          seed: int = 0) -> tuple[TD3ActorPart, TD3CriticPart]:
    a, c = make_parts("td3", OBS, ACT, LOW, HIGH, cfg, CPU, shared, seed)
    assert isinstance(a, TD3ActorPart) and isinstance(c, TD3CriticPart)
    return a, c


def reward_fn(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Known reward, maximised at action = (0.5, -1.0)."""
    target = torch.tensor([0.5, -1.0])
    return obs.sum(-1) - ((action - target) ** 2).sum(-1)


def make_batches(n: int, size: int = 64, seed: int = 0, done: float = 1.0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        obs = torch.rand(size, OBS, generator=g) * 2 - 1
        act = (torch.rand(size, ACT, generator=g) * 2 - 1) * torch.tensor([1.0, 2.0])
        out.append({"obs": obs, "action": act, "reward": reward_fn(obs, act),
                    "next_obs": torch.rand(size, OBS, generator=g) * 2 - 1,
                    "done": torch.full((size,), done)})
    return out


def flat(*modules: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for m in modules for p in m.parameters()])


@pytest.mark.parametrize("field,value", [("tau", 1.5), ("tau", 0.0), ("gamma", 1.2),
                                         ("actor_lr", 0.0), ("critic_lr", -1e-3),
                                         ("policy_delay", 0), ("noise_clip", -0.1),
                                         ("weight_decay", -1.0), ("hidden", ()),
                                         ("hidden", (256, 0)), ("exploration_noise", -0.2)])
def test_config_validation_names_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"td3\.{field}={value!r}".replace("(", r"\(")
                       .replace(")", r"\)")):
        replace(TD3Config(), **{field: value}).validate()


def test_default_config_valid_and_algo_mismatch_rejected() -> None:
    TD3Config().validate()
    with pytest.raises(ValueError, match="algo='sac'"):
        make_parts("sac", OBS, ACT, LOW, HIGH, TD3Config(), CPU, True)


def test_target_policy_smoothing_is_clipped() -> None:
    cfg = replace(SMALL, policy_noise=100.0, noise_clip=0.5)
    _, critic = parts(cfg)
    next_obs = torch.rand(2000, OBS) * 2 - 1
    with torch.no_grad():
        clean = critic.actor_target(next_obs)
    noisy = critic.target_action(next_obs)
    scale = torch.tensor([1.0, 2.0])
    dev = (noisy - clean).abs()
    low, high = torch.tensor(LOW, dtype=torch.float32), torch.tensor(HIGH, dtype=torch.float32)
    assert torch.all(noisy >= low) and torch.all(noisy <= high)
    assert torch.all(dev <= 0.5 * scale + 1e-6)
    # huge noise saturates the clip: most deviations sit at the clip or the action bound
    at_clip = torch.isclose(dev, 0.5 * scale, atol=1e-5) | (noisy == low) | (noisy == high)
    assert at_clip.float().mean() > 0.99


def test_td_target_formula() -> None:
    _, critic = parts(replace(SMALL, policy_noise=0.0))
    batch = make_batches(1, done=0.0)[0]
    batch["done"][:10] = 1.0
    y = critic.td_target(batch)
    with torch.no_grad():
        q1, q2 = critic.critic_target(batch["next_obs"], critic.actor_target(batch["next_obs"]))
    expected = batch["reward"] + 0.99 * (1 - batch["done"]) * torch.minimum(q1, q2)
    assert torch.allclose(y, expected, atol=1e-6)
    assert torch.equal(y[:10], batch["reward"][:10])


def test_fused_learning_critic_fits_reward_and_actor_finds_maximum() -> None:
    actor, critic = parts()
    batches = make_batches(32)
    first = critic.update(batches[0])["critic_loss"]
    losses = [fused_step(actor, critic, batches[i % 32])["critic_loss"] for i in range(1, 600)]
    assert np.mean(losses[-20:]) < 0.05 * first
    with torch.no_grad():
        a = actor.actor(torch.rand(256, OBS) * 2 - 1).mean(0)
    assert torch.allclose(a, torch.tensor([0.5, -1.0]), atol=0.25), a  # starts near 0


def test_target_schedule_follows_original_td3() -> None:
    actor, critic = parts()
    batches = make_batches(4)
    critic_t0, actor_t0 = flat(critic.critic_target), flat(actor.actor_target)
    fused_step(actor, critic, batches[0])  # update 1: critic only, no target moves
    assert critic.updates == 1 and actor.updates == 0
    assert torch.equal(flat(critic.critic_target), critic_t0)
    assert torch.equal(flat(actor.actor_target), actor_t0)
    fused_step(actor, critic, batches[1])  # update 2: actor step and all targets move
    assert actor.updates == 1
    assert not torch.equal(flat(critic.critic_target), critic_t0)
    assert not torch.equal(flat(actor.actor_target), actor_t0)


def test_actor_update_leaves_critic_untouched() -> None:
    actor, critic = parts()
    before = flat(critic.critic)
    actor.update(make_batches(1)[0])
    assert torch.equal(flat(critic.critic), before)
    assert all(p.grad is None for p in critic.critic.parameters())


def test_split_with_exchange_every_update_equals_fused_exactly() -> None:
    batches = make_batches(12, done=0.0)
    fa, fc = parts(shared=True)
    for b in batches:
        fused_step(fa, fc, b)
    sa, sc = parts(shared=False)
    helpers.run_split(sa, sc, batches, exchange=True)
    for f, s in [(fa.actor, sa.actor), (fa.actor_target, sa.actor_target),
                 (fc.critic, sc.critic), (fc.critic_target, sc.critic_target)]:
        assert torch.equal(flat(f), flat(s))
    # and without the exchange the split pair diverges (the test can fail)
    na, nc = parts(shared=False)
    helpers.run_split(na, nc, batches, exchange=False)
    assert not torch.equal(flat(fa.actor), flat(na.actor))


def test_state_is_a_float32_copy_and_load_checks_shapes() -> None:
    actor, critic = parts(shared=False)
    state = critic.critic_state()
    assert all(v.dtype == np.float32 and v.flags.c_contiguous for v in state.values())
    before = flat(critic.critic)
    next(iter(state.values()))[...] = 7.0
    assert torch.equal(flat(critic.critic), before)
    first_weight = actor.critic.qf1[0].weight
    actor.load_critic(state)
    assert actor.critic.qf1[0].weight is first_weight  # copied in place
    assert np.all(first_weight.detach().numpy() == 7.0)
    bad = dict(state, **{"qf1.0.bias": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="qf1.0.bias"):
        actor.load_critic(bad)
    with pytest.raises(ValueError, match="missing"):
        actor.load_critic({k: v for k, v in state.items() if k != "qf2.2.weight"})
    with pytest.raises(ValueError, match="target actor"):
        critic.load_actor(actor.actor_state(), None, {})


@pytest.mark.parametrize("shared", [True, False])
def test_save_load_round_trip_restores_optimizer_and_rng(shared: bool) -> None:
    batches = make_batches(10, done=0.0)
    a1, c1 = parts(shared=shared)
    helpers.run_split(a1, c1, batches[:6], exchange=True)
    buf = io.BytesIO()
    torch.save({"actor": a1.save(), "critic": c1.save()}, buf)
    helpers.run_split(a1, c1, batches[6:], exchange=True)
    buf.seek(0)
    saved = torch.load(buf)  # weights_only: checkpoints hold no pickled objects
    a2, c2 = parts(shared=shared, seed=123)
    a2.load(saved["actor"])
    c2.load(saved["critic"])
    assert (a2.updates, c2.updates) == (3, 6)
    helpers.run_split(a2, c2, batches[6:], exchange=True)
    assert torch.equal(flat(a1.actor, a1.actor_target), flat(a2.actor, a2.actor_target))
    assert torch.equal(flat(c1.critic, c1.critic_target), flat(c2.critic, c2.critic_target))


def test_save_is_a_snapshot_and_metrics_optional() -> None:
    actor, critic = parts()
    snap = critic.save()
    w = snap["states"]["critic"]["qf1.0.weight"].clone()
    assert critic.update(make_batches(1)[0], want_metrics=False) == {}
    assert torch.equal(snap["states"]["critic"]["qf1.0.weight"], w)
    assert not torch.equal(critic.critic.qf1[0].weight, w)
    assert set(critic.update(make_batches(1)[0])) == {"critic_loss", "q_mean"}
