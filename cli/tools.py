"""`spreeze eval`, `spreeze plot` and `spreeze bench`: tools on finished runs, and benchmarks."""

from __future__ import annotations

import argparse
from pathlib import Path

from spreeze.bench import BENCHES
from spreeze.cli.argtypes import positive_int


def eval_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run deterministic episodes of a run's best (or latest) checkpoint on a fresh env and "
                     "print the mean return ± std.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory of `spreeze train` (its checkpoints/)")
    p.add_argument("--episodes", type=positive_int, default=10, help="episodes to run, at least 1 (default 10)")
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best",
                   help="best: the best evaluation's actor; latest: the newest evaluated one (default best)")


def cmd_eval(args: argparse.Namespace) -> int:
    import numpy as np

    from spreeze.common.evaluation import evaluate_checkpoint

    returns = evaluate_checkpoint(Path(args.run_dir), args.episodes, args.checkpoint)
    print(f"{args.checkpoint} checkpoint of {args.run_dir}: return {np.mean(returns):.1f} "
          f"± {np.std(returns):.1f} over {len(returns)} episodes")
    return 0


def plot_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("learning_curves.png (evaluation return vs env steps and vs seconds; several runs: each "
                     "run and their mean ± std) and throughput.png (sampling and update rates) from the runs' "
                     "metrics.jsonl.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (finished or still running)")
    p.add_argument("--out", help="folder for the PNGs (default: the run directory of one run, else .)")


def cmd_plot(args: argparse.Namespace) -> int:
    from spreeze.common.plot import plot_runs

    for path in plot_runs([Path(d) for d in args.run_dirs], Path(args.out) if args.out else None):
        print(path)
    return 0


def bench_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Benchmarks that compare the system with plain baselines and report medians and ratios; "
                     "`spreeze bench NAME --help` describes one.")
    p.add_argument("what", choices=BENCHES, metavar="NAME", help=f"the benchmark: {', '.join(BENCHES)}")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of the benchmark")


def cmd_bench(args: argparse.Namespace) -> int:
    from importlib import import_module

    status: int = import_module(f"spreeze.bench.{args.what}").main(args.rest)
    return status


def export_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Write a run's policy (best or latest checkpoint) as a file that runs without Spreeze: "
                     "TorchScript (torch.jit.load) or ONNX (onnxruntime; writing it needs the onnx package). "
                     "Input: obs, float32 [N, obs_dim]; output: the deterministic action [N, act_dim], "
                     "observation normalisation inside. A sparse run's ONNX file stores its matrices' non-zeros; "
                     "the line printed gives the size against dense and the cost of one action.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory of `spreeze train` (its checkpoints/)")
    p.add_argument("--format", choices=("torchscript", "onnx"), default="torchscript",
                   help="file format (default torchscript)")
    p.add_argument("--out", required=True, metavar="FILE", help="the file to write")
    p.add_argument("--checkpoint", choices=("best", "latest"), default="best", help="which checkpoint (default best)")


def cmd_export(args: argparse.Namespace) -> int:
    from spreeze.api import export

    exported = export(args.run_dir, args.out, args.format, args.checkpoint, timed=True)
    print(f"{args.checkpoint} policy of {args.run_dir} written as {args.format}: {exported.describe()}")
    return 0


PARSERS = {"eval": eval_arguments, "export": export_arguments, "plot": plot_arguments, "bench": bench_arguments}
HANDLERS = {"eval": cmd_eval, "export": cmd_export, "plot": cmd_plot, "bench": cmd_bench}
