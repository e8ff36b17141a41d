"""The Python API end to end: spreeze.train runs real services, spreeze.load acts without them."""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import spreeze
from spreeze.common.errors import ConfigError
from spreeze.common.evaluation import evaluate_checkpoint

SHORT = {"replay": {"min_size": 500}, "sampler": {"warmup_steps": 500}, "learner": {"compile": False},
         "eval": {"every_updates": 500, "episodes": 2, "video_every": 0}}


@pytest.mark.timeout(240)
def test_train_load_predict_matches_spreeze_eval(tmp_path: Path) -> None:
    run = spreeze.train(env="Pendulum-v1", algo="td3", total_steps=2_500, run_dir=tmp_path / "p", config=SHORT,
                        overrides=["td3.hidden=[32, 32]"], seed=3)
    assert run.returncode == 0 and not run.running
    assert run.config.section("td3").hidden == (32, 32) and run.config.seed == 3 and run.config.replay.min_size == 500
    assert "budget of 2,500 env steps reached" in (run.run_dir / "console.log").read_text()
    policy = spreeze.load(run.run_dir)
    assert (policy.obs_dim, policy.act_dim) == (3, 1)
    one = policy.predict(np.array([1.0, 0.0, 0.5]))
    batch = policy.predict(np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -3.0]], np.float32))
    assert one.shape == (1,) and batch.shape == (2, 1) and np.allclose(batch[0], one, rtol=1e-6, atol=1e-6)
    assert np.all(np.abs(batch) <= 2.0) and np.array_equal(policy.predict(batch[:0].reshape(0, 3)), np.zeros((0, 1)))
    # the user's own gymnasium loop gives exactly the returns of `spreeze eval`
    env = gym.make("Pendulum-v1")
    env.reset(seed=12_345)  # as `spreeze eval` seeds its env (then resets before each episode)
    mine = []
    for _ in range(2):
        obs, _ = env.reset()
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.predict(obs))
            total += float(reward)
            done = terminated or truncated
        mine.append(total)
    assert mine == pytest.approx(evaluate_checkpoint(run.run_dir, 2), rel=1e-5)
    with pytest.raises(ValueError, match=r"obs of shape \(4,\): expected \[3\]"):
        policy.predict(np.zeros(4))
    assert run.policy("latest").act_dim == 1
    # the same policy leaves the library: `spreeze export` (the CLI over spreeze.export), plain torch
    import subprocess
    import sys

    import torch
    done = subprocess.run([sys.executable, "-m", "spreeze.cli", "export", str(run.run_dir), "--out",
                           str(tmp_path / "p.pt")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "written as torchscript" in done.stdout, done.stdout + done.stderr
    obs_batch = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -3.0]], np.float32)
    exported = torch.jit.load(str(tmp_path / "p.pt"))(torch.from_numpy(obs_batch))
    np.testing.assert_allclose(exported.detach().numpy(), policy.predict(obs_batch), rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(240)
def test_a_run_started_without_waiting_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    run = spreeze.train(env="Pendulum-v1", total_steps=1_000_000, run_dir=tmp_path / "r", config=SHORT, wait=False)
    assert run.running and run.returncode is None
    deadline = time.monotonic() + 120
    while not (run.run_dir / "checkpoints" / "best.pt").is_file():
        assert run.running and time.monotonic() < deadline, "no evaluation within 120 s"
        time.sleep(0.5)
    assert run.stop() == 0  # SIGTERM: services stop, checkpoints written
    with pytest.raises(ConfigError, match="already holds a run"):  # refused here, before anything starts
        spreeze.train(env="Pendulum-v1", run_dir=run.run_dir)
    with pytest.raises(ConfigError, match="algo cannot change when resuming"):
        spreeze.train(resume=run.run_dir, algo="sac")
    again = spreeze.train(resume=run.run_dir, total_steps=run.config.total_steps, wait=False)
    with pytest.raises(TimeoutError, match="still running after 2 s"):
        again.wait(timeout=2)
    assert again.stop() == 0 and spreeze.load(run.run_dir, "latest").act_dim == 1


def test_bad_input_is_refused_by_name_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        spreeze.train(env="Pendulum-v1", run_dir=tmp_path / "a", overrides=["learner.batch_size=-1"])
    with pytest.raises(ConfigError, match="no_such_section"):
        spreeze.train(env="Pendulum-v1", run_dir=tmp_path / "b", config={"no_such_section": {"x": 1}})
    with pytest.raises(ConfigError, match="does not exist"):
        spreeze.train(config=tmp_path / "missing.yaml")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with pytest.raises(ConfigError, match="no best checkpoint"):
        (tmp_path / "empty").mkdir()
        spreeze.load(tmp_path / "empty")
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        spreeze.trian  # noqa: B018 (a typo is an AttributeError naming it)


@pytest.mark.timeout(240)
def test_a_run_stops_at_a_target_return(tmp_path: Path) -> None:
    """stop_at_return (--stop-at-return): the first evaluation at or above it ends the run, exit 0."""
    run = spreeze.train(env="Pendulum-v1", total_steps=1_000_000, run_dir=tmp_path / "t", config=SHORT,
                        stop_at_return=-1e9)
    said = (run.run_dir / "console.log").read_text()
    assert run.returncode == 0 and "reached stop_at_return=-1,000,000,000.0" in said, said[-2000:]
    evals = [line for line in (run.run_dir / "metrics.jsonl").read_text().splitlines() if '"kind": "eval"' in line]
    assert evals and len(evals) <= 3  # the first one reached it (and the final one at the stop)
    for bad in ("nan", "[1]", "true"):
        with pytest.raises(ConfigError, match="stop_at_return"):
            spreeze.train(env="Pendulum-v1", run_dir=tmp_path / "x", overrides=[f"stop_at_return={bad}"])


@pytest.mark.timeout(240)
def test_a_users_registered_env_with_kwargs_trains_in_every_process(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """env_imports registers a user's env in every process, env_kwargs reach gymnasium.make and
    env_wrappers wrap it in samplers and evaluator alike (`horizon` 7, cut at 5 steps by the
    user's Truncate wrapper, in both)."""
    import json

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))  # the user's package, importable
    run = spreeze.train(env="SpreezeTests/Drift-v0", total_steps=1_200, run_dir=tmp_path / "d", config=SHORT,
                        overrides=["env_imports=[tests.custom_envs]", 'env_kwargs={"horizon": 7, "target": 0.25}',
                                   'env_wrappers=[{"tests.custom_envs:Truncate": {"steps": 5}}]'])
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert evals and all(r["length_mean"] == 5 for r in evals)
    sampled = [r["episode_length"] for r in rows if r["kind"] == "metrics" and "episode_length" in r]
    assert sampled and set(sampled) == {5.0}
    policy = spreeze.load(run.run_dir)
    assert policy.predict([0.0, 0.25]).shape == (1,)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_dm_control_task_trains_through_shimmy(tmp_path: Path) -> None:
    """The dm-control extra: the namespace's package is imported in every process without
    env_imports, the Dict observation is flattened, episodes run to dm_control's 1000 steps."""
    pytest.importorskip("shimmy")
    pytest.importorskip("dm_control")
    import json

    run = spreeze.train(env="dm_control/cartpole-swingup-v0", total_steps=1_200, run_dir=tmp_path / "c",
                        config={**SHORT, "eval": {"every_updates": 500, "episodes": 1, "video_every": 0}})
    assert run.returncode == 0
    evals = [r for r in map(json.loads, (run.run_dir / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "eval"]
    assert evals and all(r["length_mean"] == 1000 for r in evals)
    policy = spreeze.load(run.run_dir)
    assert (policy.obs_dim, policy.act_dim) == (5, 1)  # position (3) and velocity (2), flattened


def test_bad_env_kwargs_and_imports_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="env_imports: module 'no_such_pkg.envs' cannot be imported"):
        spreeze.train(env="Pendulum-v1", run_dir=tmp_path / "a", overrides=["env_imports=[no_such_pkg.envs]"])
    with pytest.raises(ConfigError, match=r"env='Pendulum-v1' with env_kwargs \{gravity=9.81\} cannot be made"):
        spreeze.train(env="Pendulum-v1", run_dir=tmp_path / "b", config={"env_kwargs": {"gravity": 9.81}})
    with pytest.raises(ConfigError, match="env_kwargs=.* must be a mapping"):
        spreeze.train(env="Pendulum-v1", run_dir=tmp_path / "c", overrides=["env_kwargs=[1, 2]"])
    with pytest.raises(ConfigError, match="cannot be made"):  # gymnasium's module:EnvId with a missing module
        spreeze.train(env="no_such_pkg:Thing-v0", run_dir=tmp_path / "d")


def test_gymnasiums_module_path_id_makes_a_users_env() -> None:
    """env=module:EnvId: gymnasium imports the module (which registers the env) and makes it."""
    from spreeze.common.env_source import EnvSource
    from spreeze.common.envs import make_env

    env = make_env(EnvSource("tests.custom_envs:SpreezeTests/Drift-v0", (("horizon", 3),)))
    env.reset(seed=0)
    assert [env.step(np.zeros(1, np.float32))[3] for _ in range(3)] == [False, False, True]
