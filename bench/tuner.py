"""`spreeze bench tuner`: the runtime tuner from a bad start vs the best hand-picked setting.

Every run is the real system (`Supervisor` with its own roster: replay, fused learner,
evaluator, samplers, each a process on real sockets) training TD3 on HalfCheetah-v5 with
the shipped defaults otherwise (64-64 networks, update-to-data 1), a short warm-up so
updates start within seconds. Time is counted from the learner's first update.

  tuned: starts at 1 sampler x 1 env, batch 64, tuning on (default windows); after
      `--seconds` (2 minutes) the update frame rate over the last `--window` seconds is
      what the tuner reached.
  hand-picked: each setting of `--settings` (samplers x envs x batch), tuning off, runs
      `--settle` seconds and is then measured over the same `--window`; the best counts.

Update frame rate = transitions consumed by critic updates per second: the sum of
(updates between two learner metrics records x the batch size then) / time; also
load-corrected like the tuner's windows (x host cores / (the run's CPU + idle CPU) over
the window, at most 2x), which takes out some of a shared host's noise. Printed:
each rate and the ratio tuned / best hand-picked (target >= 0.9), medians over
`--repeats` rounds (each round: the tuned run, then every hand-picked one); `--json`
writes it all. On a shared host the rates move with other programs' load: repeat.

    spreeze bench tuner [--seconds 120] [--window 15] [--settle 10] [--repeats 1]
                        [--settings 1x4x256 1x4x512 1x4x1024 1x8x1024 2x4x1024] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from spreeze.bench.system import STARTUP_S, BenchFailed, bench_supervisor, log_tails, stop_children
from spreeze.common.config import Config, load_config
from spreeze.services.supervisor.main import Supervisor
from spreeze.services.supervisor.probe import cpu_seconds, host_cpu
from spreeze.services.supervisor.tuner import Setting, Window

ENV = "HalfCheetah-v5"
BAD = Setting(1, 1, 64)  # the deliberately bad start
HAND = ("1x4x256", "1x4x512", "1x4x1024", "1x8x1024", "2x4x1024")
POLL_S = 0.1


def run_config(setting: Setting, tune: bool, run_dir: Path, budget_s: float) -> Config:
    return load_config(None, [
        f"env={ENV}", f"run_dir={run_dir}", "total_steps=100000000", f"time_limit={budget_s + STARTUP_S}",
        f"sampler.num_samplers={setting.samplers}", f"sampler.envs_per_sampler={setting.envs}",
        f"learner.batch_size={setting.batch}", "replay.min_size=2000", "sampler.warmup_steps=2000",
        "eval.every_updates=1000000", f"supervisor.tune={str(tune).lower()}", "supervisor.progress_every=600",
    ])


def cpu_now(sup: Supervisor) -> tuple[float, float, float]:
    """(time, CPU seconds of every service, the host's idle CPU seconds)."""
    pids = [c.proc.pid for c in sup.children.values() if c.proc is not None and c.alive]
    ours = sum(cpu_seconds(pid) or 0.0 for pid in pids)
    return time.monotonic(), ours, host_cpu()[0]


def load_factor(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """The tuner's load correction over a window (Window.score): host cores / (ours + idle)."""
    dt = b[0] - a[0]
    snap = Window(1.0, 0.0, 0.0, 0.0, 0.0, idle_cores=(b[2] - a[2]) / dt, cpu={"all": (b[1] - a[1]) / dt},
                    host_cores=os.cpu_count() or 0)
    return snap.score


def train_for(cfg: Config, seconds: float, window: float) -> tuple[list[dict[str, Any]], float, float]:
    """Run the real system until `seconds` after the learner's first update; return the
    metrics records, that first update's time (the records' wall_time scale) and the load
    correction over the last `window` seconds."""
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    sup = bench_supervisor(cfg)

    async def go() -> tuple[int, float, float]:
        task = asyncio.create_task(sup.run())
        deadline = time.monotonic() + STARTUP_S
        while not task.done() and time.monotonic() < deadline:
            if sup.progress.updates > 0:
                break
            await asyncio.sleep(POLL_S)
        if task.done() or time.monotonic() >= deadline:
            sup.stop("no update within the start-up time", failure=True)
            await task
            raise BenchFailed(f"no learner update: {sup.stop_reason}\n{log_tails(Path(cfg.run_dir))}")
        first = sup.progress.elapsed
        await asyncio.wait([task], timeout=seconds - window)
        before = cpu_now(sup)
        await asyncio.wait([task], timeout=window)
        factor = load_factor(before, cpu_now(sup))
        sup.stop(f"bench run of {seconds:g}s done")
        return await task, first, factor

    try:
        rc, first, factor = asyncio.run(go())
    finally:
        stop_children(sup)
    if rc != 0:
        raise BenchFailed(f"bench run failed: {sup.stop_reason}\n{log_tails(Path(cfg.run_dir))}")
    rows = [json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    return rows, first, factor


def frame_rate(rows: list[dict[str, Any]], start: float, end: float) -> float:
    """Batch-weighted critic updates per second between wall times `start` and `end`."""
    mine = [r for r in rows if r.get("kind") == "metrics" and r.get("service") == "learner"
            and start <= r["wall_time"] <= end and "updates" in r]
    if len(mine) < 2:
        raise BenchFailed(f"{len(mine)} learner records between {start:.0f}s and {end:.0f}s: too few")
    frames = sum((b["updates"] - a["updates"]) * b.get("batch_size", 0) for a, b in zip(mine, mine[1:]))
    return frames / (mine[-1]["wall_time"] - mine[0]["wall_time"])


def parse_setting(text: str) -> Setting:
    try:
        n, e, b = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"setting {text!r} must be SAMPLERSxENVSxBATCH, e.g. 1x4x256") from None
    if min(n, e, b) <= 0:
        raise argparse.ArgumentTypeError(f"setting {text!r}: every number must be > 0")
    return Setting(n, e, b)


def tuned_run(seconds: float, window: float, run_dir: Path) -> dict[str, Any]:
    rows, first, factor = train_for(run_config(BAD, True, run_dir, seconds), seconds, window)
    end = first + seconds
    events = [r for r in rows if r.get("kind") == "event" and r.get("event") == "tune"]
    at_end = [e for e in events if e["wall_time"] <= end]
    final = {k: at_end[-1][k] for k in ("samplers", "envs", "batch")} if at_end else vars(BAD)
    rate = frame_rate(rows, end - window, end)
    got = {"frame_rate": rate, "load_corrected": rate * factor, "setting_at_end": final,
           "decisions": [{"t": round(e["wall_time"] - first, 1), "action": e["action"], "reason": e["reason"]}
                         for e in events]}
    print(f"tuned from {BAD.describe()}: {rate:,.0f} frames/s ({rate * factor:,.0f} load-corrected) in "
          f"[{seconds - window:.0f}, {seconds:.0f}]s; setting then: {final}", flush=True)
    return got


def hand_run(s: Setting, window: float, settle: float, run_dir: Path) -> dict[str, float]:
    rows, first, factor = train_for(run_config(s, False, run_dir, settle + window), settle + window, window)
    rate = frame_rate(rows, first + settle, first + settle + window)
    print(f"hand-picked {s.describe()}: {rate:,.0f} frames/s ({rate * factor:,.0f} load-corrected)", flush=True)
    return {"frame_rate": rate, "load_corrected": rate * factor}


def run(seconds: float, window: float, settle: float, hand: list[Setting], repeats: int,
        out: Path) -> dict[str, Any]:
    """`repeats` rounds of (tuned run, every hand-picked run); medians over the rounds."""
    med = statistics.median
    tuned: list[dict[str, Any]] = []
    hands: dict[str, list[dict[str, float]]] = {f"{s.samplers}x{s.envs}x{s.batch}": [] for s in hand}
    for rep in range(repeats):
        tuned.append(tuned_run(seconds, window, out / f"r{rep}-tuned"))
        for s in hand:
            name = f"{s.samplers}x{s.envs}x{s.batch}"
            hands[name].append(hand_run(s, window, settle, out / f"r{rep}-{name}"))
    result: dict[str, Any] = {"bench": "tuner", "env": ENV, "seconds": seconds, "window": window,
                              "settle": settle, "repeats": repeats, "start": vars(BAD), "tuned_runs": tuned,
                              "hand_picked_runs": hands}
    for key in ("frame_rate", "load_corrected"):
        rates = {name: med(r[key] for r in runs) for name, runs in hands.items()}
        best = max(rates, key=rates.__getitem__)
        tuned_rate = med(t[key] for t in tuned)
        result[key] = {"tuned": tuned_rate, "hand_picked": rates, "best_hand_picked": best,
                       "ratio": tuned_rate / rates[best]}
        print(f"{key.replace('_', ' ')}: tuned / best hand-picked ({best}): {tuned_rate / rates[best]:.3f} "
              f"(target >= 0.9; medians of {repeats} round(s))", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spreeze bench tuner", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0, help="tuned run length after the first update")
    p.add_argument("--window", type=float, default=15.0, help="measurement window at the end of each run")
    p.add_argument("--settle", type=float, default=10.0, help="hand-picked runs: seconds before the window")
    p.add_argument("--settings", type=parse_setting, nargs="+", default=[parse_setting(h) for h in HAND],
                   help="hand-picked settings, SAMPLERSxENVSxBATCH")
    p.add_argument("--repeats", type=int, default=1, help="rounds of all runs (medians reported)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--out", default=None, help="keep the runs' directories (logs, metrics) here")
    args = p.parse_args(argv)
    if args.window <= 0 or args.settle < 0 or args.seconds <= args.window or args.repeats <= 0:
        p.error("--window and --repeats must be > 0, --settle >= 0 and --seconds > --window")
    with tempfile.TemporaryDirectory(prefix="spreeze-bench-tuner-") as tmp:
        result = run(args.seconds, args.window, args.settle, args.settings, args.repeats, Path(args.out or tmp))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
