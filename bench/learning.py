"""`spreeze bench learning`: train over several seeds and report steps and wall-clock to a score.

Each seed is a full `spreeze train` (every service a process), run one after another so
runs do not compete for cores. From each run's metrics.jsonl it reads the first
evaluation reaching the threshold: its env steps and its wall-clock time since start,
plus the final and best evaluation returns. Medians across seeds are printed and
written as JSON.

A seed's run directory is named by the settings that shape the run (config, overrides,
steps), so runs with other settings never collide; rerunning the same command replaces
that command's earlier runs (they are the benchmark's scratch, not a user's run).

``--cold-vs-warm`` runs each seed twice, back to back: first with an empty compile cache
(the first run on a new machine: the learners update eagerly while their steps compile),
then with the cache that run filled; it reports both and the cold-over-warm ratio of the
median seconds to the threshold.

``--sb3 PYTHON`` then runs Stable-Baselines3's TD3 and SAC with RL-Zoo's settings
(bench/sb3_baseline.py, with a Python that has stable-baselines3; the project never imports
it) on the same task and threshold, in the same sitting, each ending at its first
evaluation over the threshold, and reports Spreeze's median seconds over each one's
(SB3's clock leaves its evaluations out, which favours it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from spreeze.bench.runs import ALGO_HELP, THRESHOLDS, algo_arg, first_reaching, median_reached, run_seed, settings_key


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
    p.add_argument("--algo", default="td3", type=algo_arg, help=f"algorithm: {ALGO_HELP} (default td3)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed (default 0 1 2)")
    p.add_argument("--total-steps", type=int, default=100_000, help="env steps of each run (default 100000)")
    p.add_argument("--threshold", type=float, help="return counted as learned (default: the task's, "
                   + ", ".join(f"{e} {t:g}" for e, t in THRESHOLDS.items()) + ")")
    p.add_argument("--config", help="a YAML config for every run (the repository's configs/ has examples)")
    p.add_argument("--out", default="runs/bench-learning", help="directory for the runs and the JSON")
    p.add_argument("--cold-vs-warm", action="store_true",
                   help="run each seed with an empty compile cache, then again with the cache it filled")
    p.add_argument("--sb3", metavar="PYTHON", help="then run SB3 TD3 and SAC (RL-Zoo settings) with this Python, "
                   "which has stable-baselines3, and report the ratios")
    p.add_argument("--sb3-seeds", type=int, nargs="+", help="seeds of the SB3 runs (default: the first of --seeds)")
    p.add_argument("--sb3-steps", type=int, help="most env steps of an SB3 run (default: --total-steps)")
    p.add_argument("overrides", nargs="*", help="config overrides key=value")
    args = p.parse_args(argv)
    if args.threshold is None:
        if args.env not in THRESHOLDS:
            p.error(f"--env {args.env} has no known threshold: give --threshold")
        args.threshold = THRESHOLDS[args.env]
    if args.sb3 and (problem := sb3_missing(args.sb3)):
        p.error(f"--sb3 {args.sb3}: {problem}")
    base = runs_dir(args)
    variants = ("cold", "warm") if args.cold_vs_warm else ("",)
    if args.cold_vs_warm:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # it would win over learner.compile_cache
    rows = []
    for seed in args.seeds:
        cache = base / f"s{seed}-compile-cache"
        for variant in variants:
            run_dir = base / (f"s{seed}-{variant}" if variant else f"s{seed}")
            if run_dir.exists():
                print(f"replacing the earlier run of this command in {run_dir}", flush=True)
                shutil.rmtree(run_dir)
            if variant == "cold" and cache.exists():
                shutil.rmtree(cache)  # the cold run starts with an empty compile cache
            overrides = [*args.overrides, f"learner.compile_cache={cache}"] if variant else args.overrides
            try:
                result = run_seed(args.env, args.algo, seed, args.total_steps, run_dir, args.config, overrides)
            except RuntimeError as exc:
                print(f"spreeze bench learning: error: {exc}", file=sys.stderr)
                return 1
            rows.append({**summarize(result, args.threshold), **({"compile_cache": variant} if variant else {})})
            r = rows[-1]
            print(f"seed {seed}{' ' + variant if variant else ''}: steps to {args.threshold:g}: "
                  f"{r['steps_to_threshold']}, seconds: {r['seconds_to_threshold']}, "
                  f"final {r['final_return']:.0f}, best {r['best_return']:.0f}", flush=True)
    summary = {
        "env": args.env, "algo": args.algo, "threshold": args.threshold, "total_steps": args.total_steps,
        "config": args.config, "overrides": args.overrides, "seeds": rows, **medians(rows),
    }
    if args.cold_vs_warm:
        cold, warm = ([r for r in rows if r["compile_cache"] == v] for v in variants)
        summary["cold"], summary["warm"] = medians(cold), medians(warm)
        c, w = summary["cold"]["median_seconds_to_threshold"], summary["warm"]["median_seconds_to_threshold"]
        summary["cold_over_warm_seconds"] = round(c / w, 3) if c and w else None
        print(f"cold compile cache: median seconds to {args.threshold:g} = {c}; warm: {w}; "
              f"cold/warm = {summary['cold_over_warm_seconds']}")
    if args.sb3:
        summary["sb3"] = sb3_side_by_side(args, summary["median_seconds_to_threshold"])
        if summary["sb3"] is None:
            return 1
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(f"{args.env} {args.algo}: median steps to {args.threshold:g} = {summary['median_steps_to_threshold']}, "
          f"median seconds = {summary['median_seconds_to_threshold']}, median final return = "
          f"{summary['median_final_return']}")
    return 0


def sb3_missing(python: str) -> str:
    """Why `python` cannot run the SB3 baseline ("" when it can): checked before any run starts."""
    try:
        done = subprocess.run([python, "-c", "import stable_baselines3, gymnasium, mujoco"], capture_output=True,
                              text=True, check=False, timeout=120)
    except OSError as exc:
        return f"cannot be run: {exc}"
    last = (done.stderr.strip().splitlines() or [""])[-1]
    return "" if done.returncode == 0 else f"cannot import stable_baselines3, gymnasium and mujoco: {last}"


def sb3_side_by_side(args: argparse.Namespace, seconds: float | None) -> dict[str, Any] | None:
    """SB3 TD3 and SAC on the same task and threshold, each seed to its first evaluation over
    it (at most --sb3-steps): their training seconds and Spreeze's median over theirs."""
    script = Path(__file__).with_name("sb3_baseline.py")
    out: dict[str, Any] = {}
    steps = args.sb3_steps or args.total_steps
    for algo in ("td3", "sac"):
        hits: list[float | None] = []
        runs: list[dict[str, Any]] = []
        for seed in args.sb3_seeds or args.seeds[:1]:
            cmd = [args.sb3, str(script), "--algo", algo, "--env", args.env, "--threshold", str(args.threshold),
                   "--steps", str(steps), "--seed", str(seed), "--stop-at-threshold"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"spreeze bench learning: error: {' '.join(cmd)} failed ({done.returncode}): "
                      f"{done.stderr.strip()[-2000:]}", file=sys.stderr)
                return None
            report = json.loads(done.stdout.strip().splitlines()[-1])
            hit, evals = report["hit"], report["evals"]
            hits.append(hit["train_s"] if hit else None)
            runs.append({"algo": algo, "seed": seed, "hit": hit, "evals": evals})
            last = f"; last evaluation {evals[-1]['return_mean']} after {evals[-1]['train_s']} s" if evals else ""
            said = f"{hit['train_s']} at {hit['env_steps']:,} steps" if hit else f"none in {steps:,} steps{last}"
            print(f"sb3 {algo} seed {seed}: seconds to {args.threshold:g} (training only): {said}", flush=True)
        theirs = median_reached(hits)
        ratio = round(seconds / theirs, 3) if seconds and theirs else None
        out[algo] = {"seconds_to_threshold": hits, "median_seconds_to_threshold": theirs,
                     "spreeze_over_sb3": ratio, "runs": runs}
        print(f"spreeze / sb3 {algo} (median seconds to {args.threshold:g}): {seconds} / {theirs} = {ratio}",
              flush=True)
    return out


def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians across seeds of steps and seconds to the threshold and of final and best returns."""
    return {f"median_{key}": median_reached([r[key] for r in rows])
            for key in ("steps_to_threshold", "seconds_to_threshold", "final_return", "best_return")}


if __name__ == "__main__":
    sys.exit(main())
