"""`spreeze results`: dense vs static vs dynamic sparse (ds) networks trained to the end,
summarized as a Markdown table in the repository (results/<env>.md) with raw JSON beside it.

For each algo x network mode (ds: x each --sparsities value) x seed it runs a full
`spreeze train --network MODE`, one after another so runs do not compete for cores. Per
(algo, mode[, sparsity]) row:

- return: each run's mean of its last N evaluations (--last; fewer when it has fewer),
  then mean ± sample std (n-1; 0 with one seed) over seeds; final and best: each run's
  last and highest evaluation, mean ± std over seeds;
- to threshold: the env steps and the wall-clock seconds (since the command started) of
  each run's first evaluation at or above the task's threshold (--threshold; default
  bench.runs.THRESHOLDS), median over seeds with a seed that never reached it counted as
  never, and how many seeds reached it;
- params / non-zero: actor + twin critics (online networks; targets, action-scale buffers
  and SAC's temperature not counted), built from the run's config.yaml with make_parts and
  its sparse masks; sparsity: the zero fraction of the sparse (hidden) layers together;
- FLOPs vs dense: from the learners' metrics, flops_ratio/actor and flops_ratio/critic
  weighted by dense_flops/<role>, each network's dense training multiply-adds per critic
  update (the TD3 actor trains once per policy_delay); see
  common.sparse_stats.combined_flops_ratio;
- wall s: median over seeds of the `spreeze train` command's wall-clock seconds.

Each row's learning curves (every seed, and their mean ± std) are drawn by `spreeze
plot`'s code into results/curves/<env>/<section key>/<row>/learning_curves.png.

A ds row "matches dense" when its mean is at least dense's mean minus dense's std; the
section states the highest such sparsity per algo.

The summary rows and the Markdown and JSON are bench/results_table.py's. Each command owns
one section of the Markdown file, keyed by a hash of its experiment
arguments: rerunning a command replaces its section, another command appends its own. The
JSON file holds the same sections by key. Both are rewritten after every run. A command
stopped and run again keeps the seeds this commit finished (bench.runs.finished_seed) and
trains the rest.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from spreeze.bench.results_table import Record, match_line, summarize, write_results
from spreeze.bench.runs import (ALGO_HELP, THRESHOLDS, Terminated, algo_arg, finished_seed, first_reaching, git_commit,
                                read_metrics, run_seed, settings_key)
from spreeze.common.sparse_config import NETWORKS
from spreeze.common.sparse_stats import combined_flops_ratio, overall_sparsity
from spreeze.proto.names import LEARNER_ROLES

if TYPE_CHECKING:
    from spreeze.common.config import Config

# torch, gymnasium, numpy and matplotlib are imported by the functions that use them, so that
# `spreeze results --help` and a bad argument answer at once

PLAN = "plan"  # an --algos word: the algorithm the start plan picks for the task
OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")  # a key=value config override among the arguments


@dataclass(frozen=True)
class Variant:
    """One row of the table: an algo, a network mode and (ds sweep) a sparse.sparsity."""

    algo: str
    network: str
    sparsity: float | None = None  # swept sparse.sparsity; None: the config's

    @property
    def name(self) -> str:
        tail = f"-sp{self.sparsity:g}" if self.sparsity is not None else ""
        return f"{self.algo}-{self.network}{tail}"

    def overrides(self) -> list[str]:
        return [f"sparse.sparsity={self.sparsity}"] if self.sparsity is not None else []

    def fields(self) -> Record:
        return {"variant": self.name, "algo": self.algo, "network": self.network,
                "sparsity_target": self.sparsity}


def variants(algos: Iterable[str], modes: Iterable[str], sparsities: list[float] | None) -> list[Variant]:
    """Every row to run, in table order; ds gets one row per swept sparsity."""
    out = []
    for algo in algos:
        for mode in modes:
            sweep = sparsities if mode == "ds" and sparsities else [None]
            out += [Variant(algo, mode, s) for s in sweep]
    return out


# ------------------------------------------------------------------ one run

def last_mean(evals: list[Record], n: int) -> tuple[float | None, int]:
    """Mean return of the last ``n`` evaluations (all of them when fewer) and how many."""
    tail = evals[-n:] if n > 0 else []
    return (statistics.fmean(e["return_mean"] for e in tail) if tail else None), len(tail)


def learner_values(rows: list[Record]) -> Record:
    """The newest value of every learner metric (split mode: both learners merged)."""
    merged: Record = {}
    for r in rows:
        if r["kind"] == "metrics" and str(r.get("service", "")).partition("-")[0] in LEARNER_ROLES:
            merged.update(r)
    return merged


def network_counts(cfg: Config) -> Record:
    """Parameters and non-zero parameters of the actor + twin critics ``cfg`` trains, and the
    overall sparsity of their sparse layers (0 when dense)."""
    import torch

    from spreeze.common.algorithms.build import make_parts
    from spreeze.common.envs import env_spec

    layout, low, high = env_spec(cfg.env_source)
    actor, critic = make_parts(cfg.algo, layout.obs_dim, layout.act_dim, low, high, cfg.algo_config,
                               torch.device("cpu"), True, cfg.seed, sparse=cfg.sparse,
                               total_updates=cfg.total_updates)
    modules = [cast(Any, actor).actor, cast(Any, critic).critic]  # online networks (not in the protocols)
    total = sum(p.numel() for m in modules for p in m.parameters())
    layers = [s for t in (actor.sparse, critic.sparse) if t is not None for s in t.layer_stats(measure=False)]
    return {"params": total, "nonzero": total - sum(s.size - s.nnz for s in layers),
            "sparsity": overall_sparsity(layers) if layers else 0.0}


def run_record(variant: Variant, seed: int, run_dir: Path, wall_s: float, last: int,
               threshold: float | None = None, start_s: float = 0.0) -> Record:
    """The raw numbers of one finished run, read from its run directory. ``start_s``: seconds
    from the command's start to the run's (its evaluations' clock starts there)."""
    import yaml

    from spreeze.common.config import from_dict

    rows = read_metrics(run_dir)
    evals = [r for r in rows if r["kind"] == "eval"]
    ret, used = last_mean(evals, last)
    hit = first_reaching(evals, threshold)
    values = learner_values(rows)
    cfg = from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
    flops = combined_flops_ratio(values) if cfg.sparse.enabled else 1.0
    return {**variant.fields(), "seed": seed, "run_dir": str(run_dir), "wall_s": round(wall_s, 1),
            "evals": len(evals), "last_evals": used, "return": ret,
            "final_return": evals[-1]["return_mean"] if evals else None,
            "best_return": max((e["return_mean"] for e in evals), default=None), "threshold": threshold,
            "steps_to_threshold": hit["env_steps"] if hit else None,
            "seconds_to_threshold": round(start_s + hit["wall_time"], 1) if hit else None, **network_counts(cfg),
            "sparsity_actor": values.get("sparsity/actor"), "sparsity_critic": values.get("sparsity/critic"),
            "flops_ratio": flops}


# ------------------------------------------------------------------ provenance

def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU model name from /proc/cpuinfo (platform's guess elsewhere)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> Record:
    """Cores, CPU model and GPUs (as torch sees them) of this machine."""
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"cores": os.cpu_count(), "cpu": cpu_model(), "gpu": ", ".join(gpus) or "none"}


# ------------------------------------------------------------------ command line

def parser() -> argparse.ArgumentParser:
    """The options of `spreeze results` (key=value overrides are taken out before it parses)."""
    p = argparse.ArgumentParser(prog="spreeze results", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="key=value words anywhere are config overrides, e.g. "
                                       "td3.hidden=[256,256] sparse.sparsity=0.5")
    p.add_argument("--env", default="HalfCheetah-v5", help="gymnasium environment id (default HalfCheetah-v5)")
    p.add_argument("--algos", nargs="+", type=results_algo, default=["td3"],
                   help=f"algorithms: {ALGO_HELP} | {PLAN} (the one the start plan picks for the env and these "
                   "overrides: what `spreeze train` runs without --algo) (default td3)")
    p.add_argument("--modes", nargs="+", choices=NETWORKS, default=list(NETWORKS),
                   help=f"network modes, one row each (default {' '.join(NETWORKS)})")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of every row (default 0 1 2)")
    p.add_argument("--total-steps", type=int, default=100_000, help="env steps of every run (default 100000)")
    p.add_argument("--last", type=int, default=10, help="evaluations averaged at the end of each run")
    p.add_argument("--threshold", type=float, help="return counted as learned (default: the task's in "
                   "spreeze.bench.runs.THRESHOLDS; none for other tasks)")
    p.add_argument("--sparsities", type=float, nargs="+",
                   help="sparse.sparsity values swept in ds mode (one row each)")
    p.add_argument("--config", metavar="FILE",
                   help="a YAML config for every run (the repository's configs/ has examples)")
    p.add_argument("--out", help="Markdown results file (default results/<env>.md; JSON beside it)")
    p.add_argument("--runs-dir", default="runs/results", help="run dirs go to RUNS_DIR/<env>/<section key>/")
    return p


def results_algo(text: str) -> str:
    """An ``--algos`` word: an algorithm (`algo_arg`) or PLAN."""
    return text if text == PLAN else algo_arg(text)


def planned_algos(args: argparse.Namespace) -> list[str]:
    """``--algos`` with PLAN replaced by the algorithm the start plan picks for the env under
    these overrides (services/supervisor/probe.py `planned_algo`), printed with its reason."""
    if PLAN not in args.algos:
        return list(args.algos)
    from spreeze.common.config import given_keys, load_config
    from spreeze.services.supervisor.probe import planned_algo

    given = [*args.overrides, f"env={args.env}"]
    cfg = load_config(args.config, given)
    choices = planned_algo(cfg, given_keys(args.config, given))
    algo = str(choices[0].value) if choices else cfg.algo
    print(f"{PLAN}: {choices[0].describe() if choices else f'algo={algo}, kept by the config or overrides'}",
          flush=True)
    return list(dict.fromkeys(algo if a == PLAN else a for a in args.algos))


def parse(argv: list[str]) -> argparse.Namespace:
    """Options plus ``overrides``: every key=value word, wherever it stands."""
    p = parser()
    overrides = [a for a in argv if OVERRIDE.match(a)]
    args = p.parse_args([a for a in argv if not OVERRIDE.match(a)])
    if args.sparsities and "ds" not in args.modes:
        p.error("--sparsities applies to ds: add ds to --modes")
    if any(not 0.0 < s < 1.0 for s in args.sparsities or []):
        p.error(f"--sparsities {args.sparsities}: each must be in (0, 1)")
    if args.last < 1:
        p.error(f"--last {args.last} must be >= 1")
    if args.total_steps < 1:
        p.error(f"--total-steps {args.total_steps} must be >= 1")
    args.overrides = overrides
    if args.threshold is None:
        args.threshold = THRESHOLDS.get(args.env)
    return args


def experiment_key(args: argparse.Namespace) -> str:
    """A short hash of the arguments that define the section (not where files go)."""
    fields = {k: getattr(args, k) for k in ("env", "algos", "modes", "seeds", "total_steps", "last",
                                            "sparsities", "config", "overrides")}  # not the threshold:
    # it only reads the runs, so a section keeps its key (and its runs) when it changes
    return settings_key(fields, 12)


def check_configs(args: argparse.Namespace, plan: list[Variant]) -> None:
    """Refuse bad overrides and envs (ConfigError) before the first run starts."""
    from spreeze.common.config import load_config
    from spreeze.common.envs import env_spec

    for v in plan:
        load_config(args.config, [*args.overrides, f"env={args.env}", f"algo={v.algo}",
                                  f"sparse.network={v.network}", *v.overrides()])
    env_spec(args.env)


def train_one(args: argparse.Namespace, variant: Variant, seed: int, runs_dir: Path) -> Record:
    """Train one seed of one variant; its record, or one with ``error`` when it failed. A seed
    this commit already finished in its run directory (a command stopped and run again) is
    read back, not trained again."""
    run_dir = runs_dir / f"{variant.name}-s{seed}"
    try:
        result = finished_seed(run_dir) or run_seed(args.env, variant.algo, seed, args.total_steps, run_dir,
                                                    args.config, [*args.overrides, *variant.overrides()],
                                                    network=variant.network)
        record = run_record(variant, seed, run_dir, result["command_wall_s"], args.last, args.threshold,
                            result["start_s"])
        return {**record, "kept": True} if result.get("kept") else record
    except (RuntimeError, OSError, ValueError) as exc:
        return {**variant.fields(), "seed": seed, "run_dir": str(run_dir), "error": str(exc)[-2000:]}


def draw_curves(records: list[Record], out: Path) -> list[Path]:
    """Each row's learning curves (its seeds and their mean ± std): out/<row>/learning_curves.png."""
    from spreeze.common.plot import load, plot_learning

    paths = []
    for name in dict.fromkeys(r["variant"] for r in records if "error" not in r):
        runs = {f"seed {r['seed']}": load(Path(r["run_dir"])) for r in records
                if r["variant"] == name and "error" not in r}
        (out / name).mkdir(parents=True, exist_ok=True)
        paths.append(plot_learning(runs, out / name))
    return paths


def describe(i: int, n: int, variant: Variant, r: Record) -> str:
    head = f"[{i}/{n}] {variant.name} seed {r['seed']}"
    if "error" in r:
        return f"{head}: FAILED: {r['error'].strip().splitlines()[-1] if r['error'].strip() else ''}"
    if r.get("kept"):
        head += " (finished by an earlier run of this command: kept)"
    ret = "n/a" if r["return"] is None else f"{r['return']:.1f}"
    hit = "" if r["threshold"] is None else (
        f", {r['threshold']:g} at {r['steps_to_threshold']:,} steps, {r['seconds_to_threshold']:.0f}s"
        if r["steps_to_threshold"] is not None else f", never {r['threshold']:g}")
    return f"{head}: return {ret} (last {r['last_evals']} evals), best {r['best_return']:.1f}{hit}, {r['wall_s']:.0f}s"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    key = experiment_key(args)  # of the command as given: `--algos plan` has its own section
    args.algos = planned_algos(args)
    plan = variants(args.algos, args.modes, args.sparsities)
    check_configs(args, plan)
    md = Path(args.out or f"results/{args.env}.md")
    meta = {"key": key, "command": "spreeze results " + shlex.join(argv),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine_info(), "commit": git_commit(), "env": args.env, "algos": args.algos,
            "modes": args.modes, "seeds": args.seeds, "total_steps": args.total_steps, "last": args.last,
            "sparsities": args.sparsities, "config": args.config, "overrides": args.overrides,
            "threshold": args.threshold, "runs_dir": str(Path(args.runs_dir) / args.env / key),
            "json": str(md.with_suffix(".json")), "curves": str(md.parent / "curves" / args.env / key)}
    runs = [(v, seed) for v in plan for seed in args.seeds]
    records: list[Record] = []
    try:
        for i, (variant, seed) in enumerate(runs, 1):
            records.append(train_one(args, variant, seed, Path(meta["runs_dir"])))
            print(describe(i, len(runs), variant, records[-1]), flush=True)
            write_results(md, meta, records, len(runs))
    except (KeyboardInterrupt, Terminated):  # Ctrl-C or SIGTERM: the section says so, runs done stay
        meta["stopped"] = True
        write_results(md, meta, records, len(runs))
        print(f"stopped after {len(records)}/{len(runs)} runs; results: {md} (section {key})", flush=True)
        raise
    if any("error" not in r for r in records):
        print("learning curves: " + ", ".join(map(str, draw_curves(records, Path(meta["curves"])))))
    for line in (match_line(summarize(records), algo) for algo in args.algos):
        if line:
            print(line)
    print(f"results: {md} (section {key}), raw numbers: {meta['json']}")
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
