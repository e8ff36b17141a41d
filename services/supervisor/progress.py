"""Run-wide numbers from the metrics bus: metrics.jsonl and the console progress line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from spreeze.common.compile_state import compile_state
from spreeze.common.disk import AppendOnly, DiskWrites, log_say
from spreeze.common.sparse_stats import combined_flops_ratio
from spreeze.proto.messages import EvalResult, Event, Message, Metrics
from spreeze.proto.names import LEARNER_ROLES


STALL_SHARE = 0.25  # no better evaluation for this share of the step budget ...
STALL_EVALS = 4  # ... over at least this many evaluations: the run is flagged as not learning
STALL_KNOBS = ("try a larger network (td3.hidden=[256,256] or sac.hidden=[256,256]), another random warm-up "
               "(sampler.warmup_steps: shorter where episodes end early, longer where they do not), "
               "a lower update-to-data ratio (replay.update_to_data=0.5), or another seed")


RATE_WEIGHT = 0.3  # weight of the newest window in the step rate behind "left": about 3 lines of memory


class StepRate:
    """The step rate the time-left estimate divides by: an exponential moving average over
    the progress lines' windows, so that one slow or fast window (a compile, a restart, a
    tuning change) moves the estimate a little instead of making it jump."""

    def __init__(self, weight: float = RATE_WEIGHT) -> None:
        self.weight = weight
        self.value = 0.0  # steps per second; 0 until the first window with steps

    def add(self, rate: float) -> float:
        """Take a window's rate; the smoothed rate. Windows before the first steps (start-up)
        do not count: they would only drag the first estimates out."""
        self.value = rate if self.value == 0.0 else self.weight * rate + (1 - self.weight) * self.value
        return self.value


class Progress:
    """Keeps the newest metrics per service and writes every record to metrics.jsonl."""

    def __init__(self, path: Path, total_steps: int, time_limit: float, disk: DiskWrites | None = None) -> None:
        self.updates_before = last_progress(path).get("updates", 0)  # a resumed run's earlier sessions made these
        self.file = AppendOnly(path, disk or DiskWrites(log_say))  # a full disk holds records back until it has room
        self.start = time.monotonic()
        self.total_steps, self.time_limit = total_steps, time_limit
        self.latest: dict[str, dict[str, Any]] = {}
        self.arrived: dict[str, float] = {}  # monotonic time each service's newest metrics arrived
        self.last_eval: EvalResult | None = None
        self.evals: list[EvalResult] = []
        self._window = (self.start, 0, 0)  # (time, env_steps, updates) at the last line
        self._seen = {"env_steps": 0, "updates": 0}  # highest counts so far: they never go back
        self.step_rate = StepRate()
        self.record("start", {"unix_time": time.time()})  # wall_time of every record counts from here

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def record(self, kind: str, values: dict[str, Any]) -> None:
        self.file.write(json.dumps({"kind": kind, "wall_time": round(self.elapsed, 3), **values}) + "\n")

    def take(self, msg: Message) -> None:
        if isinstance(msg, Metrics):
            self.latest[msg.service] = msg.values
            self.arrived[msg.service] = time.monotonic()
            self.record("metrics", {"service": msg.service, **msg.values})
        elif isinstance(msg, EvalResult):
            self.last_eval = msg
            self.evals.append(msg)
            self.record("eval", {"env_steps": msg.env_steps, "updates": msg.updates,
                                 "return_mean": msg.return_mean, "return_std": msg.return_std,
                                 "length_mean": msg.length_mean, "episodes": msg.episodes,
                                 "actor_version": msg.actor_version})
        elif isinstance(msg, Event):
            self.record("event", {"event": msg.kind, "reason": msg.reason, **msg.data})

    def forget(self, service_id: str) -> None:
        """A service left the run: its last numbers no longer count in the aggregates (rates);
        the run's counts keep what it reached."""
        self.latest.pop(service_id, None)

    def _high_water(self, name: str, now: int) -> int:
        self._seen[name] = max(self._seen[name], now)
        return self._seen[name]

    # ------------------------------------------------------------ aggregates
    def by_role(self, role: str) -> list[dict[str, Any]]:
        return [v for k, v in self.latest.items() if k == role or k.startswith(role + "-")]

    @property
    def env_steps(self) -> int:
        return self._high_water("env_steps", max((int(v.get("inserted", 0)) for v in self.by_role("replay")),
                                                 default=0))

    @property
    def updates(self) -> int:
        for role in ("learner", "critic_learner"):
            found = self.by_role(role)
            if found:
                return self._high_water("updates", int(found[0].get("updates", 0)))
        return self._seen["updates"]

    def sum_of(self, key: str, roles: tuple[str, ...]) -> float:
        return sum(float(v.get(key, 0.0)) for r in roles for v in self.by_role(r))

    def summary(self) -> dict[str, Any]:
        """Numbers of the progress line (rates over the time since the previous call)."""
        now, steps, updates = time.monotonic(), self.env_steps, self.updates
        t0, s0, u0 = self._window
        self._window = (now, steps, updates)
        dt = max(now - t0, 1e-9)
        out: dict[str, Any] = {
            "env_steps": steps, "updates": updates, "sampling_hz": (steps - s0) / dt,
            "update_frame_rate": self.sum_of("update_frame_rate", LEARNER_ROLES),
            "update_to_data": (updates - u0) / (steps - s0) if steps > s0 else 0.0,
            "elapsed": self.elapsed,
        }
        if self.last_eval is not None:
            out["eval_return"] = self.last_eval.return_mean
            out["eval_env_steps"] = self.last_eval.env_steps
        out["remaining"] = self.remaining(self.step_rate.add(out["sampling_hz"]))
        return out

    def remaining(self, step_rate: float) -> float | None:
        """Seconds until the sooner budget at `step_rate` steps/s: 0 once one is used up, None
        while neither can be told (no steps yet, no time limit)."""
        if self.env_steps >= self.total_steps:
            return 0.0
        left = []
        if step_rate > 0:
            left.append(max(self.total_steps - self.env_steps, 0) / step_rate)
        if self.time_limit > 0:
            left.append(max(self.time_limit - self.elapsed, 0.0))
        return min(left) if left else None

    def stall(self) -> str | None:
        """Why the run looks stuck (no better evaluation for a long stretch), with knobs to try;
        None while it improves or has too few evaluations to tell."""
        if len(self.evals) <= STALL_EVALS:
            return None
        best_at = max(range(len(self.evals)), key=lambda i: self.evals[i].return_mean)
        best, last = self.evals[best_at], self.evals[-1]
        stretch = last.env_steps - best.env_steps
        if len(self.evals) - 1 - best_at < STALL_EVALS or stretch < STALL_SHARE * self.total_steps:
            return None
        return (f"not learning: no evaluation better than {best.return_mean:.0f} (at {best.env_steps:,} env steps) "
                f"in the {stretch:,} env steps since; {STALL_KNOBS}")

    def line(self) -> str:
        s = self.summary()
        self.record("progress", s)
        ev = (f"{s['eval_return']:.0f} @{s['eval_env_steps'] / 1000:.0f}k" if "eval_return" in s else "-")
        rem = ("finishing" if s["env_steps"] >= self.total_steps else "?" if s["remaining"] is None
               else f"{s['remaining']:.0f}s")
        return (f"[{s['elapsed']:6.0f}s] steps {s['env_steps']:,}/{self.total_steps:,} | "
                f"updates {s['updates']:,} | sampling {s['sampling_hz']:,.0f} Hz | "
                f"update {s['update_frame_rate'] / 1000:,.1f}k fr/s | utd {s['update_to_data']:.2f} | "
                f"eval {ev} | left {rem}{self.compile_part()}{self.sparse_part()}{self.stall_part()}")

    def compile_part(self) -> str:
        """`` | compiling (cold, ~30s) 12s`` while a learner compiles its update steps in the
        background (the longest-running compile), then `` | compiled 31s, 1.8x eager`` (the
        slowest compile, the smallest gain); ``""`` without compiled steps."""
        learners = [v for role in LEARNER_ROLES for v in self.by_role(role)]
        running = [v for v in learners if v.get("compiling")]
        if running:
            return " | " + compile_state(max(running, key=lambda v: float(v.get("compile_elapsed_s", 0.0))))
        done = [v for v in learners if "compile_s" in v]
        if not done:
            return ""
        merged = {"compile_s": max(float(v["compile_s"]) for v in done)}
        if gains := [float(v["compile_gain"]) for v in done if "compile_gain" in v]:
            merged["compile_gain"] = min(gains)
        return " | " + compile_state(merged)

    def stall_part(self) -> str:
        """`` | stalled since 20k`` while `stall()` says the run is not learning, else ``""``."""
        if self.stall() is None:
            return ""
        best = max(self.evals, key=lambda e: e.return_mean)
        return f" | stalled since {best.env_steps / 1000:.0f}k"

    def learner_values(self) -> dict[str, Any]:
        """The learners' newest metrics merged (split mode: actor- and critic-learner)."""
        merged: dict[str, Any] = {}
        for role in LEARNER_ROLES:
            for values in self.by_role(role):
                merged.update(values)
        return merged

    def sparse_part(self) -> str:
        """`` | sparse a50% c50% flops 0.51x`` when the learners report sparsity, else ``""``."""
        values = self.learner_values()
        shares = [f"{role[0]}{100 * float(values[f'sparsity/{role}']):.0f}%" for role in ("actor", "critic")
                  if f"sparsity/{role}" in values]
        if not shares:
            return ""
        flops = combined_flops_ratio(values)
        return f" | sparse {' '.join(shares)}" + (f" flops {flops:.2f}x" if flops is not None else "")

    def close(self) -> None:
        self.file.close()


def last_progress(path: Path, tail: int = 1 << 20) -> dict[str, Any]:
    """The newest `progress` record of a metrics.jsonl (from its last MB; {} where none)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - tail))
            lines = f.read().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        if b'"kind": "progress"' not in line:
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            return row
    return {}
