"""CrossQ (common/algorithms/crossq.py): its renorm layer, its joint-forward critic update
without targets, the compiled steps against the eager update, split == fused, checkpoints,
sparse critics, and a real run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import spreeze
from spreeze.common.algorithms.base import CheckpointMismatch, fused_step
from spreeze.common.algorithms.build import make_parts
from spreeze.common.algorithms.compiled import CompileOptions, use_compile_cache
from spreeze.common.config import load_config
from spreeze.common.errors import ConfigError
from spreeze.common.networks import BatchRenorm, RenormTwinCritic, move_renorm_stats, renorm_twin_q
from spreeze.common.sparse_config import SparseConfig
from tests.helpers import needs_cxx

OBS, ACT = 5, 2
LOW, HIGH = -2.0 * np.ones(ACT, np.float32), 2.0 * np.ones(ACT, np.float32)
FLAVOURS = ["sac", "td3"]


def config(flavour: str, *overrides: str):  # type: ignore[no-untyped-def]
    return load_config(None, ["algo=crossq", f"crossq.flavour={flavour}", "crossq.hidden=[16,16]",
                              "crossq.critic_hidden=[32,32]", "crossq.renorm_warmup=3", *overrides]).algo_config


def batch(seed: int, n: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(n, OBS, generator=g) * 3 + 1, "action": torch.rand(n, ACT, generator=g) * 4 - 2,
            "reward": torch.randn(n, generator=g), "next_obs": torch.randn(n, OBS, generator=g) * 3 + 1,
            "done": (torch.rand(n, generator=g) < 0.1).float()}


def test_batch_renorm_is_batch_norm_in_warm_up_then_corrects_toward_the_running_statistics() -> None:
    layer = BatchRenorm(3, momentum=0.5, warmup=1, r_max=2.0, d_max=0.5)
    x = torch.tensor([[1.0, 10.0, -4.0], [3.0, 30.0, 4.0]])
    out = layer(x)  # warm-up step: plain batch norm
    torch.testing.assert_close(out, (x - x.mean(0)) / (x.var(0, unbiased=False) + 1e-3).sqrt())
    torch.testing.assert_close(layer.running_mean, 0.5 * x.mean(0))  # halfway from 0 (momentum 0.5)
    torch.testing.assert_close(layer.running_var, 0.5 + 0.5 * x.var(0, unbiased=False))
    mean, var = layer.running_mean.clone(), layer.running_var.clone()
    out = layer(x)  # renorm: r and d clipped to [1/2, 2] and [-0.5, 0.5]
    std, run_std = (x.var(0, unbiased=False) + 1e-3).sqrt(), (var + 1e-3).sqrt()
    r, d = (std / run_std).clamp(0.5, 2.0), ((x.mean(0) - mean) / run_std).clamp(-0.5, 0.5)
    torch.testing.assert_close(out, (x - x.mean(0)) / std * r + d)
    layer.eval()
    before = layer.running_mean.clone()
    torch.testing.assert_close(layer(x), (x - before) / (layer.running_var + 1e-3).sqrt())
    assert torch.equal(layer.running_mean, before)  # eval mode changes nothing


def test_the_batched_twin_forward_is_the_modules_forward_and_moves_the_same_statistics() -> None:
    torch.manual_seed(0)
    module = RenormTwinCritic(OBS, ACT, (8, 8), lambda d: BatchRenorm(d, 0.1, 2, 3.0, 5.0))
    params, buffers = [p.detach().clone() for p in module.parameters()], [b.clone() for b in module.buffers()]
    spec = next(m for m in module.modules() if isinstance(m, BatchRenorm))
    for seed in range(4):  # two warm-up steps of plain batch norm, then renorm's corrections
        b = batch(seed)
        q, stats = renorm_twin_q(params, buffers, b["obs"], b["action"], spec, True)
        torch.testing.assert_close(q, module(b["obs"], b["action"]).detach())
        assert len(stats) == 3  # the input and both hidden layers
        move_renorm_stats(buffers, stats, spec.momentum)
    for mine, its in zip(buffers, module.buffers()):
        torch.testing.assert_close(mine, its)
    module.eval()
    q, stats = renorm_twin_q(params, buffers, b["obs"], b["action"], spec, False)
    torch.testing.assert_close(q, module(b["obs"], b["action"]).detach())
    assert stats == []


@needs_cxx
@pytest.mark.parametrize("flavour", ["sac", pytest.param("td3", marks=pytest.mark.slow)])
def test_the_compiled_steps_agree_with_the_eager_update(flavour: str, tmp_path: Path) -> None:
    """The compiled steps train the same networks as the eager update: the same metrics, the
    same Q-values and actions, the same running statistics, one graph each. Parameters are
    compared by what they compute: a Linear bias in front of a batch norm gets a gradient of
    rounding noise only, which Adam turns into lr-sized steps of any sign."""
    use_compile_cache(tmp_path / "compile-cache")
    torch._dynamo.reset()
    cfg = config(flavour)
    eager = make_parts("crossq", OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), True, 3)
    fast = make_parts("crossq", OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), True, 3)
    for part in fast:
        part.compile(CompileOptions())
    for i in range(12):  # past the renorm warm-up of 3 critic updates
        m_eager, m_fast = fused_step(*eager, batch(i % 4)), fused_step(*fast, batch(i % 4))
        assert m_fast.keys() == m_eager.keys()
        for k in m_eager:
            assert m_fast[k] == pytest.approx(m_eager[k], rel=1e-2, abs=1e-3), (i, k)
    assert [p.fast.step.compiles for p in fast] == [1, 1]
    assert [p.updates for p in fast] == [p.updates for p in eager] == [4, 12]
    probe = batch(99)
    for e, f in ((eager[1].critic, fast[1].critic), (eager[0].actor, fast[0].actor)):
        e.eval(), f.eval()
    with torch.no_grad():
        q_eager, q_fast = eager[1].critic(probe["obs"], probe["action"]), fast[1].critic(probe["obs"], probe["action"])
        torch.testing.assert_close(q_fast, q_eager, rtol=2e-2, atol=2e-2)
        act = (lambda a, o: a(o, eps=torch.zeros(len(o), ACT))[0]) if flavour == "sac" else (lambda a, o: a(o))
        torch.testing.assert_close(act(fast[0].actor, probe["obs"]), act(eager[0].actor, probe["obs"]),
                                   rtol=2e-2, atol=2e-2)
    for (name, b_eager), b_fast in zip(eager[1].critic.named_buffers(), fast[1].critic.buffers()):
        torch.testing.assert_close(b_fast, b_eager, rtol=2e-2, atol=2e-2, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_critic_regresses_on_its_own_joint_forward_without_target_networks(flavour: str) -> None:
    cfg = config(flavour)
    actor, critic = make_parts("crossq", OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), True, 1)
    assert not hasattr(critic, "target") and actor.target_actor_state() is None
    b = batch(0)
    reference = load_config(None, []).section("crossq")  # the module's defaults hold the paper's optimiser
    assert reference.beta1 == 0.5 and reference.policy_delay == 3
    state = {k: v.clone() for k, v in critic.critic.state_dict().items()}
    rng = critic.generator.get_state()  # the update draws the same noise as the hand computation
    with torch.no_grad():
        next_action, entropy = critic.next_value(b["next_obs"], critic.noise(len(b["next_obs"]), torch.device("cpu")))
        both = critic.critic(torch.cat([b["obs"], b["next_obs"]]), torch.cat([b["action"], next_action]))
        n = b["obs"].shape[0]
        y = b["reward"] + cfg.gamma * (1 - b["done"]) * (torch.minimum(both[0, n:], both[1, n:]) - entropy)
        expected = (both[:, :n] - y).square().mean(1).sum()
    critic.critic.load_state_dict(state)  # back to before that forward (its renorm statistics too)
    critic.generator.set_state(rng)
    metrics = critic.update(b)
    assert metrics["critic_loss"] == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_actor_reads_the_critics_in_eval_mode_and_changes_no_statistic(flavour: str) -> None:
    actor, critic = make_parts("crossq", OBS, ACT, LOW, HIGH, config(flavour), torch.device("cpu"), True, 1)
    for i in range(3):
        critic.update(batch(i))
    buffers = {k: v.clone() for k, v in critic.critic.named_buffers()}
    weights = {k: v.clone() for k, v in critic.critic.named_parameters()}
    actor.update(batch(5))
    assert all(torch.equal(v, buffers[k]) for k, v in critic.critic.named_buffers())
    assert all(torch.equal(v, weights[k]) for k, v in critic.critic.named_parameters())
    assert critic.critic.training  # put back in train mode for its own update


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_split_equals_fused_bit_for_bit(flavour: str) -> None:
    cfg = config(flavour)
    fused = make_parts("crossq", OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), True, 4)
    actor, critic = make_parts("crossq", OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), False, 4)
    for i in range(10):  # past the renorm warm-up, three actor updates
        b = batch(i)
        fused_step(*fused, b)
        critic.update(b)
        actor.load_critic(critic.critic_state())
        if critic.updates % actor.policy_delay == 0:
            actor.update(b)
            critic.load_actor(actor.actor_state(), actor.target_actor_state(), actor.extras())
    for mine, theirs in [(fused[1].critic, critic.critic), (fused[0].actor, actor.actor)]:
        for (name, a), b_ in zip(mine.state_dict().items(), theirs.state_dict().values()):
            assert torch.equal(a, b_), name
    assert fused[0].updates == actor.updates == 3


def test_checkpoints_restore_and_another_flavour_is_refused() -> None:
    cfg = config("sac")
    actor, critic = make_parts("crossq", OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), False, 2)
    for i in range(4):
        critic.update(batch(i))
        actor.update(batch(i))
    saved_actor, saved_critic = actor.save(), critic.save()
    again_actor, again_critic = make_parts("crossq", OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), False, 9)
    again_actor.load(saved_actor)
    again_critic.load(saved_critic)
    b = batch(7)
    assert again_critic.update(b) == critic.update(b)  # the renorm statistics, optimiser and RNG came back
    assert again_actor.update(b) == actor.update(b)
    td3_actor, _ = make_parts("crossq", OBS, ACT, LOW, HIGH, config("td3"), torch.device("cpu"), False, 2)
    with pytest.raises(CheckpointMismatch, match="crossq actor part: the checkpoint holds"):
        td3_actor.load(saved_actor)


def test_dynamic_sparse_critics_mask_the_linear_layers_between_the_renorm_layers() -> None:
    sparse = SparseConfig(network="ds", sparsity=0.5, every=2)
    actor, critic = make_parts("crossq", OBS, ACT, LOW, HIGH, config("sac"), torch.device("cpu"), True, 3,
                               sparse=sparse, total_updates=100)
    assert critic.sparse is not None and len(critic.sparse.masks) == 4  # 2 hidden Linears per critic
    for i in range(6):
        fused_step(actor, critic, batch(i))
    for weight, mask in zip(critic.sparse.weights, critic.sparse.masks):
        assert torch.equal(weight * (1 - mask), torch.zeros_like(weight))
    zeros = sum(int((m == 0).sum()) for m in critic.sparse.masks)
    assert 0.45 < zeros / sum(m.numel() for m in critic.sparse.masks) < 0.55  # spread over the layers (ERK)


@pytest.mark.parametrize(("override", "named"), [("crossq.flavour=ddpg", "crossq.flavour='ddpg'"),
                                                 ("crossq.r_max=0.5", "crossq.r_max=0.5"),
                                                 ("crossq.beta1=1", "crossq.beta1=1"),
                                                 ("crossq.critic_hidden=[]", "crossq.critic_hidden")])
def test_bad_settings_are_refused_by_name(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace("[", r"\[")):
        load_config(None, ["algo=crossq", override])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["fused", pytest.param("split", marks=pytest.mark.slow)])
def test_a_real_run_trains_evaluates_and_resumes(tmp_path: Path, mode: str) -> None:
    short = {"replay": {"min_size": 500}, "sampler": {"warmup_steps": 500},
             "eval": {"every_updates": 400, "episodes": 2, "video_every": 0},
             "learner": {"mode": mode}, "crossq": {"critic_hidden": [64, 64], "hidden": [32, 32]}}
    run = spreeze.train(env="Pendulum-v1", algo="crossq", total_steps=1_500, run_dir=tmp_path / "c", config=short)
    assert run.returncode == 0
    again = spreeze.train(resume=run.run_dir, total_steps=2_500)
    assert again.returncode == 0
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert evals and evals[-1]["env_steps"] >= 2_000 and all(np.isfinite(r["return_mean"]) for r in evals)
    policy = spreeze.load(run.run_dir)
    assert policy.predict(np.zeros(3, np.float32)).shape == (1,)
