"""Starting a run: plan it on the hardware, prepare its run directory, run the supervisor.

`spreeze train` resolves the config (a new run, or a resumed one) and calls `start`; what
happens between a config and the first service process is here, in order.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import yaml

from spreeze.common.checkpoint_files import check_checkpoints
from spreeze.common.checkpoint_spec import check_run_checkpoints
from spreeze.common.config import Config, check_budget, to_dict
from spreeze.common.devices import checked_devices
from spreeze.common.envs import env_spec, task_facts
from spreeze.common.errors import ConfigError
from spreeze.services.supervisor import probe
from spreeze.services.supervisor.main import Supervisor

RUN_STATE = ("checkpoints", "replay")  # what a started run leaves in its run directory


def start(cfg: Config, pinned: frozenset[str], resumed: bool, quiet: bool) -> int:
    """Train until the budget is spent (0) or the run fails (1). `pinned`: config keys the
    user set (the plan and the tuner keep them); a resumed run keeps its saved config."""
    hardware = probe.probe()
    cfg, choices = planned(cfg, pinned, hardware, resumed)
    check_run_dir(cfg, resumed)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    logging.basicConfig(filename=run_dir / "supervisor.log", level=logging.INFO,
                        format="%(asctime)s supervisor %(levelname)s %(name)s: %(message)s")
    logging.raiseExceptions = False  # a full disk: no traceback per log line on the console (said once instead)
    verb = "resuming" if resumed else "training"
    print(f"spreeze: {verb} {cfg.algo} on {cfg.env} for {cfg.total_steps:,} env steps; run dir {run_dir}",
          flush=True)
    print(f"spreeze: hardware: {hardware.describe()}", flush=True)
    logging.getLogger(__name__).info("hardware: %s; pinned by the user: %s", hardware.describe(),
                                     ", ".join(sorted(pinned)) or "nothing")
    return asyncio.run(Supervisor(cfg, quiet=quiet, pinned=pinned, plan=choices).run())


def run_state(run_dir: Path) -> list[str]:
    """What of a started run the directory holds (empty: no run)."""
    return [name for name in RUN_STATE if (run_dir / name).is_dir() and any((run_dir / name).iterdir())]


def check_run_dir(cfg: Config, resumed: bool) -> None:
    """A new run needs a run directory that holds no run; a resumed one, checkpoints made for
    its networks. ConfigError saying which and what to do."""
    run_dir = Path(cfg.run_dir)
    started = run_state(run_dir)
    if started and not resumed:
        raise ConfigError(f"run directory {str(run_dir)!r} already holds a run ({', '.join(started)}): "
                          f"continue it with --resume {run_dir}, or choose another --run-dir")
    if resumed:
        check_run_checkpoints(cfg, run_dir / "checkpoints")  # refuse checkpoints of other networks now
        for note in check_checkpoints(run_dir / "checkpoints"):  # and ones that do not read back whole
            print(f"spreeze: {note}", flush=True)


def planned(cfg: Config, pinned: frozenset[str], hardware: probe.Hardware, resumed: bool = False
            ) -> tuple[Config, list[probe.Choice]]:
    """The config a run starts with on `hardware` and the plan's choices (none for a resumed
    run or with supervisor.auto off; `pinned` keys are kept), checked: env, learner devices,
    budget. `spreeze train` and `spreeze bench e2e` start from it."""
    layout, _, _ = env_spec(cfg.env_source)  # refuse unknown or discrete-action envs before anything starts
    if cfg.supervisor.mode != "hub":  # hub: the learners run elsewhere (containers), on their hosts' devices
        cfg = checked_devices(cfg, len(hardware.gpus))  # before the plan: it must not plan on a missing GPU
    auto = cfg.supervisor.auto and not resumed
    choices = probe.plan(hardware, cfg, pinned, layout.width * 4, task_facts(cfg.env_source)) if auto else []
    cfg = probe.apply(cfg, choices)
    if not resumed:  # (a resumed run is past its warm-up: a budget under it just ends the run at once)
        check_budget(cfg)  # after the plan: it may shorten the warm-up (tasks that end episodes early)
    return cfg, choices
