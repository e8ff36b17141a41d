"""services/supervisor: restart policy, roster, progress numbers, and short real runs
(a test-only service that crashes at once, one that idles, and no service at all)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import zmq.asyncio

from spreeze.proto.codec import Encoder
from spreeze.common.config import Config
from spreeze.common.transport import Channel
from spreeze.proto.messages import EvalResult, Event, Heartbeat, Metrics
from spreeze.services.supervisor.main import Supervisor
from spreeze.services.supervisor.processes import (
    OBSERVER_NICE, Child, RestartPolicy, ServiceSpec, roster, service, spawn)
from spreeze.services.supervisor.progress import Progress
from spreeze.services.supervisor.samplers import SamplerPool
from tests.helpers import config, run

pytestmark = pytest.mark.timeout(10)
ROOT = Path(__file__).resolve().parents[1]


def records(path: Path, kind: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["kind"] == kind]


# ------------------------------------------------------------------ restart policy

def test_restart_backoff_doubles_then_gives_up() -> None:
    policy = RestartPolicy(max_restarts=3, window=10.0, backoff=0.5)
    child = Child(ServiceSpec("sampler-0", "sampler", "spreeze.services.sampler"))
    delays = []
    for now in (0.0, 1.0, 2.0):
        delays.append(policy.next_delay(child, now))
        child.restarts.append(now)  # what Supervisor.crashed records
    assert delays == [0.5, 1.0, 2.0]
    assert policy.next_delay(child, 3.0) is None


def test_restarts_leave_the_window() -> None:
    policy = RestartPolicy(max_restarts=3, window=10.0, backoff=0.5)
    child = Child(ServiceSpec("sampler-0", "sampler", "spreeze.services.sampler"))
    child.restarts.extend([0.0, 1.0, 2.0])
    assert policy.next_delay(child, 10.5) == 2.0  # the restart at 0 expired; two remain
    assert list(child.restarts) == [1.0, 2.0]
    assert policy.next_delay(child, 12.5) == 0.5 and not child.restarts
    assert RestartPolicy(0, 10.0, 1.0).next_delay(Child(child.spec), 0.0) is None


# ------------------------------------------------------------------ roster

def test_roster_fused_and_split(tmp_path: Path) -> None:
    fused = roster(config(tmp_path, "sampler.num_samplers=2", "learner.threads=3"))
    assert [(s.service_id, s.role, s.threads, s.nice) for s in fused] == [
        ("replay", "replay", 1, 0), ("learner", "learner", 3, 0), ("sampler-0", "sampler", 1, 0),
        ("sampler-1", "sampler", 1, 0), ("evaluator", "evaluator", 1, OBSERVER_NICE),
        ("visualizer", "visualizer", 1, OBSERVER_NICE)]
    split = roster(config(tmp_path, "learner.mode=split", "visualizer.enabled=false"))
    assert [s.service_id for s in split] == ["replay", "critic_learner", "actor_learner", "sampler-0",
                                             "evaluator"]
    for spec in fused + split:  # every module is runnable with python -m
        assert importlib.util.find_spec(f"{spec.module}.__main__") is not None, spec


def test_spawn_sets_the_niceness_of_its_spec(tmp_path: Path) -> None:
    spec = ServiceSpec("idle-0", "idle", "tests.idle_service", nice=OBSERVER_NICE)
    proc = spawn(spec, f"ipc://{tmp_path}/nobody", tmp_path / "logs", {})
    try:
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == os.getpriority(os.PRIO_PROCESS, 0) + OBSERVER_NICE
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ progress

def test_progress_aggregates(tmp_path: Path) -> None:
    p = Progress(tmp_path / "metrics.jsonl", total_steps=1000, time_limit=0.0)
    assert (p.env_steps, p.updates, p.remaining(0.0)) == (0, 0, None)
    p.take(Metrics("replay", {"inserted": 400}))
    p.take(Metrics("learner", {"updates": 200, "update_frame_rate": 6400.0}))
    p.take(Metrics("sampler-0", {"env_steps": 390}))
    s = p.summary()
    assert (s["env_steps"], s["updates"], s["update_to_data"]) == (400, 200, 0.5)
    assert s["update_frame_rate"] == 6400.0 and s["sampling_hz"] > 0
    assert s["remaining"] == pytest.approx(600 / s["sampling_hz"])
    p.take(Metrics("replay", {"inserted": 600}))
    p.take(Metrics("learner", {"updates": 400, "update_frame_rate": 6400.0}))
    assert p.summary()["update_to_data"] == 1.0  # rates over the window since the last call
    line = p.line()
    assert "steps 600/1,000" in line and "updates 400" in line and "eval -" in line
    p.close()


def test_progress_split_learners_and_time_limit(tmp_path: Path) -> None:
    p = Progress(tmp_path / "metrics.jsonl", total_steps=10**6, time_limit=100.0)
    p.take(Metrics("critic_learner", {"updates": 50, "update_frame_rate": 100.0}))
    p.take(Metrics("actor_learner", {"updates": 25, "update_frame_rate": 50.0}))
    assert p.updates == 50  # the critic's count is the run's update count
    assert p.sum_of("update_frame_rate", ("learner", "critic_learner", "actor_learner")) == 150.0
    remaining = p.remaining(0.0)
    assert remaining is not None and 99.0 < remaining <= 100.0
    assert p.remaining(1e9) == pytest.approx(10**6 / 1e9)  # the sooner of the two budgets
    p.close()


def test_progress_writes_eval_event_and_progress_records(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    p = Progress(path, total_steps=1000, time_limit=0.0)
    p.take(EvalResult(actor_version=3, env_steps=500, updates=250, return_mean=-300.5, return_std=2.0,
                      length_mean=200.0, episodes=2, returns=[-298.5, -302.5]))
    p.take(Event("restart", "sampler-0 exited with code 1", {"service": "sampler-0", "delay": 1.0}))
    assert "eval -300 @0k" in p.line()
    p.close()
    (ev,) = records(path, "eval")
    assert {"kind", "env_steps", "updates", "wall_time", "return_mean"} <= set(ev)
    assert (ev["env_steps"], ev["updates"], ev["return_mean"], ev["actor_version"]) == (500, 250, -300.5, 3)
    (event,) = records(path, "event")
    assert event["event"] == "restart" and event["service"] == "sampler-0" and "code 1" in event["reason"]
    assert len(records(path, "progress")) == 1


# ------------------------------------------------------------------ runs

def run_supervisor(cfg: Config, specs: list[ServiceSpec], during: Any = None) -> tuple[int, Supervisor]:
    sup = Supervisor(cfg, quiet=True, specs=specs)

    async def body() -> int:
        task = asyncio.ensure_future(sup.run())
        if during is not None:
            await during(sup, task)
        return await asyncio.wait_for(task, 8)
    return asyncio.run(body()), sup


def run_config(tmp_path: Path, *overrides: str) -> Config:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return config(run_dir, "supervisor.progress_every=60", *overrides)


def test_a_service_that_keeps_crashing_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    cfg = run_config(tmp_path, "supervisor.max_restarts=1", "supervisor.backoff=0.05")
    rc, sup = run_supervisor(cfg, [ServiceSpec("crasher", "sampler", "tests.crashing_service")])
    run_dir = Path(cfg.run_dir)
    log = run_dir / "logs" / "crasher.log"
    assert rc == 1
    assert sup.failure is not None and "crasher keeps failing (exited with code 3)" in sup.failure
    assert str(log) in sup.failure
    assert log.read_text().count("exiting with code 3 on purpose") == 2  # first run + one restart
    events = records(run_dir / "metrics.jsonl", "event")
    assert [(e["event"], e["service"]) for e in events] == [("restart", "crasher"), ("give_up", "crasher")]
    give_up = events[1]
    assert "failed 2 times" in give_up["reason"] and "code 3" in give_up["reason"]  # first run + 1 restart
    assert give_up["log"] == str(log) and str(log) in give_up["reason"]
    assert json.loads((run_dir / "services.json").read_text())["crasher"]["restarts"] == 1
    assert not Path(sup.sockets.sock_dir).exists()


@pytest.mark.timeout(60)
def test_a_crash_looping_learner_says_why_and_a_run_without_updates_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Real replay and sampler; the learner crashes at once, every time: each restart line
    quotes its log's last line, and reaching the budget without an update is a failure. The budget
    outlasts the learner's first crash by far: a sampler taking random Pendulum steps made 1,500 in
    0.2 s, before the supervisor's first look at the learner."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    cfg = run_config(tmp_path, "total_steps=30000", "sampler.warmup_steps=40000", "replay.update_to_data=0",
                     "supervisor.max_restarts=1000",
                     "supervisor.backoff=0.05", "supervisor.heartbeat_interval=0.5", "visualizer.enabled=false")
    specs = [service("replay"), ServiceSpec("learner", "learner", "tests.crashing_service"),
             service("sampler", "sampler-0")]
    sup = Supervisor(cfg, specs=specs)
    rc = asyncio.run(asyncio.wait_for(sup.run(), 50))
    out = capsys.readouterr().out
    said = "crashing_service: exiting with code 3 on purpose"
    assert f"event restart: learner exited with code 3 (its log ends: {said}); restarting in" in out
    assert rc == 1 and sup.stop_reason.startswith("budget of 30,000 env steps reached, but the learner made no update")
    assert said in out.splitlines()[-1] and out.splitlines()[-1].startswith("stopped: budget of 30,000")


def test_a_registered_service_heartbeats_and_exits_on_shutdown(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    # liveness 30: a busy machine (a bare container beside other tests) may stall it half a second
    cfg = run_config(tmp_path, "supervisor.heartbeat_interval=0.1", "supervisor.liveness=30")

    async def during(sup: Supervisor, task: asyncio.Task[int]) -> None:
        child = sup.children["idle-0"]
        deadline = time.monotonic() + 7
        while not (child.registered and child.last_heartbeat > child.started + 0.3):
            assert time.monotonic() < deadline and not task.done(), "no registration/heartbeats"
            await asyncio.sleep(0.05)
        sup.stop("test done")

    rc, sup = run_supervisor(cfg, [ServiceSpec("idle-0", "idle", "tests.idle_service")], during)
    child = sup.children["idle-0"]
    assert rc == 0 and sup.stop_reason == "test done"
    assert child.proc is not None and child.proc.returncode == 0  # exited by itself on shutdown
    assert child.total_restarts == 0 and child.state == "stopped"  # its goodbye, or its exit code 0
    row = json.loads((Path(cfg.run_dir) / "services.json").read_text())["idle-0"]
    assert row["state"] == "stopped" and row["pid"] == child.proc.pid


def test_a_heartbeat_of_an_incarnation_taken_for_dead_does_not_revive_it() -> None:
    child = Child(ServiceSpec("idle-0", "idle", "tests.idle_service"), registered=True)
    Supervisor.child_heartbeat(child, Heartbeat("idle-0", "running"))
    assert child.state == "running" and child.last_heartbeat > 0
    child.restart_at, child.state, child.registered, child.last_heartbeat = 1.0, "restarting", False, 0.0
    Supervisor.child_heartbeat(child, Heartbeat("idle-0", "running"))  # still queued from the killed process
    assert child.state == "restarting" and child.last_heartbeat == 0.0


def test_a_service_building_itself_after_registering_is_not_taken_for_dead(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Registered, then 1 s without a heartbeat (imports, networks) against a 0.3 s silence: still starting."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("SPREEZE_TEST_BUILD_SECONDS", "1.0")
    cfg = run_config(tmp_path, "supervisor.heartbeat_interval=0.1", "supervisor.liveness=3")

    async def during(sup: Supervisor, task: asyncio.Task[int]) -> None:
        child = sup.children["idle-0"]
        deadline = time.monotonic() + 7
        states = []
        while not child.last_heartbeat - child.started > 1.0:  # a beat after its build
            assert time.monotonic() < deadline and not task.done(), "no heartbeat after the build"
            states.append(child.state)
            await asyncio.sleep(0.02)
        assert "registered" in states and child.state == "running"  # running from its first beat on
        sup.stop("test done")

    rc, sup = run_supervisor(cfg, [ServiceSpec("idle-0", "idle", "tests.idle_service")], during)
    assert rc == 0 and sup.children["idle-0"].total_restarts == 0
    assert not records(Path(cfg.run_dir) / "metrics.jsonl", "event")


def test_a_service_that_never_beats_after_registering_is_restarted_after_the_start_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("SPREEZE_TEST_BUILD_SECONDS", "30")
    cfg = run_config(tmp_path, "supervisor.start_timeout=3", "supervisor.max_restarts=0")
    rc, sup = run_supervisor(cfg, [ServiceSpec("idle-0", "idle", "tests.idle_service")])
    assert rc == 1 and sup.failure is not None
    assert "idle-0 failed (sent no heartbeat within 3s of its start)" in sup.failure  # no restart allowed


def test_the_sampler_pool_adds_under_fresh_ids_and_retires_the_newest_but_never_the_last() -> None:
    children = {sid: Child(service("sampler", sid), started=t) for sid, t in (("sampler-0", 1.0), ("sampler-1", 2.0))}
    started, told = [], []
    pool = SamplerPool(children, started.append, lambda sid, cmd: told.append((sid, cmd)), 2, grace=20.0)
    gone = pool.retire()
    assert gone is not None and gone.spec.service_id == "sampler-1" and gone.state == "leaving"
    assert list(children) == ["sampler-0"] and pool.leaving() == [gone]
    assert told == []  # it never registered: nobody to tell
    assert pool.retire() is None and list(children) == ["sampler-0"]  # the last one stays
    added = pool.add()
    assert added.spec.service_id == "sampler-2" and started == [added] and children["sampler-2"] is added
    pool.reap(0.0)
    assert pool.leaving() == []  # not alive: forgotten


def test_time_limit_stops_a_run(tmp_path: Path) -> None:
    rc, sup = run_supervisor(run_config(tmp_path, "time_limit=0.3"), [])
    assert rc == 0 and sup.stop_reason == "time limit of 0s reached"


def test_replay_metrics_reaching_the_budget_stop_the_run(tmp_path: Path) -> None:
    cfg = run_config(tmp_path, "total_steps=500")

    async def during(sup: Supervisor, task: asyncio.Task[int]) -> None:
        ctx = zmq.asyncio.Context()
        while "metrics_in" not in sup.endpoints:
            await asyncio.sleep(0.01)
        pub = Channel(ctx, "metrics_in", sup.endpoints["metrics_in"], binding=False, encoder=Encoder("replay"))
        try:
            while not task.done():  # PUB drops until the subscription arrives: repeat
                pub.send_nowait(Metrics("replay", {"inserted": 500, "replay_size": 500}))
                await asyncio.sleep(0.02)
        finally:
            ctx.destroy(linger=0)

    rc, sup = run_supervisor(cfg, [], during)
    assert rc == 0 and sup.stop_reason == "budget of 500 env steps reached"
    rows = records(Path(cfg.run_dir) / "metrics.jsonl", "metrics")
    assert rows and rows[0]["service"] == "replay" and rows[0]["inserted"] == 500
    assert records(Path(cfg.run_dir) / "metrics.jsonl", "progress")[-1]["env_steps"] == 500


def test_ledger_adds_up_a_restarted_samplers_incarnations() -> None:
    from spreeze.services.supervisor.ledger import Ledger

    ledger = Ledger()
    ledger.heard("sampler-0", {"env_steps": 50})  # not registered yet: not counted
    ledger.registered("sampler-0")
    ledger.heard("sampler-0", {"env_steps": 300})
    ledger.registered("sampler-0")  # restarted: its new incarnation counts from 0
    ledger.heard("sampler-0", {"env_steps": 200})
    ledger.heard("sampler-0", {"state": "running"})  # a heartbeat without the counter changes nothing
    replay = {"ledger/sampler-0/inserted": 500, "ledger/sampler-0/rejected": 0, "ledger/sampler-0/random": 100,
              "warmup_granted": 100}
    record, line = ledger.record(replay)
    assert record == {"samplers": {"sampler-0": {"made": 500, "stored": 500, "rejected": 0, "left_unstored": 0,
                                                 "random": 100}}, "warmup_granted": 100}
    assert line == "ledger: made = stored for 1 sampler(s), 500 env steps"
    _, lost = ledger.record({**replay, "ledger/sampler-0/inserted": 420})
    assert lost == "ledger: not stored: sampler-0 made 500, stored 420"
    # SIGKILLed after its last heartbeat (300) the first incarnation sent 64 more: its batches say so
    killed = {**replay, "ledger/sampler-0/inserted": 564, "ledger/sampler-0/env_steps": 564}
    assert ledger.record(killed)[1] == "ledger: made = stored for 1 sampler(s), 564 env steps"
    _, lost = ledger.record({**killed, "ledger/sampler-0/inserted": 500})  # replay lost what the batches made
    assert lost == "ledger: not stored: sampler-0 made 564, stored 500"
    # stopped by its owner mid-run, a sampler says how many steps it leaves unstored (the limiter held them)
    ledger.heard("sampler-0", {"env_steps": 300, "left_unstored": 36})
    record, line = ledger.record({**replay, "ledger/sampler-0/inserted": 564})
    assert record["samplers"]["sampler-0"]["made"] == 600 and record["samplers"]["sampler-0"]["left_unstored"] == 36
    assert line == ("ledger: made = stored for 1 sampler(s), 564 env steps (36 more left unstored by samplers that "
                    "exited mid-run: the run had not accepted them)")
    assert ledger.record({**replay, "ledger/sampler-0/inserted": 560})[1] == \
        "ledger: not stored: sampler-0 made 600, stored 560, left 36 unstored"


def test_a_hub_prints_and_records_the_plan_that_turned_compile_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A hub (compose, Swarm) starts no process, but the config it hands out was planned: its
    plan lines say why the learners update eagerly, on the console and in metrics.jsonl."""
    from spreeze.services.supervisor import main, probe, start, tuning_host

    monkeypatch.setattr(probe, "probe", lambda: probe.Hardware(cores=2, memory_gib=4.0))  # no C++ compiler
    monkeypatch.setattr(tuning_host, "BUS_WAIT", 0.5)  # no service publishes here: announce once the bus is up
    monkeypatch.setattr(main, "LATE_WINDOW", 0.5)  # nothing registers late here
    cfg = run_config(tmp_path, "supervisor.mode=hub", "learner.compile=true", "time_limit=1.5")
    assert start.start(cfg, frozenset(), resumed=False, quiet=False) == 0
    out = capsys.readouterr().out
    assert "event plan: learner.compile=False: no C++ compiler or Python headers" in out, out
    assert "apt-get install g++ python3-dev" in out
    assert "sampler.num_samplers" not in out  # a hub starts no sampler: that choice is not its to announce
    plans = {e["key"]: e["value"] for e in records(Path(cfg.run_dir) / "metrics.jsonl", "event")
             if e["event"] == "plan"}
    assert plans["learner.compile"] is False and "learner.threads" in plans


def test_a_learner_that_updated_is_not_called_idle_for_lack_of_a_metrics_message(tmp_path: Path) -> None:
    """A short run's learner may exit before its first metrics message: the counters of its
    heartbeats (the last one sent as it exits) count too."""
    sup = Supervisor(config(tmp_path, "learner.mode=fused"))
    sup.stop_reason = "budget of 1,200 env steps reached"
    sup.progress.take(Metrics("replay", {"inserted": 1200}))
    assert sup.no_update() == ("the learner made no update (it did not report one); "
                               f"see {tmp_path / 'logs' / 'learner.log'}")
    sup.children["learner"].counters = {"updates": 428}
    assert sup.no_update() is None
    sup.progress.close()


def test_a_hub_tunes_what_its_set_commands_reach_and_never_the_samplers(tmp_path: Path) -> None:
    """Under compose the hub starts no process: it tunes envs per sampler and batches per
    request (by `set` commands to the containers) but never the number of samplers."""
    from spreeze.services.supervisor.tuner import Window
    from spreeze.services.supervisor.tuning import TuningLoop

    hub = Supervisor(config(tmp_path, "supervisor.mode=hub"))
    assert hub.tunable and not hub.children
    tuner = TuningLoop(hub, hub.cfg, hub.pinned).tuner  # as run() makes it
    assert "samplers" in tuner.pinned and {"envs", "bpr"}.isdisjoint(tuner.pinned)
    sampling_bound = Window(frame_rate=1000.0, sampling_hz=500.0, update_to_data=1.0, insert_stall=0.0,
                            sample_stall=0.9, idle_cores=4.0)
    moves = tuner.candidates(sampling_bound)
    assert moves and not [m for m in moves if m.startswith("samplers")], moves
    (tmp_path / "local").mkdir()
    local = Supervisor(config(tmp_path / "local"))  # the same window where it starts the samplers itself
    assert local.tunable and "samplers+" in TuningLoop(local, local.cfg, local.pinned).tuner.candidates(sampling_bound)


def test_a_supervisor_loop_that_raises_stops_the_run_as_a_failure_naming_it(tmp_path: Path) -> None:
    sup = Supervisor(config(tmp_path), quiet=True)

    async def metrics_loop() -> None:
        raise OSError(5, "Input/output error")

    async def body() -> None:
        task = asyncio.create_task(metrics_loop(), name="Supervisor.metrics_loop")
        task.add_done_callback(sup.loop_ended)
        await asyncio.wait_for(sup.done.wait(), 5)

    run(body())
    assert sup.failure is not None
    assert "the supervisor's Supervisor.metrics_loop failed" in sup.stop_reason and "Input/output" in sup.stop_reason
    sup.progress.close()


def test_a_run_without_samplers_says_so_once_with_how_to_add_one_and_when_one_is_back() -> None:
    from spreeze.services.supervisor.sampler_watch import SamplerWatch, hint

    watch = SamplerWatch(hint(hub=True, listen="tcp://0.0.0.0:5555"), after_s=10)
    assert watch.check(1, 0.0) is None
    assert watch.check(0, 1.0) is None and watch.check(0, 10.9) is None  # a restart takes a few seconds
    kind, reason = watch.check(0, 11.0)  # type: ignore[misc]
    assert kind == "no_sampler" and "for 10s" in reason and "docker compose up -d --scale sampler=N" in reason
    assert "spreeze sampler --connect tcp://0.0.0.0:5555" in reason
    assert watch.check(0, 30.0) is None  # said once per stretch
    assert watch.check(2, 31.0) == ("samplers_back", "2 samplers attached again")
    assert watch.check(0, 32.0) is None and watch.check(0, 42.0)[0] == "no_sampler"  # type: ignore[index]
    assert "attach one: `spreeze sampler --connect" in hint(hub=False, listen="tcp://h:1")
