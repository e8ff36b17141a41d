"""The tuner's actuators on a running training: real supervisor, real service processes.

Pendulum with a tiny config; tuning itself is off (supervisor.tune=false) so the test
drives the actuators the tuner uses and checks each change reaches the running services:
a sampler started at runtime registers and its steps reach replay, the batch size
reaches the learner, envs per sampler reach the samplers, and a retired sampler leaves
cleanly without a restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from spreeze.common.config import given_keys
from spreeze.services.supervisor.main import Supervisor
from spreeze.services.supervisor.probe import plan, probe
from spreeze.services.supervisor.tuner import Setting
from tests.helpers import config

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = ["supervisor.tune=false", "supervisor.heartbeat_interval=1.0", "supervisor.progress_every=60",
             "eval.every_updates=100000", "replay.min_size=200", "learner.batch_size=32", "learner.own_cores=true"]
CORES = sorted(os.sched_getaffinity(0))


def newest(sup: Supervisor, service: str, key: str) -> Any:
    return sup.progress.latest.get(service, {}).get(key)


async def until(probe_fn: Any, what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe_fn()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} not seen within {timeout:.0f}s")


@pytest.mark.timeout(300)
def test_running_training_takes_tuning_actions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = config(run_dir, *OVERRIDES)
    choices = plan(probe(), cfg, given_keys(None, OVERRIDES), 4 * 11)
    sup = Supervisor(cfg, quiet=True, pinned=given_keys(None, OVERRIDES), plan=choices)
    assert not sup.tunable and sup.plan  # tuning off: the plan is published, the actuators driven here
    seen: dict[str, Any] = {}

    async def body() -> int:
        task = asyncio.ensure_future(sup.run())
        try:
            await drive(sup, seen)
        finally:
            sup.stop("test done")
        return await asyncio.wait_for(task, 120)

    assert asyncio.run(body()) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = [r for r in rows if r["kind"] == "event"]
    assert not [e for e in events if e["event"] in ("restart", "give_up")], events
    planned = {e["key"] for e in events if e["event"] == "plan"}
    assert {"learner.mode", "sampler.num_samplers"} <= planned  # published, each with its reason
    assert "learner.batch_size" not in planned  # set explicitly: pinned
    assert all(e["reason"] for e in events)
    new_sampler = [r for r in rows if r["kind"] == "metrics" and r["service"] == "sampler-1"]
    assert new_sampler and new_sampler[-1]["env_steps"] > 0
    assert seen["retired_rc"] == 0 and "sampler-1" not in json.loads((run_dir / "services.json").read_text())


async def drive(sup: Supervisor, seen: dict[str, Any]) -> None:
    await until(lambda: (newest(sup, "learner", "updates") or 0) > 5, "learner updates")
    inserted = newest(sup, "replay", "inserted")
    await sup.apply(Setting(samplers=2, envs=3, batch=64, bpr=8))
    assert sup.cfg.sampler.num_samplers == 2 and sup.cfg.learner.batch_size == 64
    assert sup.cfg.learner.batches_per_request == 8
    child = sup.children["sampler-1"]
    await until(lambda: child.registered, "sampler-1 registration")
    await until(lambda: (newest(sup, "sampler-1", "env_steps") or 0) > 0, "sampler-1 steps")
    if len(CORES) >= 2:  # learner.own_cores: the learner alone on the last core, the rest (late samplers too)
        assert os.sched_getaffinity(sup.children["learner"].proc.pid) == {CORES[-1]}  # type: ignore[union-attr]
        for sid in ("replay", "sampler-0", "sampler-1"):
            assert os.sched_getaffinity(sup.children[sid].proc.pid) == set(CORES[:-1]), sid  # type: ignore[union-attr]
    await until(lambda: newest(sup, "learner", "batch_size") == 64, "learner batch size 64")
    await until(lambda: newest(sup, "learner", "batches_per_request") == 8, "learner asking 8 batches per request")
    await until(lambda: newest(sup, "sampler-0", "envs") == 3 and newest(sup, "sampler-1", "envs") == 3,
                "3 envs in every sampler")
    steps_1 = newest(sup, "sampler-1", "env_steps")
    await until(lambda: newest(sup, "replay", "inserted") > inserted + steps_1, "sampler-1's steps in replay")
    await sup.apply(Setting(samplers=1, envs=3, batch=64, bpr=8))
    assert "sampler-1" not in sup.children
    await until(lambda: child.proc is not None and child.proc.poll() is not None, "sampler-1 exit", 30)
    seen["retired_rc"] = child.proc.returncode  # type: ignore[union-attr]
    await asyncio.sleep(1.0)  # the watch loop must not restart it
    assert "sampler-1" not in sup.children and not sup.samplers.retiring


def test_a_sampler_joining_late_gets_the_runs_config(tmp_path: Path) -> None:
    """No per-process warm-up share any more: every role's welcome carries the run's config,
    before and after the warm-up; replay grants random steps in its acks (SPEC §6)."""
    from spreeze.proto.messages import Metrics
    from spreeze.services.supervisor.progress import Progress

    sup = Supervisor(config(tmp_path, "sampler.warmup_steps=1000", "sampler.num_samplers=2"), quiet=True)
    sup.progress = Progress(tmp_path / "metrics.jsonl", 10_000, 0.0)
    for inserted in (400, 1000):
        sup.progress.take(Metrics("replay", {"inserted": inserted}))
        for role in ("sampler", "replay"):
            assert sup.welcome_config(role)["sampler"]["warmup_steps"] == 1000
    sup.progress.close()
    shutil.rmtree(sup.sockets.sock_dir)  # made by the constructor; run() would remove it


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_spreeze_train_tunes_and_publishes_each_decision(tmp_path: Path) -> None:
    """`spreeze train supervisor.tune=true`: the whole loop in a real run, short windows."""
    import subprocess
    import sys

    run = tmp_path / "tuned"
    cmd = [sys.executable, "-m", "spreeze.cli", "train", "--run-dir", str(run), "--env", "Pendulum-v1",
           "--time-limit", "45", "replay.min_size=500", "sampler.warmup_steps=500", "eval.every_updates=100000",
           "supervisor.tune=true", "supervisor.tune_window=3", "supervisor.tune_settle=1",
           "supervisor.progress_every=60", "learner.threads=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    events = [r for r in rows if r["kind"] == "event"]
    plans = {e["key"]: e for e in events if e["event"] == "plan"}
    assert "learner.threads" not in plans and "sampler.num_samplers" in plans  # set on the command line: kept
    tunes = [e for e in events if e["event"] == "tune"]
    assert tunes and tunes[0]["action"] == "try", events  # within 45 s the tuner tried something
    for e in tunes:
        assert e["reason"] and e["frame_rate"] > 0 and 0.0 <= e["insert_stall"] <= 1.0
    assert not [e for e in events if e["event"] in ("restart", "give_up")]
    assert "event tune:" in proc.stdout and "event plan:" in proc.stdout


@pytest.mark.timeout(300)
def test_a_hub_sets_envs_and_batches_per_request_in_services_it_did_not_start(tmp_path: Path) -> None:
    """Compose: the hub starts nothing; replay, learner and sampler register on their own (here
    real processes started beside it, as compose starts containers) and a tuning setting
    reaches them by `set` commands."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    overrides = [*OVERRIDES, "supervisor.mode=hub", "learner.mode=fused", "learner.compile=false",
                 "learner.own_cores=false"]
    sup = Supervisor(config(run_dir, *overrides), quiet=True, pinned=given_keys(None, overrides))
    assert not sup.children
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPREEZE_CONTROL": sup.endpoints["control"]}
    procs: list[subprocess.Popen[bytes]] = []

    async def body() -> int:
        task = asyncio.ensure_future(sup.run())
        try:
            for role, sid in (("replay", "replay"), ("learner", "learner"), ("sampler", "sampler-0")):
                procs.append(subprocess.Popen([sys.executable, "-m", f"spreeze.services.{role}"],
                                              env={**env, "SPREEZE_SERVICE_ID": sid}, cwd=run_dir))
            await until(lambda: (newest(sup, "learner", "updates") or 0) > 5, "learner updates")
            await sup.apply(Setting(samplers=1, envs=3, batch=32, bpr=8))
            await until(lambda: newest(sup, "sampler-0", "envs") == 3, "3 envs in the sampler")
            await until(lambda: newest(sup, "learner", "batches_per_request") == 8, "8 batches per request")
        finally:
            sup.stop("test done")
        return await asyncio.wait_for(task, 120)

    try:
        assert asyncio.run(body()) == 0
        assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]  # told to stop by the hub, clean exits
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
