"""The algorithm registry: an algorithm is one module, found by name or module path in every
process, importable without torch, checkpointed by name.

tests/ext_ddpg.py is the proof: DDPG written as a user would write it, outside the package,
run through the real services split and fused, checkpointed and resumed, with no other file
of the project knowing about it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spreeze.common.algorithms import ALGOS, algorithm, registered
from spreeze.common.algorithms.base import CheckpointMismatch, fused_step
from spreeze.common.algorithms.build import make_parts
from spreeze.common.config import load_config
from spreeze.common.errors import ConfigError
from spreeze.common.networks import GaussianActor

ROOT = Path(__file__).resolve().parents[1]
DDPG = "tests.ext_ddpg"
OBS, ACT = 5, 2
LOW, HIGH = -np.ones(ACT, dtype=np.float32), np.ones(ACT, dtype=np.float32)


def batch(seed: int, n: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(n, OBS, generator=g), "action": torch.rand(n, ACT, generator=g) * 2 - 1,
            "reward": torch.randn(n, generator=g), "next_obs": torch.randn(n, OBS, generator=g),
            "done": (torch.rand(n, generator=g) < 0.1).float()}


@pytest.mark.parametrize("spec", [*ALGOS, DDPG])
def test_an_algorithm_module_and_its_config_import_no_torch(spec: str) -> None:
    """Every service reads the run config, which holds the algorithm's section: reading it,
    and importing the algorithm's module, loads no torch (the module's `lazy` imports)."""
    code = ("import sys\nfrom spreeze.common.config import load_config\n"
            f"cfg = load_config(None, ['algo={spec}'])\n"
            "print(type(cfg.algo_config).__name__, cfg.algorithm.name, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    name = algorithm(spec).name
    assert out.stdout.split() == [algorithm(spec).config.__name__, name, "False"], out.stdout + out.stderr


def test_a_user_algorithm_gets_its_section_and_bad_names_are_refused_by_name() -> None:
    cfg = load_config(None, [f"algo={DDPG}", "ddpg.hidden=[8]", "td3.hidden=[16]"])
    assert cfg.algo_config.hidden == (8,) and cfg.section("td3").hidden == (16,)  # built-ins keep theirs
    assert "ddpg" in registered()
    with pytest.raises(ConfigError, match=r"ddpg.tau=2.0 must be in \(0, 1\]"):
        load_config(None, [f"algo={DDPG}", "ddpg.tau=2"])
    with pytest.raises(ConfigError, match="unknown config key ddpg.width"):
        load_config(None, [f"algo={DDPG}", "ddpg.width=3"])
    with pytest.raises(ConfigError, match="algo='dqn' must be one of td3, sac, crossq or a module path"):
        load_config(None, ["algo=dqn"])
    with pytest.raises(ConfigError, match="algo='tests.no_such_module': module .* cannot be imported"):
        load_config(None, ["algo=tests.no_such_module"])
    with pytest.raises(ConfigError, match="algo='tests.helpers': module 'tests.helpers' defines no ALGORITHM"):
        load_config(None, ["algo=tests.helpers"])


def test_ddpg_split_with_a_weight_exchange_every_update_is_fused_bit_for_bit() -> None:
    cfg = load_config(None, [f"algo={DDPG}", "ddpg.hidden=[16,16]"]).algo_config
    fa, fc = make_parts(DDPG, OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), True, 3)
    sa, sc = make_parts(DDPG, OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), False, 3)
    for i in range(6):
        b = batch(i)
        fused_step(fa, fc, b)
        sc.update(b)
        sa.load_critic(sc.critic_state())
        sa.update(b)
        sc.load_actor(sa.actor_state(), sa.target_actor_state(), sa.extras())
    for f, s in ((fa.actor, sa.actor), (fc.critic, sc.critic), (fa.target.network, sa.target.network),
                 (fc.target.network, sc.target.network)):
        for (name, x), y in zip(f.state_dict().items(), s.state_dict().values()):
            assert torch.equal(x, y), name
    assert fa.updates == sa.updates == 6


def test_a_checkpoint_of_another_algorithm_or_shape_is_refused_naming_what_differs() -> None:
    td3 = load_config(None, ["td3.hidden=[16]", "sac.hidden=[16]"])
    cpu = torch.device("cpu")
    _, critic = make_parts("td3", OBS, ACT, LOW, HIGH, td3.section("td3"), cpu, True)
    _, sac_critic = make_parts("sac", OBS, ACT, LOW, HIGH, td3.section("sac"), cpu, True)
    before = [t.clone() for t in critic.critic.parameters()]
    with pytest.raises(CheckpointMismatch, match="td3 critic part: the checkpoint is of algorithm 'sac'"):
        critic.load(sac_critic.save())
    wide = load_config(None, ["td3.hidden=[32]"]).section("td3")
    _, other = make_parts("td3", OBS, ACT, LOW, HIGH, wide, cpu, True)
    with pytest.raises(CheckpointMismatch, match=r"critic.qf1.0.weight has shape \(32, 7\), this run's \(16, 7\)"):
        critic.load(other.save())
    _, split = make_parts("td3", OBS, ACT, LOW, HIGH, td3.section("td3"), cpu, False)
    with pytest.raises(CheckpointMismatch, match=r"not expected \['actor_target'\]"):
        critic.load(split.save())  # a split critic's checkpoint holds its target actor copy
    assert all(torch.equal(a, b) for a, b in zip(before, critic.critic.parameters()))  # nothing was loaded
    critic.load(critic.save())  # its own loads


def test_an_algorithm_without_target_networks_keeps_none() -> None:
    """Polyak averaging belongs to the algorithm: a part whose `target` is None makes no copy
    and the shared critic step skips the update."""
    from spreeze.common.algorithms import base
    cfg = load_config(None, ["td3.hidden=[8]"]).section("td3")
    _, critic = make_parts("td3", OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), True)
    critic.target = None  # type: ignore[attr-defined]
    before = [p.clone() for p in critic.critic_target.parameters()]  # type: ignore[attr-defined]
    base.critic_step(critic, batch(0), torch.zeros(16), True, False)  # type: ignore[arg-type]
    assert all(torch.equal(a, b) for a, b in zip(before, critic.critic_target.parameters()))  # type: ignore[attr-defined]


def train(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "spreeze.cli", "train", "--run-dir", str(run_dir), "--env", "Pendulum-v1",
           f"algo={DDPG}", "ddpg.hidden=[32,32]", "replay.min_size=300", "sampler.warmup_steps=300",
           "eval.every_updates=400", "eval.episodes=1", "eval.video_every=0", "learner.batch_size=64",
           "supervisor.tune=false", "visualizer.enabled=false", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(600)
def test_ddpg_trains_split_and_fused_through_the_services_and_resumes(tmp_path: Path) -> None:
    split = train(tmp_path / "split", "--total-steps", "1200", "learner.mode=split")
    assert split.returncode == 0, split.stdout + split.stderr
    for role in ("critic_learner", "actor_learner"):  # their checkpoints (a short run may end before metrics)
        saved = torch.load(tmp_path / "split" / "checkpoints" / f"{role}.pt", weights_only=False)
        assert saved["updates"] > 0, role
    run = tmp_path / "fused"
    fused = train(run, "--total-steps", "1200", "learner.mode=fused")
    assert fused.returncode == 0, fused.stdout + fused.stderr
    stopped = torch.load(run / "checkpoints" / "learner.pt", weights_only=False)
    assert stopped["updates"] > 0 and stopped["actor"]["algo"] == "ddpg"
    assert set(stopped["critic"]["states"]) == {"critic", "critic_target", "opt"}
    resumed = subprocess.run([sys.executable, "-m", "spreeze.cli", "train", "--resume", str(run),
                              "--total-steps", "1800"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "restoring" in (run / "logs" / "learner.log").read_text()
    again = torch.load(run / "checkpoints" / "learner.pt", weights_only=False)
    assert again["updates"] > stopped["updates"]


def test_a_learner_refuses_a_checkpoint_of_another_algorithm_naming_it(tmp_path: Path) -> None:
    """A checkpoint without the config it was made with (copied in by hand) still stops the
    learner with one error naming the algorithms, not a KeyError deep in a state-dict load."""
    from spreeze.common.checkpoint_files import save_checkpoint
    from spreeze.common.learner_io import checkpoint_dir
    from spreeze.services.learner.main import Learner
    from tests.helpers import Harness, config, parts, run

    sac_actor, sac_critic = parts(config(tmp_path, "algo=sac"))
    path = checkpoint_dir(str(tmp_path)) / "learner.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint({"actor": sac_actor.save(), "critic": sac_critic.save(), "updates": 3,
                 "torch_rng": torch.get_rng_state()}, path)

    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            learner = h.build(Learner)
            with pytest.raises(CheckpointMismatch, match="td3 actor part: the checkpoint is of algorithm 'sac'"):
                await learner.serve()
    run(body())


@pytest.mark.parametrize("spec", [*ALGOS, DDPG])
def test_trained_networks_train_and_read_only_copies_are_in_eval_mode(spec: str) -> None:
    """A normalisation layer behaves as the algorithm means: its own networks in train mode,
    the targets and the peer's copies (only read) in eval mode."""
    cfg = load_config(None, [f"algo={spec}"]).algo_config
    actor, critic = make_parts(spec, OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), False)
    assert actor.actor.training and critic.critic.training  # type: ignore[attr-defined]
    assert not actor.critic.training  # type: ignore[attr-defined]
    target = getattr(critic, "target", None)  # CrossQ keeps none
    assert target is None or not target.network.training


@pytest.mark.parametrize("spec", [*ALGOS, DDPG])
def test_every_algorithms_actor_is_acted_by_its_description_as_the_conformance_kit_reads_it(spec: str) -> None:
    """What a sampler receives of any algorithm, a user's included: the acting-policy
    description of its actor. The conformance kit's own reading of it (proto/conformance,
    written from SPEC §4.4) and the samplers' numpy actor both give the torch actor's actions."""
    from spreeze.common.numpy_policy import NumpyActor
    from spreeze.common.policy_export import describe_actor
    from spreeze.proto.conformance.policy import deterministic

    hidden = f"{algorithm(spec).name}.hidden=[16,16]"
    cfg = load_config(None, [f"algo={spec}", hidden]).algo_config
    actor, _ = make_parts(spec, OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), True, 5)
    policy = describe_actor(actor.actor)
    state = actor.actor_state()
    obs = np.random.default_rng(1).standard_normal((7, OBS)).astype(np.float32)
    kit = deterministic(policy, state, obs, LOW, HIGH)
    numpy = NumpyActor(policy, state, LOW, HIGH).mean_action(obs)
    np.testing.assert_allclose(numpy, kit, rtol=1e-4, atol=1e-5)
    with torch.no_grad():  # a deterministic actor's forward is its action; a Gaussian one's with deterministic=True
        out = actor.actor(torch.from_numpy(obs), deterministic=True) if isinstance(
            actor.actor, GaussianActor) else actor.actor(torch.from_numpy(obs))
    mine = out[0] if isinstance(out, tuple) else out
    np.testing.assert_allclose(numpy, mine.numpy(), rtol=1e-4, atol=1e-5)
