"""The supervisor as the tuning loop's host (tuning.py's `TuningHost`): the counters the
tuner's windows are made of, and a new setting carried to the config and the running services.
Also the start plan's choices, published as `plan` events. A base class of Supervisor."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any
from collections.abc import Callable

from spreeze.common.config import Config, with_learner_setting
from spreeze.proto.names import LEARNER_ROLES, REPLAY, SAMPLER
from spreeze.services.supervisor.probe import Choice, cpu_seconds, host_cpu
from spreeze.services.supervisor.processes import Child
from spreeze.services.supervisor.progress import Progress
from spreeze.services.supervisor.samplers import SamplerPool
from spreeze.services.supervisor.tuner import Setting
from spreeze.services.supervisor.tuning import Sample

BUS_WAIT = 5.0  # seconds to wait for the metrics bus to carry a first record before publishing the plan


class TuningHostPart:
    """What the tuning loop reads from and does through the supervisor, and what that uses of it."""

    cfg: Config
    children: dict[str, Child]
    samplers: SamplerPool
    progress: Progress
    learner_id: str  # the learner whose updates count
    plan: list[Choice]  # the start plan's choices
    emit: Callable[[str, str, dict[str, Any]], None]  # an event: console, log, dashboard
    set_all: Callable[[tuple[str, ...], str, Any], None]  # a `set` to every running service of some roles
    write_roster: Callable[[], None]  # run_dir/services.json

    async def announce_plan(self) -> None:
        """Publish the start plan's choices as `plan` events, once the metrics bus carries records."""
        deadline = time.monotonic() + BUS_WAIT
        while not self.progress.latest and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # events sent before the bus carries anything may be dropped
        for choice in self.plan:
            self.emit("plan", choice.describe(), {"key": choice.key, "value": choice.value})

    def read(self) -> Sample | None:
        """The counters the tuner's windows are made of; None until the learner and replay reported."""
        p = self.progress
        learner, replay = p.latest.get(self.learner_id), p.latest.get(REPLAY)
        if learner is None or replay is None:
            return None
        cpu = {}
        for sid, child in self.children.items():
            used = cpu_seconds(child.proc.pid) if child.alive else None  # type: ignore[union-attr]
            if used is not None:
                cpu[sid] = used
        return Sample(time.monotonic(), float(learner.get("updates", 0)), p.arrived[self.learner_id],
                      float(replay.get("inserted", 0)), float(replay.get("insert_stall_s", 0.0)),
                      float(replay.get("sample_stall_s", 0.0)), p.arrived[REPLAY], cpu, host_cpu()[0])

    async def apply(self, new: Setting) -> None:
        """Run with `new` from now on: the config follows (restarted and new services get it),
        `set` commands carry it to the running services, samplers are started or retired."""
        cfg = self.cfg
        old = Setting(cfg.sampler.num_samplers, cfg.sampler.envs_per_sampler, cfg.learner.batch_size,
                      cfg.learner.batches_per_request)
        cfg = dataclasses.replace(cfg, sampler=dataclasses.replace(
            cfg.sampler, num_samplers=new.samplers, envs_per_sampler=new.envs))
        cfg = with_learner_setting(cfg, "batch_size", new.batch, "supervisor")
        self.cfg = with_learner_setting(cfg, "batches_per_request", new.bpr, "supervisor")
        if new.batch != old.batch:
            self.set_all((REPLAY, *LEARNER_ROLES), "batch_size", new.batch)
        if new.bpr != old.bpr:
            self.set_all((REPLAY, *LEARNER_ROLES), "batches_per_request", new.bpr)
        if new.envs != old.envs:
            self.set_all((SAMPLER,), "envs_per_sampler", new.envs)
        for _ in range(new.samplers - old.samplers):
            self.samplers.add()
        for _ in range(old.samplers - new.samplers):
            self.samplers.retire()
        if new.samplers < old.samplers:
            self.write_roster()
