"""The report of `spreeze bench soak`: faults and their recovery, memory and handles, the ledger."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spreeze.bench.results import machine_info
from spreeze.bench.runs import git_commit
from spreeze.services.supervisor.ledger import balanced


STARTING_S = 30.0  # a process's memory in its first seconds (imports) is not a base to measure growth from


@dataclass
class Fault:
    kind: str  # sigkill | pause | stop | sigkill-supervisor
    target: str  # service id (or "remote", "supervisor")
    at_s: float = 0.0  # seconds into the soak
    recovered_s: float | None = None
    note: str = ""

    @property
    def name(self) -> str:
        return {"sigkill": f"SIGKILL {self.target}", "pause": f"SIGSTOP {self.target}",
                "stop": f"stop {self.target} sampler", "sigkill-supervisor": "SIGKILL supervisor"}[self.kind]


@dataclass
class Sample:
    t: float
    pid: int
    rss_mb: float
    fds: int
    sockets: int


def proc_sample(pid: int, t: float) -> Sample | None:
    """Resident memory (MB), open file descriptors and sockets of a process (None: it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = os.listdir(f"/proc/{pid}/fd")
        sockets = 0
        for fd in fds:
            try:
                sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
            except OSError:
                continue
    except OSError:
        return None
    rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return None if rss is None else Sample(t, pid, rss / 1024, len(fds), sockets)  # (None: a zombie)



def memory_rows(samples: dict[str, list[Sample]], settle_s: float) -> list[dict[str, Any]]:
    """Per service: its longest-lived process's memory and handles after `settle_s`, first to last."""
    rows = []
    for sid, series in sorted(samples.items()):
        by_pid: dict[int, list[Sample]] = {}
        for s in series:
            by_pid.setdefault(s.pid, []).append(s)
        longest = max(by_pid.values(), key=lambda ss: ss[-1].t - ss[0].t)
        # from settle_s on, and not in a process's first STARTING_S (it is still importing)
        settled = [s for s in longest if s.t >= max(settle_s, longest[0].t + STARTING_S)] or longest[-1:]
        first, last = settled[0], settled[-1]
        rows.append({"service": sid, "processes": len(by_pid), "from_s": first.t, "to_s": last.t,
                     "rss_first": first.rss_mb, "rss_last": last.rss_mb, "rss_max": max(s.rss_mb for s in series),
                     "growth": (last.rss_mb / first.rss_mb - 1) if first.rss_mb else 0.0,
                     "fds": (first.fds, last.fds, max(s.fds for s in series)),
                     "sockets": (first.sockets, last.sockets, max(s.sockets for s in series))})
    return rows


def fault_rows(faults: list[Fault]) -> list[dict[str, Any]]:
    kinds: dict[str, list[Fault]] = {}
    for f in faults:
        kinds.setdefault(f.name, []).append(f)
    rows = []
    for name, fs in kinds.items():
        times = [f.recovered_s for f in fs if f.recovered_s is not None]
        rows.append({"fault": name, "count": len(fs), "recovered": len(times),
                     "median_s": statistics.median(times) if times else None, "max_s": max(times) if times else None,
                     "notes": "; ".join(sorted({f.note for f in fs if f.note}))})
    return rows


def final_state(run_dir: Path) -> dict[str, Any]:
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    evals = [r for r in rows if r["kind"] == "eval"]
    ledgers = [r for r in rows if r["kind"] == "ledger"]
    ledger = ledgers[-1] if ledgers else None
    lost = None
    if ledger is not None:
        lost = {sid: not balanced({"left_unstored": 0, **r}) for sid, r in ledger["samplers"].items()}
    return {"evals": len(evals), "final": evals[-1]["return_mean"] if evals else None,
            "best": max(e["return_mean"] for e in evals) if evals else None,
            "env_steps": max((r.get("env_steps", 0) for r in rows if r["kind"] == "progress"), default=0),
            "ledger": ledger, "lost": lost, "sessions": sum(r["kind"] == "start" for r in rows)}


def report(args: argparse.Namespace, faults: list[Fault], memory: list[dict[str, Any]],
           end: dict[str, Any], exit_status: int | None, wall_s: float) -> str:
    info = machine_info()
    where = "`docker compose up` (cpu profile)" if args.compose else "`spreeze train` (local processes)"
    resumed = "compose restarts it, `--or-resume`" if args.compose else "`spreeze train --resume`"
    lines = [f"# Reliability: {args.env} under {where}, {args.minutes:g} min, a fault every {args.every:g} s", "",
             f"Command: `spreeze bench soak {' '.join(args.argv)}`  ",
             f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit {git_commit() or '?'}; "
             f"machine: {info['cores']} cores, {info['cpu']}, GPU {info['gpu']}", "",
             f"Wall clock {wall_s / 60:.1f} min, {end['sessions']} supervisor sessions (after each SIGKILL of the "
             f"supervisor: {resumed}), {end['env_steps']:,} env steps, {end['evals']} evaluations; "
             f"final evaluation {fmt(end['final'])}, best {fmt(end['best'])}; the last session's exit status "
             f"{exit_status}.", "",
             "| fault | count | recovered | median s | max s | notes |", "|---|---:|---:|---:|---:|---|"]
    for r in fault_rows(faults):
        lines.append(f"| {r['fault']} | {r['count']} | {r['recovered']} | {fmt(r['median_s'])} | "
                     f"{fmt(r['max_s'])} | {r['notes']} |")
    led = end["ledger"]
    lines += ["", "Ledger at the end (env steps made by each sampler against those replay stored): " + (
        ", ".join(f"{sid} made {r['made']:,}, stored {r['stored']:,}, rejected {r['rejected']:,}, left unstored "
                  f"at a mid-run exit {r.get('left_unstored', 0):,}"
                  for sid, r in led["samplers"].items()) if led else "none written (the run did not end cleanly)"),
        "", f"Memory and handles (the longest-lived process of each service, from {args.settle:g} s on; "
        "fds and sockets: first / last / max):", "",
        "| service | processes | RSS MB first | RSS MB last | growth | RSS MB max | fds | sockets |",
        "|---|---:|---:|---:|---:|---:|---|---|"]
    for m in memory:
        lines.append(f"| {m['service']} | {m['processes']} | {m['rss_first']:.0f} | {m['rss_last']:.0f} | "
                     f"{100 * m['growth']:+.1f}% | {m['rss_max']:.0f} | {'/'.join(map(str, m['fds']))} | "
                     f"{'/'.join(map(str, m['sockets']))} |")
    lines += ["", "Replay's ring is touched as it fills (up to `replay.capacity` rows, 168 bytes each for "
              "HalfCheetah), so replay grows until the ring is full; a sampler's kept batches grow between "
              "snapshots (docs/architecture.md, \"What is bounded\")."]
    return "\n".join(lines) + "\n"


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"
