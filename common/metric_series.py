"""Chart series from the metrics bus: the one place that turns metrics into points.

The visualizer feeds it live messages and `spreeze plot` feeds it a finished run's
metrics.jsonl. Both go through `take(row)` with the rows the supervisor writes to
metrics.jsonl (`message_row` makes one from a live message), so the live page,
TensorBoard and the PNG plots show the same numbers.

A series is named ``"<chart>:<label>"``; each point is ``[x, y]`` or ``[x, y, std]``.
Time axes are seconds since the run started (the rows' ``wall_time``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from spreeze.proto.messages import EvalResult, Event, Message, Metrics
from spreeze.proto.names import LEARNER_ROLES

LAGS = ("policy_lag", "critic_lag")
SPARSE_PREFIXES = ("sparsity/", "flops_ratio/")
STALLS = ("insert_stall_s", "sample_stall_s")
RATE_WINDOW = 2.0  # seconds: rates over shorter spans only show the batching of pushes and reports
# Bounds (a run of days keeps a dashboard's memory flat): a series over MAX_POINTS keeps every
# second point (its shape over the whole run, at half the density), the events over MAX_EVENTS
# their newest half. Each time, `generation` counts up: an open page is sent everything anew.
MAX_POINTS = 2000
MAX_EVENTS = 2000

Point = list[float]
Listener = Callable[[str, Point], None]


def message_row(msg: Message, wall_time: float) -> dict[str, Any] | None:
    """The metrics.jsonl row of a bus message (as services/supervisor/progress.py writes it)."""
    if isinstance(msg, Metrics):
        return {"kind": "metrics", "wall_time": wall_time, "service": msg.service, **msg.values}
    if isinstance(msg, EvalResult):
        return {"kind": "eval", "wall_time": wall_time, "env_steps": msg.env_steps, "updates": msg.updates,
                "return_mean": msg.return_mean, "return_std": msg.return_std, "length_mean": msg.length_mean,
                "episodes": msg.episodes, "actor_version": msg.actor_version}
    if isinstance(msg, Event):
        return {"kind": "event", "wall_time": wall_time, "event": msg.kind, "reason": msg.reason, **msg.data}
    return None


def role_of(service_id: str) -> str:
    """"sampler-3" -> "sampler"; "replay" -> "replay"."""
    return service_id.split("-", 1)[0]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class MetricSeries:
    """Points of every chart, the events, and when each service was last heard of."""

    def __init__(self, replay_capacity: int = 0, rate_window: float = RATE_WINDOW, max_points: int = MAX_POINTS,
                 max_events: int = MAX_EVENTS) -> None:
        self.replay_capacity = replay_capacity  # for the replay fill fraction (0: not shown)
        self.rate_window = rate_window
        self.max_points, self.max_events = max_points, max_events
        self.generation = 0  # counts the thinnings: what was sent of the points and events before is void
        self.points: dict[str, list[Point]] = {}
        self.events: list[dict[str, Any]] = []
        self.last_seen: dict[str, float] = {}  # service id -> wall_time of its newest metrics
        self.learners: dict[str, dict[str, Any]] = {}  # learner service id -> its newest metrics
        self.env_steps = 0  # env steps seen by replay, newest
        self.updates = 0  # (critic) gradient updates, newest
        self.listeners: list[Listener] = []
        self._rate_from: tuple[float, int, int] | None = None  # (wall_time, env_steps, updates)

    def add(self, name: str, *point: float) -> None:
        p = [float(v) for v in point]
        if not all(math.isfinite(v) for v in p):
            return  # a diverged loss is not drawable (and not valid JSON)
        series = self.points.setdefault(name, [])
        series.append(p)
        if len(series) > self.max_points:
            series[:] = series[::2] if len(series) % 2 else series[1::2]  # the newest point stays
            self.generation += 1
        for listener in self.listeners:
            listener(name, p)

    def step_of(self, name: str, point: Point) -> int:
        """The env-step count a point belongs to (the x of env-step charts, else the newest count):
        the step of TensorBoard's and W&B's scalars."""
        return int(point[0]) if name.split(":", 1)[0] == "eval_steps" else self.env_steps

    def take(self, row: dict[str, Any]) -> None:
        kind, t = row.get("kind"), _number(row.get("wall_time"))
        if t is None:
            return
        if kind == "metrics" and isinstance(row.get("service"), str):
            self._metrics(row["service"], t, row)
        elif kind == "eval":
            mean, std, steps = (_number(row.get(k)) for k in ("return_mean", "return_std", "env_steps"))
            if mean is not None and steps is not None:
                self.add("eval_steps:return", steps, mean, std or 0.0)
                self.add("eval_time:return", t, mean, std or 0.0)
        elif kind == "event":
            self.events.append(row)
            if len(self.events) > self.max_events:
                del self.events[:len(self.events) - self.max_events // 2]
                self.generation += 1

    # ------------------------------------------------------------ per role
    def _metrics(self, service: str, t: float, values: dict[str, Any]) -> None:
        self.last_seen[service] = t
        role = role_of(service)
        if role == "replay":
            self._replay(t, values)
        elif role in LEARNER_ROLES:
            self.learners[service] = values
            self._learner(service, role, t, values)
        elif role == "sampler" and (ret := _number(values.get("episode_return"))) is not None:
            self.add(f"train_return:{service}", t, ret)

    def _replay(self, t: float, values: dict[str, Any]) -> None:
        inserted, size = _number(values.get("inserted")), _number(values.get("replay_size"))
        if inserted is not None:
            self.env_steps = int(inserted)
        if size is not None and self.replay_capacity > 0:
            self.add("replay:fill", t, size / self.replay_capacity)
        for key in STALLS:
            if (v := _number(values.get(key))) is not None:
                self.add(f"stalls:{key}", t, v)
        if inserted is None:
            return
        if self._rate_from is None or self.env_steps < self._rate_from[1]:  # first report, or a new replay
            self._rate_from = (t, self.env_steps, self.updates)
            return
        t0, s0, u0 = self._rate_from
        if t - t0 >= self.rate_window and t > t0:
            self.add("sampling:env steps/s", t, (self.env_steps - s0) / (t - t0))
            if self.env_steps > s0:
                self.add("utd:update-to-data", t, (self.updates - u0) / (self.env_steps - s0))
            self._rate_from = (t, self.env_steps, self.updates)

    def _learner(self, service: str, role: str, t: float, values: dict[str, Any]) -> None:
        updates = _number(values.get("updates"))
        if updates is None:
            return
        if role != "actor_learner":  # the critic's count is the run's update count
            self.updates = int(updates)
        if (rate := _number(values.get("update_frame_rate"))) is not None:
            self.add(f"updates:{service}", t, rate)
        for key, value in values.items():
            v = _number(value)
            if v is None:
                continue
            if key.endswith("loss") or key == "alpha":
                self.add(f"losses:{key}", updates, v)
            elif key in LAGS:
                self.add(f"lag:{key}", t, v)
            elif key.startswith(SPARSE_PREFIXES):
                self.add(f"sparsity:{key}", updates, v)
            elif key.startswith("topology/"):
                self.add(f"topology:{key.removeprefix('topology/')}", updates, v)
