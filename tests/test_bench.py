"""bench sampling and bench update: the window arithmetic, and tiny end-to-end runs through
`spreeze bench ...` (real supervisor, real services, real sockets)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from bench.system import BenchFailed, rate
from common.cli import main as cli


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
    assert importlib.util.find_spec("bench.filler") is not None


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


@pytest.mark.timeout(180)
def test_bench_update_smoke(tmp_path: Path) -> None:
    out = tmp_path / "update.json"
    assert cli(["bench", "update", "--algo", "td3", "--batch-sizes", "64", "--hidden", "32", "32",
                "--seconds", "3", "--fill", "2000", "--json", str(out), "--out", str(tmp_path / "runs")]) == 0
    result = json.loads(out.read_text())
    assert result["bench"] == "update" and result["hidden"] == [32, 32]
    (row,) = result["results"]
    assert (row["algo"], row["batch"]) == ("td3", 64)
    assert row["spreeze_updates_per_s"] > 0 and row["plain_updates_per_s"] > 0
    assert row["spreeze_frame_rate"] == pytest.approx(64 * row["spreeze_updates_per_s"])
    assert row["plain_frame_rate"] == pytest.approx(64 * row["plain_updates_per_s"])
    assert row["ratio"] == pytest.approx(row["spreeze_updates_per_s"] / row["plain_updates_per_s"])
    assert 0 <= row["spreeze_batch_wait_fraction"] <= 1.05  # a share of the time (clocks of two processes)
    # the learner really trained on the filled replay, through the sockets
    assert (tmp_path / "runs" / "r0-td3-b64" / "checkpoints" / "learner.pt").exists()


@pytest.mark.timeout(120)
def test_bench_remote_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["bench", "remote", "--rows", "64", "--messages", "20", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for path in ("ipc", "tcp", "tcp+curve"):
        assert f"  {path} " in out
    assert "1.00 of ipc" in out
