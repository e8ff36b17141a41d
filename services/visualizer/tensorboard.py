"""TensorBoard event files in run_dir/tensorboard, written with PyTorch's standard SummaryWriter.

Every point the dashboard draws becomes a scalar tagged ``<chart>/<label>`` (e.g.
``eval_steps/return``) at the run's env-step count; events become text entries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spreeze.common.metric_series import MetricSeries

FLUSH_SECS = 5  # TensorBoard shows a live run with at most this delay


class TensorBoardWriter:
    def __init__(self, log_dir: Path, series: MetricSeries) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        self.writer = SummaryWriter(log_dir=str(log_dir), flush_secs=FLUSH_SECS)
        self.series = series  # its env-step count is the step of every scalar

    def scalar(self, name: str, point: list[float]) -> None:
        """A MetricSeries listener: live points only (a restarted visualizer does not rewrite history)."""
        self.writer.add_scalar(name.replace(":", "/"), point[1], global_step=self.series.step_of(name, point))

    def event(self, row: dict[str, Any]) -> None:
        self.writer.add_text("events", f"{row.get('event')}: {row.get('reason')}", global_step=self.series.env_steps)

    def close(self) -> None:
        self.writer.close()
