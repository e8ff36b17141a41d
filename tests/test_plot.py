"""`spreeze plot`: PNGs from real metrics.jsonl files (one run, several runs, bad input)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from common.errors import ConfigError
from common.plot import load, mean_std, plot_runs

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
    proc = subprocess.run([sys.executable, "-m", "cli", "plot", *runs, "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(out / "learning_curves.png"), str(out / "throughput.png")]


def test_bad_run_directories_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nowhere"):
        plot_runs([tmp_path / "nowhere"])
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text('{"kind": "start", "wall_time": 0}\n')
    proc = subprocess.run([sys.executable, "-m", "cli", "plot", str(empty)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no evaluation in" in proc.stderr and str(empty) in proc.stderr
