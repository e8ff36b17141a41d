"""Shared by `bench sampling` and `bench update`: run part of the real system for a window.

`measure()` runs the real Supervisor (every service a real process on real sockets) with a
custom roster, waits until `ready` says the measured service is under way (start-up,
imports and filling excluded), lets it run `seconds` more, then stops it. A bench run ends
soon whatever happens: the first crash of any service ends it with that service's last log
line (a restarted service's counters would spoil the window anyway), its services get
BENCH_STOP_GRACE to exit before SIGTERM, then SIGKILL (their process groups: whatever they
started too), and nothing started outlives `measure()`, even on an error. The supervisor
writes every metrics record to run_dir/metrics.jsonl with its arrival time; `rate()` reads
a counter's rate between the first record after start-up and the last one before the stop.
Nothing of the Supervisor is copied: only its public constructor (`specs=`, `stop_grace=`),
`stop()`, the `progress` and `children` it keeps, and processes.terminate.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spreeze.common.config import Config
from spreeze.proto.errors import SpreezeError
from spreeze.services.supervisor.main import Supervisor
from spreeze.services.supervisor.processes import ServiceSpec, terminate
from spreeze.services.supervisor.progress import Progress

STARTUP_S = 120.0  # longest wait for the measured service to get going (imports, filling)
POLL_S = 0.05
# seconds services have to exit after the window: a bench keeps no final checkpoint or evaluation
BENCH_STOP_GRACE = 3.0


class BenchFailed(SpreezeError, RuntimeError):
    """A measured run did not start, crashed, or reported too little to measure (the command
    line prints it, the failing service's last log line first, and exits 2)."""


def measure(cfg: Config, specs: list[ServiceSpec], ready: Callable[[Progress], bool],
            seconds: float, on_window: Callable[[str, Supervisor], None] | None = None,
            ) -> tuple[list[dict[str, Any]], float]:
    """Run `specs` under a Supervisor until `ready`, then `seconds` more; return the run's
    metrics records and the supervisor time (wall_time scale of the records) of the stop.
    `on_window("start" | "end", supervisor)` is called as the window opens and closes.

    cfg.run_dir must exist; cfg.time_limit should leave room for start-up (a safety net)."""
    sup = bench_supervisor(cfg, specs)
    window = on_window or (lambda phase, supervisor: None)

    async def go() -> tuple[int, float]:
        task = asyncio.create_task(sup.run())
        deadline = time.monotonic() + STARTUP_S
        while not task.done():
            if ready(sup.progress):
                break
            if time.monotonic() > deadline:
                sup.stop(f"not under way within {STARTUP_S:.0f}s", failure=True)
                break
            await asyncio.sleep(POLL_S)
        if task.done():  # stopped (or crashed) before the window began
            await task
            raise BenchFailed(f"bench run stopped before measuring: {sup.stop_reason}\n"
                              f"{log_tails(Path(cfg.run_dir))}")
        window("start", sup)
        if not sup.done.is_set():
            await asyncio.wait([task], timeout=seconds)
        window("end", sup)
        stop_at = sup.progress.elapsed
        sup.stop(f"bench window of {seconds:g}s measured")
        return await task, stop_at

    try:
        rc, stop_at = asyncio.run(go())
    finally:  # after an error in between too (the supervisor's task was cancelled): nothing outlives the bench
        stop_children(sup)
    run_dir = Path(cfg.run_dir)
    if rc != 0 or sup.failure:
        raise BenchFailed(f"bench run failed: {sup.stop_reason}\n{log_tails(run_dir)}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    restarts = [r for r in rows if r.get("kind") == "event" and r.get("event") == "restart"]
    if restarts:  # a restarted service's counters start over: the window's rates would be wrong
        raise BenchFailed(f"a service restarted during the bench run: {restarts[0].get('reason')}\n"
                          f"{log_tails(run_dir)}")
    return rows, stop_at


def bench_supervisor(cfg: Config, specs: list[ServiceSpec] | None = None) -> Supervisor:
    """A quiet Supervisor for a bench run (`specs`: its roster; None: a training run's): no
    restarts, so the first crash of a service stops the run with that service's last log line
    (the supervisor's own give-up), and a short stop grace."""
    sc = dataclasses.replace(cfg.supervisor, max_restarts=0)
    return Supervisor(dataclasses.replace(cfg, supervisor=sc), quiet=True, specs=specs,
                      stop_grace=BENCH_STOP_GRACE)


def stop_children(sup: Supervisor) -> None:
    """SIGTERM, then SIGKILL after BENCH_STOP_GRACE, to every service process group the
    supervisor started that is still there (none after a normal stop)."""
    terminate([c for c in sup.children.values() if c.proc is not None], BENCH_STOP_GRACE)


def rate(rows: list[dict[str, Any]], service: str, key: str, until: float,
         also: tuple[str, ...] = (), since: float = 0.0) -> dict[str, float]:
    """Rate of counter `key` of `service`, from the first metrics record at or after `since`
    where it is > 0 to the last one at or before `until`; `also`: other counters' rates over
    the same window."""
    mine = [r for r in rows if r.get("kind") == "metrics" and r.get("service") == service
            and key in r and since <= r["wall_time"] <= until]
    mine = [r for r in mine if r[key] > 0]
    if len(mine) < 2 or mine[-1]["wall_time"] <= mine[0]["wall_time"]:
        raise BenchFailed(f"{service} sent {len(mine)} metrics records with {key} > 0 within the window: "
                          "too few to measure a rate (use more --seconds)")
    first, last = mine[0], mine[-1]
    dt = last["wall_time"] - first["wall_time"]
    out = {"rate": (last[key] - first[key]) / dt, "window_s": dt, "count": float(last[key] - first[key])}
    for k in also:
        out[k] = (float(last.get(k, 0.0)) - float(first.get(k, 0.0))) / dt
    return out


def log_tails(run_dir: Path, chars: int = 1500) -> str:
    parts = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        text = log.read_text(errors="replace")[-chars:]
        parts.append(f"--- {log.name} (last {chars} chars)\n{text}")
    return "\n".join(parts)


def add_output_args(p: argparse.ArgumentParser, example: str) -> None:
    """--json, --out and key=value overrides: the arguments every system benchmark shares."""
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--out", default=None, help="keep the runs' directories (logs, metrics) here")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help=f"config overrides of the measured runs, e.g. {example}")
