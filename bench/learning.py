"""`spreeze bench learning`: train over several seeds and report steps and wall-clock to a score.

Each seed is a full `spreeze train` (every service a process), run one after another so
runs do not compete for cores. From each run's metrics.jsonl it reads the first
evaluation reaching the threshold: its env steps and its wall-clock time since start,
plus the final and best evaluation returns. Medians across seeds are printed and
written as JSON.

A seed's run directory is named by the settings that shape the run (config, overrides,
steps), so runs with other settings never collide; rerunning the same command replaces
that command's earlier runs (they are the benchmark's scratch, not a user's run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from bench.runs import THRESHOLDS, first_reaching, median_reached, run_seed, settings_key


def summarize(result: dict[str, Any], threshold: float) -> dict[str, Any]:
    evals = result["evals"]
    hit = first_reaching(evals, threshold)
    return {
        "seed": result["seed"], "run_dir": result["run_dir"],
        "steps_to_threshold": hit["env_steps"] if hit else None,
        "seconds_to_threshold": round(hit["since_command"], 1) if hit else None,
        "final_return": evals[-1]["return_mean"] if evals else None,
        "best_return": max((e["return_mean"] for e in evals), default=None),
        "command_wall_s": result["command_wall_s"],
    }


def runs_dir(args: argparse.Namespace) -> Path:
    """Where this command's seeds run: ``out/<env>-<algo>-<hash of config, overrides, steps>``."""
    fields = {"config": args.config, "overrides": args.overrides, "total_steps": args.total_steps}
    return Path(args.out) / f"{args.env}-{args.algo}-{settings_key(fields, 8)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spreeze bench learning", description=__doc__)
    p.add_argument("--env", default="HalfCheetah-v5", help="gymnasium environment id (default HalfCheetah-v5)")
    p.add_argument("--algo", default="td3", choices=("td3", "sac"), help="algorithm (default td3)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed (default 0 1 2)")
    p.add_argument("--total-steps", type=int, default=100_000, help="env steps of each run (default 100000)")
    p.add_argument("--threshold", type=float, help="return counted as learned (default: the task's, "
                   + ", ".join(f"{e} {t:g}" for e, t in THRESHOLDS.items()) + ")")
    p.add_argument("--config", help="a YAML config for every run (the repository's configs/ has examples)")
    p.add_argument("--out", default="runs/bench-learning", help="directory for the runs and the JSON")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    args = p.parse_args(argv)
    if args.threshold is None:
        if args.env not in THRESHOLDS:
            p.error(f"--env {args.env} has no known threshold: give --threshold")
        args.threshold = THRESHOLDS[args.env]
    base = runs_dir(args)
    rows = []
    for seed in args.seeds:
        run_dir = base / f"s{seed}"
        if run_dir.exists():
            print(f"replacing the earlier run of this command in {run_dir}", flush=True)
            shutil.rmtree(run_dir)
        try:
            result = run_seed(args.env, args.algo, seed, args.total_steps, run_dir, args.config, args.overrides)
        except RuntimeError as exc:
            print(f"spreeze bench learning: error: {exc}", file=sys.stderr)
            return 1
        rows.append(summarize(result, args.threshold))
        r = rows[-1]
        print(f"seed {seed}: steps to {args.threshold:g}: {r['steps_to_threshold']}, seconds: "
              f"{r['seconds_to_threshold']}, final {r['final_return']:.0f}, best {r['best_return']:.0f}", flush=True)
    summary = {
        "env": args.env, "algo": args.algo, "threshold": args.threshold, "total_steps": args.total_steps,
        "config": args.config, "overrides": args.overrides, "seeds": rows,
        "median_steps_to_threshold": median_reached([r["steps_to_threshold"] for r in rows]),
        "median_seconds_to_threshold": median_reached([r["seconds_to_threshold"] for r in rows]),
        "median_final_return": median_reached([r["final_return"] for r in rows]),
        "median_best_return": median_reached([r["best_return"] for r in rows]),
    }
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(f"{args.env} {args.algo}: median steps to {args.threshold:g} = {summary['median_steps_to_threshold']}, "
          f"median seconds = {summary['median_seconds_to_threshold']}, median final return = "
          f"{summary['median_final_return']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
