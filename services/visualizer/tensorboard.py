"""TensorBoard event files in run_dir/tensorboard, written with PyTorch's standard SummaryWriter.

Every point the dashboard draws becomes a scalar tagged ``<chart>/<label>`` (e.g.
``eval_steps/return``) at the run's env-step count; events become text entries.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spreeze.common.disk import DiskWrites, log_say
from spreeze.common.metric_series import MetricSeries

FLUSH_SECS = 5  # TensorBoard shows a live run with at most this delay
REOPEN_S = 10.0  # after a full disk broke the writer: seconds between tries of a fresh one


class TensorBoardWriter:
    """A full disk breaks a SummaryWriter for good (its writer thread keeps the error): the
    points are then dropped (metrics.jsonl keeps them all) and a fresh writer, a new event file
    in the same directory, is tried every REOPEN_S until the disk has room again."""

    def __init__(self, log_dir: Path, series: MetricSeries, disk: DiskWrites | None = None) -> None:
        self.log_dir = log_dir
        self.series = series  # its env-step count is the step of every scalar
        self.disk = disk or DiskWrites(log_say)
        self.writer: Any = None
        self.retry_at = 0.0
        self.open()

    def open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=FLUSH_SECS)

    def write(self, add: Callable[[Any], object]) -> None:
        if self.writer is None:
            if time.monotonic() < self.retry_at or not self.disk.attempt("tensorboard events", self.open):
                self.retry_at = max(self.retry_at, time.monotonic() + REOPEN_S)
                return
        if not self.disk.attempt("tensorboard events", lambda: add(self.writer)):
            with contextlib.suppress(Exception):  # (its thread holds the error: closing raises it again)
                self.writer.close()
            self.writer, self.retry_at = None, time.monotonic() + REOPEN_S

    def scalar(self, name: str, point: list[float]) -> None:
        """A MetricSeries listener: live points only (a restarted visualizer does not rewrite history)."""
        step = self.series.step_of(name, point)
        self.write(lambda w: w.add_scalar(name.replace(":", "/"), point[1], global_step=step))

    def event(self, row: dict[str, Any]) -> None:
        text, step = f"{row.get('event')}: {row.get('reason')}", self.series.env_steps
        self.write(lambda w: w.add_text("events", text, global_step=step))

    def close(self) -> None:
        if self.writer is not None:
            self.disk.attempt("tensorboard events", self.writer.close)
