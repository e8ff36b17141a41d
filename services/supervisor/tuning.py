"""The supervisor's tuning task: measure windows, ask the tuner, apply its decisions.

`TuningLoop(supervisor, pinned).run()` is one task of `Supervisor.run`. It first publishes
the start plan's choices as `plan` events, then repeats: wait `tune_window` seconds and
read the counters (learner updates, replay inserts and stall seconds, CPU seconds of every
child, the host's idle time), make a `Snapshot`, pass it to the `Tuner`, and carry out
what it decides (actuators below), publishing each decision as a `tune` event. After a
change it waits `tune_settle` seconds before the next window starts.

Actuators: batch size -> `set batch_size` to the learners and replay (its rate limiter);
envs per sampler -> `set envs_per_sampler` to every sampler; sampler count -> start a new
sampler process, or retire the newest one (a `shutdown` command: it flushes and leaves).
The supervisor's config follows every change, so restarted and new services get it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.supervisor.probe import Choice, cpu_seconds, host_cpu
from services.supervisor.tuner import KNOB_KEYS, Bounds, Setting, Snapshot, Tuner

if TYPE_CHECKING:
    from services.supervisor.main import Supervisor

log = logging.getLogger(__name__)

BUS_WAIT = 5.0  # seconds to wait for the metrics bus to carry a first record before publishing the plan
FIRST_UPDATE_POLL = 0.5  # seconds between looks for the learners' first update
LEARNER_ROLES = ("learner", "critic_learner", "actor_learner")


@dataclass(frozen=True)
class Sample:
    """Counters at one moment (arrival times of the metrics records that carried them)."""

    wall: float
    updates: float
    updates_at: float
    inserted: float
    insert_stall_s: float
    sample_stall_s: float
    replay_at: float
    cpu: dict[str, float]
    host_idle: float


def snapshot(a: Sample, b: Sample, batch: int) -> Snapshot | None:
    """The window from `a` to `b`, or None when a counter did not move on."""
    dt_l, dt_r, dt = b.updates_at - a.updates_at, b.replay_at - a.replay_at, b.wall - a.wall
    if dt_l <= 0 or dt_r <= 0 or dt <= 0:
        return None
    updates, inserted = b.updates - a.updates, b.inserted - a.inserted
    cpu = {sid: (b.cpu[sid] - a.cpu[sid]) / dt for sid in b.cpu if sid in a.cpu}
    return Snapshot(frame_rate=updates / dt_l * batch, sampling_hz=inserted / dt_r,
                    update_to_data=updates / inserted if inserted > 0 else 0.0,
                    insert_stall=(b.insert_stall_s - a.insert_stall_s) / dt_r,
                    sample_stall=(b.sample_stall_s - a.sample_stall_s) / dt_r,
                    idle_cores=(b.host_idle - a.host_idle) / dt, cpu=cpu, host_cores=os.cpu_count() or 0)


class TuningLoop:
    def __init__(self, sup: Supervisor, pinned: frozenset[str], plan: list[Choice]) -> None:
        self.sup, self.plan = sup, plan
        sc, cfg = sup.cfg.supervisor, sup.cfg
        self.setting = Setting(cfg.sampler.num_samplers, cfg.sampler.envs_per_sampler, cfg.learner.batch_size)
        bounds = Bounds(max_samplers=sc.max_samplers or len(os.sched_getaffinity(0)),
                        max_envs=sc.max_envs_per_sampler, min_batch=sc.min_batch_size, max_batch=sc.max_batch_size)
        knobs = frozenset(k for k, key in KNOB_KEYS.items() if key in pinned)
        self.tuner = Tuner(self.setting, bounds, knobs, cfg.replay.update_to_data, sc.tune_min_gain,
                           sc.tune_cooldown)
        self.learner_id = "learner" if cfg.learner.mode == "fused" else "critic_learner"

    async def run(self) -> None:
        await self.announce_plan()
        if not self.sup.cfg.supervisor.tune:
            return
        try:
            await self.tune()
        except Exception as exc:  # a tuner bug must not stop the training: it goes on as set now
            log.exception("tuning stopped")
            self.sup.emit("tune", f"tuning stopped by an error: {exc!r}; the run goes on with "
                          f"{self.setting.describe()}", {"action": "stopped", **dataclasses.asdict(self.setting)})

    async def tune(self) -> None:
        sc = self.sup.cfg.supervisor
        before = await self.first_update()
        while True:
            await asyncio.sleep(sc.tune_window)
            now = self.sample()
            snap = snapshot(before, now, self.setting.batch) if before and now else None
            before = now
            if snap is None:
                continue
            decisions = self.tuner.observe(snap, time.monotonic())
            for decision in decisions:
                self.sup.emit("tune", decision.reason, {**decision.data(), **numbers(snap)})
            if decisions and decisions[-1].setting != self.setting:
                await self.change(decisions[-1].setting)
                await asyncio.sleep(sc.tune_settle)
                before = self.sample()

    async def first_update(self) -> Sample:
        """The first sample once the learners update: windows before that measure nothing."""
        while True:
            got = self.sample()
            if got is not None and got.updates > 0:
                return got
            await asyncio.sleep(FIRST_UPDATE_POLL)

    async def announce_plan(self) -> None:
        deadline = time.monotonic() + BUS_WAIT
        while not self.sup.progress.latest and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # events sent before the bus carries anything may be dropped
        for choice in self.plan:
            self.sup.emit("plan", f"{choice.key}={choice.value}: {choice.reason}",
                          {"key": choice.key, "value": choice.value})

    # ------------------------------------------------------------------ measuring
    def sample(self) -> Sample | None:
        p = self.sup.progress
        learner, replay = p.latest.get(self.learner_id), p.latest.get("replay")
        if learner is None or replay is None:
            return None
        cpu = {}
        for sid, child in self.sup.children.items():
            used = cpu_seconds(child.proc.pid) if child.alive else None  # type: ignore[union-attr]
            if used is not None:
                cpu[sid] = used
        return Sample(time.monotonic(), float(learner.get("updates", 0)), p.arrived[self.learner_id],
                      float(replay.get("inserted", 0)), float(replay.get("insert_stall_s", 0.0)),
                      float(replay.get("sample_stall_s", 0.0)), p.arrived["replay"], cpu, host_cpu()[0])

    # ------------------------------------------------------------------ actuators
    async def change(self, new: Setting) -> None:
        old, self.setting = self.setting, new
        sup = self.sup
        cfg = sup.cfg
        sup.cfg = dataclasses.replace(
            cfg, sampler=dataclasses.replace(cfg.sampler, num_samplers=new.samplers, envs_per_sampler=new.envs),
            learner=dataclasses.replace(cfg.learner, batch_size=new.batch))
        if new.batch != old.batch:
            await self.set_all(("replay", *LEARNER_ROLES), "batch_size", new.batch)
        if new.envs != old.envs:
            await self.set_all(("sampler",), "envs_per_sampler", new.envs)
        for _ in range(new.samplers - old.samplers):
            sup.add_sampler()
        for _ in range(old.samplers - new.samplers):
            await sup.retire_sampler()

    async def set_all(self, roles: tuple[str, ...], key: str, value: Any) -> None:
        for child in list(self.sup.children.values()):
            if child.spec.role in roles and child.registered and child.alive:
                await self.sup.command(child, "set", key, value)


def numbers(snap: Snapshot) -> dict[str, float]:
    """A snapshot's numbers for an event (rounded)."""
    return {"frame_rate": round(snap.frame_rate, 1), "score": round(snap.score, 1), "sampling_hz": round(snap.sampling_hz, 1),
            "update_to_data": round(snap.update_to_data, 3), "insert_stall": round(snap.insert_stall, 3),
            "sample_stall": round(snap.sample_stall, 3), "idle_cores": round(snap.idle_cores, 2)}
