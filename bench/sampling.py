"""`spreeze bench sampling`: sampling throughput reaching replay vs a plain gymnasium loop.

Sampling-only mode of the real system: the Supervisor runs a roster of the replay and N
real samplers of E envs each (no learner, no evaluator), every one a process on real
sockets. replay.update_to_data=0 (the rate limiter never refuses an insert) and the
warm-up never ends (no learner publishes an actor anyway), so samplers step their envs
with uniform random actions and push as fast as they can. Transitions/s reaching replay
is the rate of the replay's `inserted` metric between its first record after the first
insert and its last record before the stop: start-up is excluded and the window is
about `--seconds` long.

In the same invocation, interleaved with those runs (plain loop first in every repeat),
one process steps one env of the same id with random actions for `--seconds`: the plain
single-core rate. Reported ratios:
  transitions/s / (cores x plain)  - how much of the whole machine reaches replay;
  transitions/s / (N x plain)      - per sampler process, when N < cores.
Medians over `--repeats`.

    spreeze bench sampling [--env HalfCheetah-v5] [--samplers 1 2] [--envs 4] [--seconds 10] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from spreeze.bench.system import STARTUP_S, add_output_args, measure, rate
from spreeze.common.config import load_config
from spreeze.common.envs import make_env
from spreeze.services.supervisor.processes import roster
from spreeze.services.supervisor.progress import Progress

HUGE = 10 ** 15  # total_steps and warm-up: never reached
CAPACITY = 200_000  # replay ring (it wraps; the size does not matter for inserts)
CHUNK = 256  # plain loop: actions drawn, and the clock read, once per this many steps


def system_rate(env: str, samplers: int, envs: int, seconds: float, run_dir: Path,
                seed: int = 0, overrides: tuple[str, ...] = ()) -> dict[str, float]:
    """Transitions/s reaching replay with `samplers` x `envs` random-acting envs."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = load_config(None, [*overrides,
        f"env={env}", f"seed={seed}", f"run_dir={run_dir}", f"total_steps={HUGE}",
        f"time_limit={seconds + STARTUP_S + 60}",  # safety net only: bench.system stops the run
        f"sampler.num_samplers={samplers}", f"sampler.envs_per_sampler={envs}",
        f"sampler.warmup_steps={HUGE}", "replay.update_to_data=0", f"replay.capacity={CAPACITY}",
        "replay.min_size=1", "replay.snapshot_every_s=0",  # measures sampling, not snapshots
    ])
    specs = [s for s in roster(cfg) if s.role in ("replay", "sampler")]

    def ready(p: Progress) -> bool:
        return p.env_steps > 0  # the replay's `inserted`, from its newest metrics

    rows, stop_at = measure(cfg, specs, ready, seconds)
    got = rate(rows, "replay", "inserted", stop_at)
    return {"transitions_per_s": got["rate"], "window_s": got["window_s"]}


def plain_rate(env_id: str, seconds: float, seed: int = 0) -> float:
    """Steps/s of one env of `env_id` stepped with uniform random actions in this process."""
    env = make_env(env_id, seed)
    try:
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        low, high = env.action_space.low, env.action_space.high
        step, reset = env.step, env.reset
        steps, start = 0, time.perf_counter()
        while (now := time.perf_counter()) - start < seconds:
            for action in rng.uniform(low, high, (CHUNK, len(low))).astype(np.float32):
                _, _, terminated, truncated, _ = step(action)
                if terminated or truncated:
                    reset()
            steps += CHUNK
        return steps / (now - start)
    finally:
        env.close()


def run(env: str = "HalfCheetah-v5", samplers: tuple[int, ...] = (1,), envs: tuple[int, ...] = (4,),
        seconds: float = 10.0, repeats: int = 1, json_path: str | None = None,
        out: str | None = None, overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """Measure every N x E config and the plain loop, interleaved; print; return (and write) JSON."""
    configs = [(n, e) for n in samplers for e in envs]
    plain: list[float] = []
    system: dict[tuple[int, int], list[dict[str, float]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="spreeze-bench-sampling-") as tmp:
        base = Path(out) if out else Path(tmp)
        for rep in range(repeats):
            plain.append(plain_rate(env, seconds, seed=rep))
            for n, e in configs:
                system[(n, e)].append(system_rate(env, n, e, seconds, base / f"r{rep}-{n}x{e}", seed=rep,
                                                  overrides=overrides))
    result = summarize(env, seconds, repeats, plain, system)
    result["overrides"] = list(overrides)
    print(table(result))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
    return result


def summarize(env: str, seconds: float, repeats: int, plain: list[float],
              system: dict[tuple[int, int], list[dict[str, float]]]) -> dict[str, Any]:
    med = statistics.median
    cores = os.cpu_count() or 1
    plain_rate_ = med(plain)
    rows = []
    for (n, e), runs in system.items():
        tps = med(r["transitions_per_s"] for r in runs)
        rows.append({
            "samplers": n, "envs_per_sampler": e, "transitions_per_s": tps,
            "ratio_to_cores": tps / (cores * plain_rate_),
            "ratio_to_samplers": tps / (n * plain_rate_) if n < cores else None,
            "transitions_per_s_runs": [r["transitions_per_s"] for r in runs],
            "window_s_runs": [r["window_s"] for r in runs],
        })
    return {"bench": "sampling", "env": env, "seconds": seconds, "repeats": repeats, "cores": cores,
            "plain_steps_per_s": plain_rate_, "plain_steps_per_s_runs": plain, "results": rows}


def table(result: dict[str, Any]) -> str:
    cores, plain = result["cores"], result["plain_steps_per_s"]
    lines = [(f"{result['env']}: {cores} cores; plain loop (1 process, 1 env, random actions): "
              f"{plain:,.0f} steps/s"),
             (f"{'N x E':>8} {'to replay tr/s':>15} {'plain st/s':>11} {'cores':>5} "
              f"{'tr/(cores x plain)':>18} {'tr/(N x plain)':>14}")]
    for r in result["results"]:
        per_n = "-" if r["ratio_to_samplers"] is None else f"{r['ratio_to_samplers']:.3f}"
        lines.append(f"{r['samplers']:>3} x {r['envs_per_sampler']:<2} {r['transitions_per_s']:>15,.0f} "
                     f"{plain:>11,.0f} {cores:>5} {r['ratio_to_cores']:>18.3f} {per_n:>14}")
    if result.get("overrides"):
        lines.append(f"system runs with {' '.join(result['overrides'])}")
    lines.append(f"medians of {result['repeats']} interleaved repeat(s); tr/s: replay `inserted` over "
                 f"~{result['seconds']:g}s after the first insert (start-up excluded)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spreeze bench sampling", description=__doc__.splitlines()[0])
    p.add_argument("--env", default="HalfCheetah-v5", help="gymnasium environment id")
    p.add_argument("--samplers", type=int, nargs="+", default=None,
                   help="sampler processes N (one run per value; default: 1 and the core count)")
    p.add_argument("--envs", type=int, nargs="+", default=[4], help="envs per sampler E (one run per value)")
    p.add_argument("--seconds", type=float, default=10.0, help="measurement window of each run")
    p.add_argument("--repeats", type=int, default=1, help="interleaved repeats (medians reported)")
    add_output_args(p, "sampler.steps_per_push=64")
    args = p.parse_args(argv)
    samplers = args.samplers or sorted({1, os.cpu_count() or 1})
    if min(samplers) <= 0 or min(args.envs) <= 0 or args.seconds <= 0 or args.repeats <= 0:
        p.error("--samplers, --envs, --seconds and --repeats must be positive")
    make_env(args.env).close()  # refuse an unknown or discrete env before starting anything
    run(args.env, tuple(samplers), tuple(args.envs), args.seconds, args.repeats, args.json, args.out,
        tuple(args.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
