"""`spreeze train`: the run's config from a YAML file, flags and key=value overrides (or a
resumed run's saved config), then the supervisor's start sequence."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import yaml

from spreeze.api import RESUMABLE_KEYS, Resolved, resolve
from spreeze.cli.argtypes import positive_int
from spreeze.common.algorithms import ALGOS
from spreeze.common.checkpoint_spec import check_made_for, made_for
from spreeze.common.config import Config
from spreeze.common.config_docs import field_docs
from spreeze.common.sparse_config import NETWORKS
from spreeze.services.supervisor.start import run_state


def train_arguments(p: argparse.ArgumentParser) -> None:
    rows = "\n".join(f"  {key:34s} {doc} (default {default})" for key, default, doc in field_docs())
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = ("Train TD3 or SAC. With no arguments: TD3 on HalfCheetah-v5. Ctrl-C stops the run "
                     "cleanly (exit status 130) and prints the --resume command that continues it; SIGTERM "
                     "stops it the same way with exit status 0.")
    p.epilog = ("Any config key can be set as key=value (values parsed as YAML), e.g.\n"
                "  spreeze train learner.batch_size=512 replay.update_to_data=0.5\n\nConfig keys:\n" + rows)
    p.add_argument("--config", metavar="FILE",
                   help="a YAML config file (the repository's configs/ has examples); flags and key=value "
                        "overrides apply on top")
    p.add_argument("--env", help="gymnasium environment id (config key env)")
    p.add_argument("--algo", metavar="ALGO",
                   help=f"algorithm: {' | '.join(ALGOS)} | a module path defining ALGORITHM (config key algo; "
                        "unset, the start plan picks crossq for tasks that end episodes when the agent falls, "
                        "else td3)")
    p.add_argument("--network", choices=NETWORKS,
                   help="dense, static sparse or dynamic sparse (ds) networks (config key sparse.network)")
    p.add_argument("--seed", type=int, help="base seed (config key seed)")
    p.add_argument("--total-steps", type=positive_int, help="env steps budget (config key total_steps)")
    p.add_argument("--time-limit", type=float, help="wall-clock budget in seconds (config key time_limit)")
    p.add_argument("--stop-at-return", type=float, metavar="R",
                   help="stop once an evaluation's mean return reaches R (config key stop_at_return)")
    p.add_argument("--run-dir", help="run directory (config key run_dir)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a stopped or crashed run with its saved config; only budget keys "
                        f"({', '.join(RESUMABLE_KEYS)}) may be changed")
    p.add_argument("--or-resume", action="store_true",
                   help="continue the run in --run-dir where it holds one (made for the same networks; only "
                        "the budget flags then apply), else start it: for containers, whose restart must go on "
                        "with their run, and whose finished run must stay finished")
    p.add_argument("--listen", metavar="tcp://HOST:PORT",
                   help="let remote samplers attach on PORT (and PORT+1..3) (config key supervisor.listen)")
    p.add_argument("--keys", metavar="DIR",
                   help="CURVE key directory from `spreeze keys`: tcp endpoints admit its authorized clients "
                        "only (config key supervisor.keys)")
    p.add_argument("--quiet", action="store_true", help="no console progress lines")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (keys listed below)")


def resolved(args: argparse.Namespace) -> Resolved:
    """The run's config from the command line (the API's resolution: spreeze.api.resolve)."""
    where = {"supervisor__listen": args.listen,
             "supervisor__keys": str(Path(args.keys).resolve()) if args.keys else None}
    budget = {"total_steps": args.total_steps, "time_limit": args.time_limit, "stop_at_return": args.stop_at_return}
    run = resolve(args.config, args.overrides, args.resume, env=args.env, algo=args.algo, seed=args.seed,
                  run_dir=args.run_dir, sparse__network=args.network, **budget, **where)
    if not args.or_resume or args.resume:
        return run
    run_dir = Path(run.config.run_dir)
    if not run_state(run_dir) or not (run_dir / "config.yaml").is_file():
        return run  # nothing there yet: a new run
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    check_made_for(f"--or-resume: the run in {str(run_dir)!r}", made_for(saved if isinstance(saved, dict) else {}),
                   run.config)
    return resolve(None, [], run_dir, **budget, **where)


def train_config(args: argparse.Namespace) -> Config:
    return resolved(args).config


def cmd_train(args: argparse.Namespace) -> int:
    """The run's exit status: 0 at its budget, 130 after Ctrl-C (with the command that continues
    the run), 1 when it failed."""
    from spreeze.services.supervisor.main import INTERRUPTED
    from spreeze.services.supervisor.start import start

    run = resolved(args)
    cfg = run.config
    try:
        status = start(cfg, run.pinned, resumed=run.resumed, quiet=args.quiet)
    except KeyboardInterrupt:  # Ctrl-C before the supervisor took over the signal
        status = INTERRUPTED
    if status == INTERRUPTED and (Path(cfg.run_dir) / "config.yaml").is_file():
        print(f"spreeze train: interrupted; continue with: spreeze train --resume {shlex.quote(cfg.run_dir)}",
              flush=True)
    return status


PARSERS = {"train": train_arguments}
HANDLERS = {"train": cmd_train}
