"""Weights & Biases logging (``visualizer.wandb=true``), beside the TensorBoard event files.

Every point the dashboard draws becomes a W&B metric named ``<chart>/<label>`` (as in
TensorBoard) against the run's env-step count (``env_steps``, W&B's step metric for all of
them); the run config goes in as the W&B run's config. The W&B run id is kept in
run_dir/wandb-run-id, so a restarted visualizer and a resumed run go on logging into the same
W&B run. ``wandb_mode=offline`` writes under run_dir/wandb for a later ``wandb sync``.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any, Literal

from spreeze.common.config import Config, to_dict
from spreeze.common.metric_series import MetricSeries

log = logging.getLogger(__name__)

ID_FILE = "wandb-run-id"  # in the run directory: the W&B run this run logs into


class WandbLogger:
    def __init__(self, cfg: Config, run_dir: Path, series: MetricSeries) -> None:
        import wandb  # the optional package (spreeze[wandb]); Config.validate checked it is there

        vc = cfg.visualizer
        id_file = run_dir / ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
        id_file.write_text(run_id + "\n")
        self.series = series  # its env-step count is the step of every scalar
        mode: Literal["online", "offline"] = "offline" if vc.wandb_mode == "offline" else "online"
        self.run = wandb.init(project=vc.wandb_project, entity=vc.wandb_entity or None, id=run_id,
                              name=run_dir.name, resume="allow", dir=str(run_dir), mode=mode,
                              config=to_dict(cfg))
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")
        self.events: list[list[Any]] = []  # [env_steps, event, reason]: the run's "events" table
        log.info("logging to Weights & Biases: project %s, run %s (%s)", vc.wandb_project, run_id, vc.wandb_mode)

    def scalar(self, name: str, point: list[float]) -> None:
        """A MetricSeries listener: live points only (a restarted visualizer does not rewrite history)."""
        self.run.log({name.replace(":", "/"): point[1], "env_steps": self.series.step_of(name, point)})

    def event(self, row: dict[str, Any]) -> None:
        """Restarts, tuning, plans and the other events, as the rows of the run's "events" table."""
        import wandb

        self.events.append([self.series.env_steps, str(row.get("event")), str(row.get("reason"))])
        table = wandb.Table(columns=["env_steps", "event", "reason"], data=self.events)
        self.run.log({"events": table, "env_steps": self.series.env_steps})

    def close(self) -> None:
        self.run.finish()
