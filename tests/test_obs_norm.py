"""Observation normalisation (learner.obs_norm): replay's statistics of every stored observation,
the learner's batches normalised with them, and the actor carrying them to every peer, to
checkpoints, to spreeze.load and to exported files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import spreeze
from spreeze.common.learner_io import ObsNormalizer
from spreeze.common.replay_buffer import ReplayBuffer
from spreeze.common.running_stats import OBS_NORM_CLIP, OBS_NORM_EPS, RunningStats
from spreeze.proto.messages import SampledBatch, TransitionLayout
from spreeze.services.replay.snapshot import load_latest


def test_running_stats_merged_in_chunks_equal_the_whole() -> None:
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((1000, 5)) * [1, 10, 0.1, 100, 3] + [0, 5, -2, 1e3, 7]).astype(np.float32)
    stats = RunningStats(5)
    for part in np.split(rows, [0, 1, 7, 300, 301, 999]):  # chunks of 0, 1 and many rows
        stats.add(part)
    assert stats.count == 1000
    np.testing.assert_allclose(stats.mean, rows.astype(np.float64).mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.var, rows.astype(np.float64).var(0), rtol=1e-9)
    again = RunningStats(5)
    again.load(json.loads(json.dumps(stats.state())))  # as a replay snapshot keeps them
    assert again.count == 1000 and np.array_equal(again.mean, stats.mean) and np.array_equal(again.var, stats.var)
    with pytest.raises(ValueError, match="statistics of 5 columns, this run's observations have 3"):
        RunningStats(3).load(stats.state())
    assert np.array_equal(RunningStats(2).var, np.ones(2))  # nothing seen: normalising changes nothing


def test_the_normalizer_takes_only_newer_statistics_and_clips() -> None:
    norm = ObsNormalizer(2, torch.device("cpu"))
    obs = torch.tensor([[1.0, 2.0], [3.0, 1e9]])
    assert torch.equal(norm(obs)[0], obs[0])  # mean 0, variance 1 until replay sends statistics
    layout = TransitionLayout(2, 1)

    def reply(count: int, mean: list[float], var: list[float]) -> SampledBatch:
        return SampledBatch(1, np.zeros((1, layout.width), np.float32), 2, 1, obs_count=count,
                            obs_stats={"mean": np.array(mean, np.float32), "var": np.array(var, np.float32)})
    norm.take(reply(10, [1.0, 2.0], [4.0, 0.25]))
    norm.take(reply(5, [0.0, 0.0], [1.0, 1.0]))  # an older reply arriving late: ignored
    got = norm(obs)
    want = torch.tensor([[0.0, 0.0], [2.0 / float(np.sqrt(4.0 + OBS_NORM_EPS)), OBS_NORM_CLIP]])
    assert torch.allclose(got, want) and norm.count == 10
    restored = ObsNormalizer(2, torch.device("cpu"))
    restored.load(norm.state())
    assert torch.equal(restored(obs), got)


SHORT = {"replay": {"min_size": 500}, "sampler": {"warmup_steps": 500},
         "learner": {"compile": False, "obs_norm": True, "mode": "split"},
         "eval": {"every_updates": 400, "episodes": 2, "video_every": 0}}


@pytest.mark.timeout(240)
def test_a_run_normalises_and_its_actor_carries_the_statistics(tmp_path: Path) -> None:
    """Split learners (the actor-learner publishes, the critic-learner normalises its own
    batches): the best checkpoint's policy begins with obs_norm over the statistics it carries;
    spreeze.load and the exported file act with them; replay's statistics are exactly those of
    every row it stored; the learners' checkpoints keep theirs."""
    run = spreeze.train(env="Pendulum-v1", total_steps=2_500, run_dir=tmp_path / "n", config=SHORT,
                        overrides=["td3.hidden=[32, 32]"])
    assert run.returncode == 0
    best = torch.load(run.run_dir / "checkpoints" / "best.pt", weights_only=False)
    first = best["policy"]["ops"][0]
    assert first == {"op": "obs_norm", "mean": "obs_norm.mean", "var": "obs_norm.var", "eps": OBS_NORM_EPS,
                     "clip": OBS_NORM_CLIP}
    mean, var = best["actor"]["obs_norm.mean"].numpy(), best["actor"]["obs_norm.var"].numpy()
    # cos(theta) lies in [-1, 1] (how much it varies depends on how well the policy balances; the
    # initial variance is 1) and the angular velocity varies more than 1
    assert mean.shape == (3,) and 0.0 < var[0] < 1.0 and var[2] > 1.0

    buffer = ReplayBuffer(run.config.replay.capacity, 3, 1, seed=0)
    meta = load_latest(run.run_dir / "replay", buffer, np.zeros(run.config.replay.capacity, np.uint16))
    assert meta is not None and buffer.size == buffer.inserted >= 2_500  # nothing evicted: every row is here
    obs = np.concatenate(buffer.row_views(0, buffer.inserted))[:, :3].astype(np.float64)
    assert meta["obs_stats"]["count"] == len(obs)
    np.testing.assert_allclose(meta["obs_stats"]["mean"], obs.mean(0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.array(meta["obs_stats"]["m2"]) / len(obs), obs.var(0), rtol=1e-9)

    for role in ("actor_learner", "critic_learner"):
        saved = torch.load(run.run_dir / "checkpoints" / f"{role}.pt", weights_only=False)
        assert 500 <= saved["obs_norm"]["count"] <= len(obs), role

    policy = spreeze.load(run.run_dir)
    batch = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -3.0]], np.float32)
    exported = spreeze.export(run.run_dir, tmp_path / "p.pt")
    module = torch.jit.load(str(exported.path))
    np.testing.assert_allclose(module(torch.from_numpy(batch)).detach().numpy(), policy.predict(batch),
                               rtol=1e-5, atol=1e-5)
