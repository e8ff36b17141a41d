"""`spreeze plot`: PNGs from real metrics.jsonl files (one run, several runs, bad input)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from PIL import Image

from spreeze.common.errors import ConfigError
from spreeze.common.plot import (NO_UPDATES, curve, learning_figure, load, mean_std, plot_runs, sampling_curve,
                         throughput_figure)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

pytestmark = pytest.mark.timeout(60)


def fake_run(run_dir: Path, offset: float, evals: int = 5) -> Path:
    """A metrics.jsonl as the supervisor writes it: replay and learner metrics, evaluations."""
    run_dir.mkdir(parents=True)
    rows: list[dict] = [{"kind": "start", "wall_time": 0.0, "unix_time": 1.7e9}]
    for i in range(1, evals + 1):
        t, steps = 10.0 * i, 1000 * i
        rows += [{"kind": "metrics", "wall_time": t, "service": "learner", "updates": steps, "update_frame_rate": 3e4},
                 {"kind": "metrics", "wall_time": t, "service": "replay", "inserted": steps, "replay_size": steps},
                 {"kind": "eval", "wall_time": t + 1, "env_steps": steps, "return_mean": offset + 100.0 * i,
                  "return_std": 5.0}]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{truncated")
    return run_dir


def test_mean_std_on_the_common_range() -> None:
    a = np.array([[0, 0, 0], [10, 10, 0]], float)
    b = np.array([[2, 4, 0], [12, 14, 0]], float)
    x, mean, std = mean_std([a, b])
    assert x[0] == 2 and x[-1] == 10
    np.testing.assert_allclose(mean, x + 1)  # a: y = x, b: y = x + 2
    np.testing.assert_allclose(std, 1.0)
    far = np.array([[20, 0, 0], [30, 1, 0]], float)
    assert len(mean_std([a, far])[0]) == 0  # no common range: no mean at all


def test_one_run_writes_both_pngs_into_its_directory(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", 0.0)
    assert load(run).points["eval_steps:return"][-1] == [5000.0, 500.0, 5.0]
    paths = plot_runs([run])
    assert [p.name for p in paths] == ["learning_curves.png", "throughput.png"]
    for p in paths:
        assert p.parent == run
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size[0] > 600
            assert np.asarray(im.convert("L")).std() > 10  # something was drawn


def test_several_runs_through_the_cli(tmp_path: Path) -> None:
    runs = [str(fake_run(tmp_path / f"seed{i}", 50.0 * i)) for i in range(3)]
    out = tmp_path / "plots"
    proc = subprocess.run([sys.executable, "-m", "spreeze.cli", "plot", *runs, "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(out / "learning_curves.png"), str(out / "throughput.png")]


def test_bad_run_directories_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nowhere"):
        plot_runs([tmp_path / "nowhere"])
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text('{"kind": "start", "wall_time": 0}\n')
    proc = subprocess.run([sys.executable, "-m", "spreeze.cli", "plot", str(empty)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no evaluation in" in proc.stderr and str(empty) in proc.stderr


def rows_file(run_dir: Path, rows: list[dict]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_a_single_evaluation_is_drawn_as_a_visible_dot(tmp_path: Path) -> None:
    one = load(fake_run(tmp_path / "one", 0.0, evals=1))
    many = load(fake_run(tmp_path / "many", 0.0, evals=5))
    for runs in ({"one": one}, {"one": one, "many": many}):
        fig = learning_figure(runs)
        for ax in fig.axes:
            [line] = [ln for ln in ax.lines if ln.get_label() == "one"]
            assert len(line.get_xdata()) == 1
            assert line.get_marker() not in (None, "", "None", ".") and line.get_markersize() >= 4
        plt.close(fig)


def test_a_panel_without_data_says_why(tmp_path: Path) -> None:
    """A run stopped before its first update: the update-rate panel says there is no data."""
    run = rows_file(tmp_path / "warmup", [
        {"kind": "start", "wall_time": 0.0},
        {"kind": "metrics", "wall_time": 1.0, "service": "replay", "inserted": 500},
        {"kind": "progress", "wall_time": 2.0, "sampling_hz": 400.0},
        {"kind": "eval", "wall_time": 3.0, "env_steps": 500, "return_mean": -1200.0, "return_std": 50.0}])
    fig = throughput_figure({"warmup": load(run)})
    sampling, updates = fig.axes
    assert sampling.lines and not sampling.texts
    assert not updates.lines
    assert [t.get_text() for t in updates.texts] == [NO_UPDATES] and "no update" in NO_UPDATES
    plt.close(fig)
    plot_runs([run])  # and the PNGs are written


def test_the_sampling_rate_is_the_console_lines(tmp_path: Path) -> None:
    """The console counts from the run's start, the replay-metrics rate from replay's first
    report: with the warm-up already in that report, only the console's shows it. The plot
    shows the console's numbers (its progress records)."""
    rows: list[dict] = [{"kind": "start", "wall_time": 0.0}]
    for i in range(1, 11):
        inserted = 1000 + 100 * i  # 1,000 warm-up steps in the first second, then 100 steps/s
        rows += [{"kind": "metrics", "wall_time": float(i), "service": "replay", "inserted": inserted}]
        if i % 2 == 0:  # the console line every 2 s: the inserts since the previous line
            rows += [{"kind": "progress", "wall_time": float(i), "sampling_hz": 1100 / 2 if i == 2 else 100.0}]
    run = rows_file(tmp_path / "run", rows)
    series = load(run)
    np.testing.assert_allclose(sampling_curve(series), [[2, 550], [4, 100], [6, 100], [8, 100], [10, 100]])
    assert curve(series, "sampling:env steps/s")[0, 1] == pytest.approx(100)  # what it showed before
    fig = throughput_figure({"run": series})
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [550, 100, 100, 100, 100])
    plt.close(fig)
