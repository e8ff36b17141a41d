"""What a learner checkpoint was made for, so that a run refuses one it cannot load.

A learner writes, beside each checkpoint (checkpoints/<role>.pt), a small JSON file
(<role>.made-for.json) of the settings that fix the networks' shapes and meaning: env,
algorithm, the algorithm's section and the sparse section. `spreeze train --resume` compares them with the run's config
before anything starts (no torch needed), and a learner compares the config saved inside a
checkpoint before loading it; either names every differing key in one ConfigError instead
of failing deep inside a state-dict load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spreeze.common.algorithms import algorithm
from spreeze.common.config import Config, to_dict
from spreeze.common.errors import ConfigError


def made_for(config: dict[str, Any]) -> dict[str, Any]:
    """The shape-fixing part of a config (as `to_dict` gives it): its algorithm's section is
    the one named after the algorithm (``algo`` may be a module path)."""
    algo = config.get("algo")
    try:
        section = algorithm(str(algo)).name
    except ValueError:  # an algorithm this process cannot import: its `algo` differs anyway
        section = str(algo)
    return {"env": config.get("env"), "algo": algo, section: config.get(section),
            "sparse": config.get("sparse")}


SIDECAR = ".made-for.json"


def sidecar(checkpoint: Path) -> Path:
    """The JSON file beside a checkpoint that says what it was made for."""
    return checkpoint.with_name(checkpoint.stem + SIDECAR)


def write_sidecar(checkpoint: Path, cfg: Config) -> None:
    tmp = checkpoint.with_name(f".{checkpoint.stem}{SIDECAR}.tmp")
    tmp.write_text(json.dumps(made_for(to_dict(cfg)), sort_keys=True))
    tmp.replace(sidecar(checkpoint))


def differences(saved: Any, current: Any, prefix: str = "") -> list[str]:
    """``key: checkpoint X, this run Y`` for every leaf that differs."""
    if isinstance(saved, dict) and isinstance(current, dict):
        return [line for key in sorted(set(saved) | set(current), key=str)
                for line in differences(saved.get(key), current.get(key), f"{prefix}{key}.")]
    if saved != current and not (isinstance(saved, list) and isinstance(current, list)
                                 and list(saved) == list(current)):
        return [f"{prefix.rstrip('.')}: checkpoint {saved!r}, this run {current!r}"]
    return []


def check_made_for(what: str, saved: dict[str, Any], cfg: Config) -> None:
    """Refuse a checkpoint (``what`` names it) whose `made_for` settings differ from ``cfg``'s."""
    diff = differences(saved, made_for(to_dict(cfg)))
    if diff:
        raise ConfigError(f"{what} was made for other networks than this run's: {'; '.join(diff)}. "
                          "Resume it with the settings it was made with, or start a new run")


def check_run_checkpoints(cfg: Config, checkpoints: Path) -> None:
    """Before a resumed run starts: every learner checkpoint's JSON file against ``cfg``."""
    for path in sorted(checkpoints.glob(f"*{SIDECAR}")):
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} cannot be read: {exc}") from None
        if not isinstance(saved, dict):
            raise ConfigError(f"{path} is not a JSON object")
        check_made_for(str(path.with_name(path.name.removesuffix(SIDECAR) + ".pt")), saved, cfg)
