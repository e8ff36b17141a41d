"""The supervisor as the tuning loop's host (tuning.py's `TuningHost`): the counters the
tuner's windows are made of, and a new setting carried to the config and the running services.
Also the start plan's choices, published as `plan` events."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING, Any

from spreeze.common.config import with_learner_setting
from spreeze.proto.names import LEARNER_ROLES, REPLAY, SAMPLER
from spreeze.services.supervisor.probe import cpu_seconds, host_cpu
from spreeze.services.supervisor.tuner import Setting
from spreeze.services.supervisor.tuning import Sample

if TYPE_CHECKING:
    from spreeze.services.supervisor.main import Supervisor

BUS_WAIT = 5.0  # seconds to wait for the metrics bus to carry a first record before publishing the plan


async def announce_plan(sup: Supervisor) -> None:
    """Publish the start plan's choices as `plan` events, once the metrics bus carries records."""
    deadline = time.monotonic() + BUS_WAIT
    while not sup.progress.latest and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # events sent before the bus carries anything may be dropped
    for choice in sup.plan:
        sup.emit("plan", choice.describe(), {"key": choice.key, "value": choice.value})


class SupervisorHost:
    """What the tuning loop reads from and does through the supervisor."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def emit(self, kind: str, reason: str, data: dict[str, Any]) -> None:
        self.sup.emit(kind, reason, data)

    def read(self) -> Sample | None:
        """The counters the tuner's windows are made of; None until the learner and replay reported."""
        sup, p = self.sup, self.sup.progress
        learner, replay = p.latest.get(sup.learner_id), p.latest.get(REPLAY)
        if learner is None or replay is None:
            return None
        cpu = {}
        for sid, child in sup.children.items():
            used = cpu_seconds(child.proc.pid) if child.alive else None  # type: ignore[union-attr]
            if used is not None:
                cpu[sid] = used
        return Sample(time.monotonic(), float(learner.get("updates", 0)), p.arrived[sup.learner_id],
                      float(replay.get("inserted", 0)), float(replay.get("insert_stall_s", 0.0)),
                      float(replay.get("sample_stall_s", 0.0)), p.arrived[REPLAY], cpu, host_cpu()[0])

    async def apply(self, new: Setting) -> None:
        """Run with `new` from now on: the config follows (restarted and new services get it),
        `set` commands carry it to the running services, samplers are started or retired."""
        sup = self.sup
        cfg = sup.cfg
        old = Setting(cfg.sampler.num_samplers, cfg.sampler.envs_per_sampler, cfg.learner.batch_size,
                      cfg.learner.batches_per_request)
        cfg = dataclasses.replace(cfg, sampler=dataclasses.replace(
            cfg.sampler, num_samplers=new.samplers, envs_per_sampler=new.envs))
        cfg = with_learner_setting(cfg, "batch_size", new.batch, "supervisor")
        sup.cfg = with_learner_setting(cfg, "batches_per_request", new.bpr, "supervisor")
        if new.batch != old.batch:
            sup.set_all((REPLAY, *LEARNER_ROLES), "batch_size", new.batch)
        if new.bpr != old.bpr:
            sup.set_all((REPLAY, *LEARNER_ROLES), "batches_per_request", new.bpr)
        if new.envs != old.envs:
            sup.set_all((SAMPLER,), "envs_per_sampler", new.envs)
        for _ in range(new.samplers - old.samplers):
            sup.samplers.add()
        for _ in range(old.samplers - new.samplers):
            sup.samplers.retire()
        if new.samplers < old.samplers:
            sup.write_roster()
