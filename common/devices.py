"""The learners' torch devices checked against the CUDA devices a host has, before anything starts.

`checked_devices(cfg, gpus)` is the one place where `learner.actor_device` and
`learner.critic_device` meet the hardware: a CUDA device the host lacks is refused by
name (a ConfigError, so `spreeze train` and the benches stop before a learner could
crash-loop on it), and an index-less `cuda` becomes `cuda:0`, so that every process of
the run, and the plan, mean the same device. `auto` is left to each learner (compose: a
learner container may see a GPU its supervisor does not).
"""

from __future__ import annotations

import dataclasses

from spreeze.common.config import Config
from spreeze.common.errors import ConfigError

def checked_device(key: str, value: str, gpus: int) -> str:
    """`value` of learner.<key> as the run uses it on a host with `gpus` CUDA devices."""
    if value in ("cpu", "auto"):
        return value
    kind, _, index = value.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ConfigError(f"learner.{key}={value!r} must be cpu, cuda, cuda:N or auto")
    if gpus == 0:
        raise ConfigError(f"learner.{key}={value!r} names a CUDA device, but this host has none "
                          f"(set learner.{key}=cpu, or auto)")
    if not index:
        return "cuda:0"
    if int(index) >= gpus:
        raise ConfigError(f"learner.{key}={value!r} is beyond this host's {gpus} CUDA device"
                          f"{'s' if gpus > 1 else ''} (cuda:0..cuda:{gpus - 1})")
    return value


def checked_devices(cfg: Config, gpus: int) -> Config:
    """`cfg` with both learner devices checked against `gpus` CUDA devices (ConfigError naming
    the key and value when the host lacks one) and index-less `cuda` made `cuda:0`."""
    lc = cfg.learner
    return dataclasses.replace(cfg, learner=dataclasses.replace(
        lc, actor_device=checked_device("actor_device", lc.actor_device, gpus),
        critic_device=checked_device("critic_device", lc.critic_device, gpus)))
