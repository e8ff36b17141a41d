"""`spreeze plot RUN_DIR [RUN_DIR ...]`: PNG learning curves and throughput from metrics.jsonl.

learning_curves.png: evaluation return against env steps and against wall-clock seconds;
one run shows its evaluation spread (± std over episodes), several runs show each run
thinly and their mean ± std across runs on the env-step (or time) range they all cover.
throughput.png: sampling rate (env steps/s) and update frame rate (transitions/s) over time.
The sampling rate is the console progress line's (replay's inserts per second between two
lines, summed over samplers as replay counts them), read from the lines' `progress` records;
the other numbers come from common/metric_series.py, as on the live dashboard. A series of
one point is drawn as a dot, and an empty panel says why it is empty.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from spreeze.common.errors import ConfigError
from spreeze.common.metric_series import MetricSeries

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GRID = 200  # points of the common axis the runs are interpolated onto for mean ± std
SOLO_MARKER = 6  # points: a run with one evaluation (or one rate) is a dot of this size
CONSOLE_RATE = "console:sampling_hz"  # the progress lines' rate, read from their metrics.jsonl records
NO_SAMPLING = ("no sampling rate:\nno progress line was recorded, and replay reported\n"
               "no two counts 2 s apart (the run stopped as it started)")
NO_UPDATES = ("no update rate:\nthe learners reported no update_frame_rate\n"
              "(no update yet: the run stopped in its warm-up\nor in the learner's compile)")


def load(run_dir: Path) -> MetricSeries:
    """A run's series from its metrics.jsonl, and (as ``CONSOLE_RATE``) the sampling rate its
    console progress lines showed."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run directory: it has no metrics.jsonl")
    series = MetricSeries()
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
        if isinstance(row, dict):
            series.take(row)
            t, hz = row.get("wall_time"), row.get("sampling_hz")
            if row.get("kind") == "progress" and isinstance(t, (int, float)) and isinstance(hz, (int, float)):
                series.add(CONSOLE_RATE, t, hz)
    return series


def curve(series: MetricSeries, name: str) -> np.ndarray:
    """Points of one series as an [n, 2 or 3] array sorted by x ([0, 2] when empty)."""
    pts = np.array(series.points.get(name, []), dtype=float).reshape(-1, 3 if name.startswith("eval") else 2)
    return pts[np.argsort(pts[:, 0], kind="stable")]


def mean_std(curves: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs interpolated onto the x range they all cover: (x, mean, std across runs); empty
    arrays when they share no range."""
    lo, hi = max(c[0, 0] for c in curves), min(c[-1, 0] for c in curves)
    grid = np.linspace(lo, hi, GRID) if hi > lo else np.array([])
    ys = np.stack([np.interp(grid, c[:, 0], c[:, 1]) for c in curves])
    return grid, ys.mean(axis=0), ys.std(axis=0)


def marks(c: np.ndarray) -> dict[str, Any]:
    """Line style keywords: a lone point gets a marker, or a line through it would not show."""
    return {"marker": "o", "markersize": SOLO_MARKER} if len(c) == 1 else {}


def no_data(ax: Any, why: str) -> None:
    """Say in the panel why it is empty, instead of leaving a bare axis."""
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", fontsize=9,
            color="0.3")
    ax.set_xticks([])
    ax.set_yticks([])


def learning_figure(runs: dict[str, MetricSeries]) -> Figure:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, name, xlabel in ((axes[0], "eval_steps:return", "env steps"), (axes[1], "eval_time:return", "seconds")):
        curves = {run: curve(s, name) for run, s in runs.items()}
        curves = {run: c for run, c in curves.items() if len(c)}
        if len(curves) == 1:
            (run, c), = curves.items()
            ax.plot(c[:, 0], c[:, 1], **({"marker": "."} | marks(c)), label=run)
            if len(c) == 1:
                ax.errorbar(c[:, 0], c[:, 1], yerr=c[:, 2], fmt="none", capsize=4, label="± std over episodes")
            else:
                ax.fill_between(c[:, 0], c[:, 1] - c[:, 2], c[:, 1] + c[:, 2], alpha=0.25,
                                label="± std over episodes")
        elif curves:
            for run, c in curves.items():
                ax.plot(c[:, 0], c[:, 1], lw=0.8, alpha=0.6, label=run, **marks(c))
            x, mean, std = mean_std(list(curves.values()))
            if len(x):
                ax.plot(x, mean, lw=2.2, color="black", label=f"mean of {len(curves)} runs")
                ax.fill_between(x, mean - std, mean + std, color="black", alpha=0.15, label="± std across runs")
            else:
                ax.text(0.5, 0.02, "the runs share no range: no mean", transform=ax.transAxes, ha="center")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("evaluation return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("Return vs env steps")
    axes[1].set_title("Return vs wall-clock")
    return fig


def plot_learning(runs: dict[str, MetricSeries], out: Path) -> Path:
    return _save(learning_figure(runs), out / "learning_curves.png")


def sampling_curve(series: MetricSeries) -> np.ndarray:
    """The console's sampling rate (replay inserts per second between progress lines); the
    replay-metrics rate of the dashboard where the run recorded no progress line."""
    c = curve(series, CONSOLE_RATE)
    return c if len(c) else curve(series, "sampling:env steps/s")


def throughput_figure(runs: dict[str, MetricSeries]) -> Figure:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for run, s in runs.items():
        c = sampling_curve(s)
        if len(c):
            axes[0].plot(c[:, 0], c[:, 1], label=run, **marks(c))
        for name in sorted(n for n in s.points if n.startswith("updates:")):
            c = curve(s, name)
            axes[1].plot(c[:, 0], c[:, 1], label=f"{run} {name.split(':', 1)[1]}", **marks(c))
    panels = ((axes[0], "Sampling (env steps/s, as on the console line)", NO_SAMPLING),
              (axes[1], "Update frame rate (transitions/s)", NO_UPDATES))
    for ax, title, why in panels:
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            no_data(ax, why)
    return fig


def plot_throughput(runs: dict[str, MetricSeries], out: Path) -> Path:
    return _save(throughput_figure(runs), out / "throughput.png")


def _save(fig: object, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return path


def plot_runs(run_dirs: list[Path], out: Path | None = None) -> list[Path]:
    """Write both PNGs (into `out`; default: the run directory of a single run, else the current
    directory) and return their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    runs = {}
    for d in run_dirs:
        name = d.resolve().name
        runs[name if name not in runs else str(d)] = load(d)
    if not any(s.points.get("eval_steps:return") for s in runs.values()):
        raise ConfigError(f"no evaluation in {', '.join(map(str, run_dirs))}: nothing to plot yet")
    out = out or (run_dirs[0] if len(run_dirs) == 1 else Path("."))
    out.mkdir(parents=True, exist_ok=True)
    return [plot_learning(runs, out), plot_throughput(runs, out)]

