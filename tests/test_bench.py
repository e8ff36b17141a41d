"""bench sampling and bench update: the window arithmetic, and tiny end-to-end runs through
`spreeze bench ...` (real supervisor, real services, real sockets)."""

from __future__ import annotations

import glob
import importlib.util
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spreeze.bench.system import BenchFailed, rate
from spreeze.cli.main import main as cli
from spreeze.services.supervisor.probe import Hardware
from tests.helpers import needs_cxx
from tests.test_integration import pid_alive


def test_rate_excludes_start_up_and_the_shutdown() -> None:
    rows = [{"kind": "start", "wall_time": 0.0},
            {"kind": "metrics", "service": "replay", "wall_time": 1.0, "inserted": 0},
            {"kind": "metrics", "service": "replay", "wall_time": 1.5, "inserted": 100, "stall": 0.0},
            {"kind": "metrics", "service": "sampler-0", "wall_time": 1.7, "inserted": 10 ** 9},
            {"kind": "metrics", "service": "replay", "wall_time": 2.5, "inserted": 1100, "stall": 0.5},
            {"kind": "metrics", "service": "replay", "wall_time": 3.5, "inserted": 2100, "stall": 0.5},
            {"kind": "metrics", "service": "replay", "wall_time": 4.5, "inserted": 2100}]  # after the stop
    got = rate(rows, "replay", "inserted", until=4.0, also=("stall",))
    assert got["rate"] == pytest.approx(1000.0) and got["window_s"] == pytest.approx(2.0)
    assert got["stall"] == pytest.approx(0.25)
    with pytest.raises(BenchFailed, match="too few"):
        rate(rows, "replay", "inserted", until=2.0)


def test_filler_is_a_runnable_module() -> None:
    assert importlib.util.find_spec("spreeze.bench.filler") is not None


@pytest.mark.timeout(180)
def test_bench_sampling_smoke(tmp_path: Path) -> None:
    out = tmp_path / "sampling.json"
    assert cli(["bench", "sampling", "--env", "Pendulum-v1", "--samplers", "1", "--envs", "1",
                "--seconds", "3", "--json", str(out), "--out", str(tmp_path / "runs")]) == 0
    result = json.loads(out.read_text())
    assert result["bench"] == "sampling" and result["cores"] == os.cpu_count()
    assert result["plain_steps_per_s"] > 0
    (row,) = result["results"]
    assert (row["samplers"], row["envs_per_sampler"]) == (1, 1)
    assert row["transitions_per_s"] > 0 and row["ratio_to_cores"] > 0
    if result["cores"] > 1:
        assert row["ratio_to_samplers"] == pytest.approx(row["ratio_to_cores"] * result["cores"])
    else:
        assert row["ratio_to_samplers"] is None
    assert row["window_s_runs"][0] > 1.0  # about --seconds, start-up excluded


@pytest.mark.slow
@needs_cxx
@pytest.mark.timeout(180)
def test_bench_update_smoke(tmp_path: Path) -> None:
    out = tmp_path / "update.json"
    assert cli(["bench", "update", "--algo", "td3", "--batch-sizes", "64", "--hidden", "32", "32",
                "--seconds", "3", "--fill", "2000", "--json", str(out), "--out", str(tmp_path / "runs"),
                "--no-compile-times", f"learner.compile_cache={tmp_path / 'runs' / 'compile-cache'}"]) == 0
    result = json.loads(out.read_text())
    assert result["bench"] == "update" and result["hidden"] == [32, 32]
    (row,) = result["results"]
    assert (row["algo"], row["batch"]) == ("td3", 64)
    assert row["spreeze_updates_per_s"] > 0 and row["plain_updates_per_s"] > 0
    assert row["spreeze_frame_rate"] == pytest.approx(64 * row["spreeze_updates_per_s"])
    assert row["plain_frame_rate"] == pytest.approx(64 * row["plain_updates_per_s"])
    assert row["ratio"] == pytest.approx(row["spreeze_updates_per_s"] / row["plain_updates_per_s"])
    assert row["compiled_updates_per_s"] > 0 and row["eager_updates_per_s"] > 0
    assert row["compiled_over_eager"] == pytest.approx(row["compiled_updates_per_s"] / row["eager_updates_per_s"])
    assert row["inproc_compile_s_runs"][0] > 0 and result["compile_s"] == {}
    assert 0 <= row["spreeze_batch_wait_fraction"] <= 1.05  # a share of the time (clocks of two processes)
    # the learner really trained on the filled replay, through the sockets
    assert (tmp_path / "runs" / "r0-td3-b64" / "checkpoints" / "learner.pt").exists()


def test_bench_update_without_a_cxx_compiler_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert cli(["bench", "update", "--algo", "td3", "--batch-sizes", "64", "--seconds", "1"]) != 0
    assert "no C++ compiler" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_e2e_smoke(tmp_path: Path) -> None:
    out = tmp_path / "e2e.json"
    assert cli(["bench", "e2e", "--config", "configs/pendulum-smoke.yaml", "--seconds", "4", "--settle", "1",
                "--json", str(out), "--out", str(tmp_path / "runs")]) == 0
    result = json.loads(out.read_text())
    assert result["bench"] == "e2e" and result["env"] == "Pendulum-v1"
    assert result["sampling_hz"] > 0 and result["updates_per_s"] > 0
    assert result["update_frame_rate"] == pytest.approx(result["batch_size"] * result["updates_per_s"])
    assert result["update_to_data"] == pytest.approx(result["updates_per_s"] / result["sampling_hz"])
    services = result["services"]
    assert {"replay", "learner", "evaluator", "sampler-0", "supervisor"} <= set(services)
    assert all(s["cpu_share"] >= 0 for s in services.values())
    for sid in ("replay", "learner"):  # they report metrics every second: their transport share is known
        assert 0 < services[sid]["transport_share"] < 1


def test_transport_seconds_count_codec_and_socket_calls() -> None:
    import zmq.asyncio

    from spreeze.proto.codec import Encoder
    from spreeze.common.transport import Channel, transport_seconds
    from spreeze.proto.messages import Heartbeat

    async def go() -> None:
        ctx = zmq.asyncio.Context()
        a = Channel(ctx, "control", "inproc://busy", binding=True, encoder=Encoder("a"))
        b = Channel(ctx, "control", "inproc://busy", binding=False, encoder=Encoder("b"), identity="b")
        before = transport_seconds()
        for _ in range(200):
            await b.send(Heartbeat("b", "running", {"x": 1}))
            await a.recv()
        assert transport_seconds() > before
        ctx.destroy(linger=0)

    import asyncio
    asyncio.run(go())


def test_tuner_bench_frame_rate_weights_each_interval_by_its_batch() -> None:
    from spreeze.bench.tuner import frame_rate, parse_setting

    rows = [{"kind": "metrics", "service": "learner", "wall_time": t, "updates": u, "batch_size": b}
            for t, u, b in ((1.0, 0, 64), (2.0, 100, 64), (3.0, 150, 128), (4.0, 200, 128), (9.0, 999, 128))]
    assert frame_rate(rows, 1.0, 4.0) == pytest.approx((100 * 64 + 50 * 128 + 50 * 128) / 3.0)
    with pytest.raises(BenchFailed, match="too few"):
        frame_rate(rows, 5.0, 8.0)
    assert parse_setting("2x8x512") == parse_setting("2X8X512")
    for bad in ("2x8", "0x1x64", "axbxc"):
        with pytest.raises(Exception, match="setting"):
            parse_setting(bad)


@pytest.mark.timeout(120)
def test_bench_snapshot_smoke(tmp_path: Path) -> None:
    out = tmp_path / "snapshot.json"
    assert cli(["bench", "snapshot", "--capacity", "20000", "--new", "3000", "--plain-turns", "20", "--insert", "1",
                "--dir", str(tmp_path), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["full"]["rows_written"] == 20_000 and got["full"]["bytes"] > 20_000 * got["row_bytes"]
    assert 3000 <= got["increment"]["rows_written"] < 20_000  # only the rows added since
    assert got["restore_s"] > 0 and got["full"]["max_call_ms"] > 0


@pytest.mark.timeout(120)
def test_bench_remote_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["bench", "remote", "--rows", "64", "--messages", "20", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for path in ("ipc", "tcp", "tcp+curve"):
        assert f"  {path} " in out
    assert "1.00 of ipc" in out


TINY_PENDULUM = ["replay.min_size=500", "sampler.warmup_steps=500", "eval.every_updates=300", "eval.episodes=1",
                 "learner.compile=false"]


@pytest.mark.slow
def test_bench_learning_reruns_replace_their_runs_and_other_settings_get_their_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from spreeze.bench.learning import main as learning
    tiny = ["--env", "Pendulum-v1", "--threshold", "-1600", "--seeds", "0", "--total-steps", "1200",
            "--out", str(tmp_path), *TINY_PENDULUM]
    assert learning(tiny) == 0
    (first,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (first / "s0" / "metrics.jsonl").exists() and first.with_suffix(".json").exists()
    assert learning(tiny) == 0  # the same command again: a fresh run in the same place, not an error
    assert "replacing the earlier run" in capsys.readouterr().out
    starts = [line for line in (first / "s0" / "metrics.jsonl").read_text().splitlines() if '"kind": "start"' in line]
    assert len(starts) == 1
    assert learning([*tiny, "td3.hidden=[32,32]"]) == 0  # other settings: their own directory and JSON
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2
    assert learning([*tiny, "td3.tau=7"]) == 1  # a run that fails is an error line and status 1, no traceback
    assert "spreeze bench learning: error: seed 0 failed" in capsys.readouterr().err


@pytest.mark.parametrize("python", [sys.executable, "/nonexistent/python"])
def test_bench_learning_refuses_an_sb3_python_that_cannot_run_it_before_any_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], python: str) -> None:
    """--sb3 names a Python with stable-baselines3 (the project's own has none): one that
    cannot import it, or cannot run, is refused by name before a seed trains."""
    from spreeze.bench.learning import main as learning
    if python == sys.executable and importlib.util.find_spec("stable_baselines3") is not None:
        pytest.skip("this Python has stable-baselines3")
    with pytest.raises(SystemExit) as exit_:
        learning(["--env", "Pendulum-v1", "--threshold", "-1600", "--out", str(tmp_path), "--sb3", python])
    assert exit_.value.code == 2 and f"--sb3 {python}: " in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_bench_learning_cold_vs_warm_compile_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--cold-vs-warm: each seed first with an empty compile cache, then with the same cache
    (which the first run fills once its compile ends; that the second run starts from it is
    tests/test_learners.py's), both reported with the cold-over-warm ratio."""
    import yaml

    from spreeze.bench.learning import main as learning
    compiled = [o for o in TINY_PENDULUM if o != "learner.compile=false"] + ["learner.compile=true", "td3.hidden=[8,8]"]
    tiny = ["--env", "Pendulum-v1", "--threshold", "-1600", "--seeds", "0", "--total-steps", "1200",
            "--out", str(tmp_path), "--cold-vs-warm", *compiled]
    assert learning(tiny) == 0
    (summary,) = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert [r["compile_cache"] for r in summary["seeds"]] == ["cold", "warm"]
    assert set(summary["cold"]) == set(summary["warm"]) >= {"median_seconds_to_threshold"}
    assert "cold/warm = " in capsys.readouterr().out
    (base,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    caches = {yaml.safe_load((base / f"s0-{v}" / "config.yaml").read_text())["learner"]["compile_cache"]
              for v in ("cold", "warm")}
    assert caches == {str(base / "s0-compile-cache")}
    (base / "s0-compile-cache" / "left-over").write_text("from an earlier run")
    assert learning(tiny) == 0  # again: the cold run starts from an empty cache
    assert not (base / "s0-compile-cache" / "left-over").exists()


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for task in glob.glob(f"/proc/{todo.pop()}/task/*/children"):
            try:
                kids = {int(k) for k in Path(task).read_text().split()}
            except OSError:  # the task ended meanwhile
                continue
            todo += kids - found
            found |= kids
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("command", [["bench", "learning", "--threshold", "-1600"], ["results", "--modes", "dense"]])
def test_a_terminated_benchmark_stops_its_training_run_first(tmp_path: Path, command: list[str]) -> None:
    """SIGTERM to `spreeze bench learning` or `spreeze results` alone (as `kill PID` sends
    it): the training run and its services stop with it instead of training on, orphaned;
    `results` marks its section stopped."""
    md = tmp_path / "Pendulum-v1.md"
    where = ["--out", str(tmp_path)] if command[0] == "bench" else ["--out", str(md), "--runs-dir", str(tmp_path)]
    cmd = [sys.executable, "-m", "spreeze.cli", *command, "--env", "Pendulum-v1", "--seeds", "0", "--total-steps",
           "1000000", *where, *TINY_PENDULUM]
    bench = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    tree: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not any('"kind": "eval"' in f.read_text() for f in tmp_path.glob("**/metrics.jsonl")):
            assert bench.poll() is None, bench.communicate()
            assert time.monotonic() < deadline, "the run never evaluated"
            time.sleep(0.5)
        tree = _descendants(bench.pid)
        assert len(tree) >= 5  # the train command, its supervisor's services
        bench.send_signal(signal.SIGTERM)
        status = bench.wait(timeout=90)
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in tree if pid_alive(p)], "the training run outlived its benchmark"
        assert status == 128 + signal.SIGTERM
        if command[0] == "results":
            assert "0/1 runs done (stopped)" in md.read_text()
    finally:
        for p in [bench.pid, *tree]:
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)
        bench.communicate()


# ------------------------------------------------------------------ bench transport

@pytest.mark.timeout(60)
def test_bench_transport_smoke(tmp_path: Any) -> None:
    from spreeze.bench.transport import run
    out = tmp_path / "bench.json"
    before = set(glob.glob("/tmp/spzb-*"))
    result = run(batch_sizes=(64,), seconds=0.2, repeats=1, json_path=str(out))
    assert set(glob.glob("/tmp/spzb-*")) <= before  # its ipc directory is gone
    (row,) = result["results"]
    assert row["batch"] == 64 and row["codec_tps"] > 0 and row["bare_tps"] > 0 and row["ratio"] > 0
    assert json.loads(out.read_text())["results"][0]["batch"] == 64
    assert not mp.get_context("spawn").active_children() and not mp.active_children()


@pytest.mark.timeout(60)
def test_bench_cleans_up_after_a_dead_child() -> None:
    from spreeze.bench.transport import _one, _Pair
    pair = _Pair()
    try:
        pair.start()
        pair.procs[0].kill()  # the receiver dies
        pair.procs[0].join(5)
        with pytest.raises(RuntimeError, match="gone|died"):
            _one(pair, "codec", 64, 0.1, 0.1)
    finally:
        pair.close()
    assert not any(p.is_alive() for p in pair.procs)
    assert not os.path.exists(pair.dir)


# ------------------------------------------------------------------ bench e2e plans like spreeze train

SIXTEEN_CORES = Hardware(cores=16, memory_gib=64.0, gpus=(), cxx="g++")


def planned_e2e(monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """The config `bench e2e *args` would measure on a 16-core host without a GPU (nothing runs)."""
    from spreeze.bench import e2e

    got = []
    monkeypatch.setattr(e2e, "probe", lambda: SIXTEEN_CORES)
    monkeypatch.setattr(e2e, "run", lambda cfg, *rest: got.append(cfg))
    assert e2e.main(list(args)) == 0
    return got[0]


def test_bench_e2e_plans_the_run_as_train_does(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from spreeze.common.config import given_keys, load_config
    from spreeze.services.supervisor.start import planned

    smoke = "configs/pendulum-smoke.yaml"
    cfg = planned_e2e(monkeypatch, "--config", smoke)
    train_cfg, choices = planned(load_config(smoke), given_keys(smoke), SIXTEEN_CORES)
    assert cfg.sampler.num_samplers == train_cfg.sampler.num_samplers > 1  # not 1 sampler on 16 cores
    assert cfg.sampler.envs_per_sampler == train_cfg.sampler.envs_per_sampler
    assert (cfg.learner.mode, cfg.learner.threads) == (train_cfg.learner.mode, train_cfg.learner.threads)
    out = capsys.readouterr().out
    assert f"spreeze: hardware: {SIXTEEN_CORES.describe()}" in out
    for choice in choices:
        assert f"event plan: {choice.describe()}" in out


def test_bench_e2e_keeps_the_keys_the_user_set(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cfg = planned_e2e(monkeypatch, "--config", "configs/pendulum-smoke.yaml", "sampler.num_samplers=2",
                      "sampler.envs_per_sampler=3")
    assert (cfg.sampler.num_samplers, cfg.sampler.envs_per_sampler) == (2, 3)
    assert "event plan: sampler.num_samplers=" not in capsys.readouterr().out


def test_bench_update_refuses_batches_beyond_the_fill_before_starting_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every batch size is checked up front, not only the first: 4096 x 4 requests do not fit
    in a 10,000-transition replay (the first, 64 x 4, would)."""
    started = time.monotonic()
    assert cli(["bench", "update", "--algo", "td3", "--batch-sizes", "64", "4096", "--fill", "10000",
                "--out", str(tmp_path / "runs"), "learner.batches_per_request=4"]) == 2
    assert time.monotonic() - started < 10
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("spreeze bench: error: --algo td3 --batch-sizes 4096 --fill 10000")
    assert "learner.batch_size x learner.batches_per_request = 16384 exceeds replay.capacity=10000" in line
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # ~18 s on 2 busy cores, most of it the learner importing torch before it crashes
@pytest.mark.timeout(120)
def test_bench_e2e_fails_at_once_with_the_error_of_a_learner_that_cannot_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A learner that crashes at start (here: on a corrupt checkpoint it restores) ends the
    bench within seconds, its last log line in the error, instead of crash-looping until the
    start-up timeout; no service outlives the command."""
    checkpoints = tmp_path / "runs" / "r0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "learner.pt").write_bytes(b"not a checkpoint")
    started = time.monotonic()
    assert cli(["bench", "e2e", "--config", "configs/pendulum-smoke.yaml", "--seconds", "2", "--settle", "0",
                "--out", str(tmp_path / "runs"), "learner.mode=fused", "visualizer.enabled=false"]) == 2
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert "learner failed (exited with code 1) (its log ends: " in err.splitlines()[0], err
    assert took < 60, f"took {took:.0f}s"
    roster = json.loads((tmp_path / "runs" / "r0" / "services.json").read_text())
    assert not [sid for sid, row in roster.items() if row["pid"] and pid_alive(row["pid"])]
