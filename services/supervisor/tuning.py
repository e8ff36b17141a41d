"""The supervisor's tuning task: measure windows, ask the tuner, have the supervisor apply it.

`TuningLoop(host, cfg, pinned).run()` is one task of `Supervisor.run`. It repeats: wait
`tune_window` seconds and read the counters (learner updates, replay inserts and stall
seconds, CPU seconds of every child, the host's idle time), make a `Window` of the two
readings, pass it to the `Tuner`, and have the host apply what it decides, publishing each
decision as a `tune` event. After a change it waits `tune_settle` seconds before the next
window starts.

The loop talks to the supervisor through `TuningHost` only (read the counters, apply a
setting, emit an event): the supervisor alone changes the run's config and tells the
services (Supervisor.apply).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol

from spreeze.common.config import Config
from spreeze.services.supervisor.tuner import KNOB_KEYS, Bounds, Setting, Tuner, Window

log = logging.getLogger(__name__)

FIRST_UPDATE_POLL = 0.5  # seconds between looks for the learners' first update


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


class TuningHost(Protocol):
    """What the tuning loop needs from the supervisor."""

    def read(self) -> Sample | None:
        """The counters now; None until the learner and replay have reported."""

    async def apply(self, setting: Setting) -> None:
        """Run with `setting` from now on (the run's config follows)."""

    def emit(self, kind: str, reason: str, data: dict[str, Any]) -> None:
        """Publish an event with its reason."""


def window_between(a: Sample, b: Sample, batch: int) -> Window | None:
    """The window from `a` to `b`, or None when a counter did not move on."""
    dt_l, dt_r, dt = b.updates_at - a.updates_at, b.replay_at - a.replay_at, b.wall - a.wall
    if dt_l <= 0 or dt_r <= 0 or dt <= 0:
        return None
    updates, inserted = b.updates - a.updates, b.inserted - a.inserted
    cpu = {sid: (b.cpu[sid] - a.cpu[sid]) / dt for sid in b.cpu if sid in a.cpu}
    return Window(frame_rate=updates / dt_l * batch, sampling_hz=inserted / dt_r,
                  update_to_data=updates / inserted if inserted > 0 else 0.0,
                  insert_stall=(b.insert_stall_s - a.insert_stall_s) / dt_r,
                  sample_stall=(b.sample_stall_s - a.sample_stall_s) / dt_r,
                  idle_cores=(b.host_idle - a.host_idle) / dt, cpu=cpu, host_cores=os.cpu_count() or 0)


class TuningLoop:
    def __init__(self, host: TuningHost, cfg: Config, pinned: frozenset[str]) -> None:
        """`cfg`: the run's config at the start; `pinned`: config keys the user set (never tuned)."""
        self.host = host
        sc = self.sc = cfg.supervisor
        self.setting = Setting(cfg.sampler.num_samplers, cfg.sampler.envs_per_sampler, cfg.learner.batch_size,
                               cfg.learner.batches_per_request)
        bounds = Bounds(max_samplers=sc.max_samplers or len(os.sched_getaffinity(0)),
                        max_envs=sc.max_envs_per_sampler, min_batch=sc.min_batch_size, max_batch=sc.max_batch_size,
                        max_bpr=sc.max_batches_per_request)
        knobs = frozenset(k for k, key in KNOB_KEYS.items() if key in pinned)
        if not sc.tune_batch:  # the batch size changes what each update learns from: only when asked
            knobs |= {"batch"}
        self.tuner = Tuner(self.setting, bounds, knobs, cfg.replay.update_to_data, sc.tune_min_gain,
                           sc.tune_cooldown)

    async def run(self) -> None:
        try:
            await self.tune()
        except Exception as exc:  # a tuner bug must not stop the training: it goes on as set now
            log.exception("tuning stopped")
            self.host.emit("tune", f"tuning stopped by an error: {exc!r}; the run goes on with "
                           f"{self.setting.describe()}", {"action": "stopped", **dataclasses.asdict(self.setting)})

    async def tune(self) -> None:
        before: Sample | None = await self.first_update()
        while True:
            await asyncio.sleep(self.sc.tune_window)
            now = self.host.read()
            measured = window_between(before, now, self.setting.batch) if before and now else None
            before = now
            if measured is None:
                continue
            decisions = self.tuner.observe(measured, time.monotonic())
            for decision in decisions:
                self.host.emit("tune", decision.reason, {**decision.data(), **numbers(measured)})
            if decisions and decisions[-1].setting != self.setting:
                self.setting = decisions[-1].setting
                await self.host.apply(self.setting)
                await asyncio.sleep(self.sc.tune_settle)
                before = self.host.read()

    async def first_update(self) -> Sample:
        """The first reading once the learners update: windows before that measure nothing."""
        while True:
            got = self.host.read()
            if got is not None and got.updates > 0:
                return got
            await asyncio.sleep(FIRST_UPDATE_POLL)


def numbers(w: Window) -> dict[str, float]:
    """A window's numbers for an event (rounded)."""
    return {"frame_rate": round(w.frame_rate, 1), "score": round(w.score, 1), "sampling_hz": round(w.sampling_hz, 1),
            "update_to_data": round(w.update_to_data, 3), "insert_stall": round(w.insert_stall, 3),
            "sample_stall": round(w.sample_stall, 3), "idle_cores": round(w.idle_cores, 2)}
