"""The `spreeze` command line: train, eval, plot, bench, results, sampler, keys, health."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from common.config import Config, field_docs, given_keys, load_config, parse_override, to_dict
from common.errors import ConfigError
from proto.errors import SpreezeError
from common.sparse import NETWORKS

BENCHES = ("transport", "learning", "sampling", "update", "e2e", "tuner", "snapshot", "remote")  # modules bench/<name>.py


def _train_parser(sub: argparse._SubParsersAction) -> None:
    rows = "\n".join(f"  {key:34s} {doc} (default {default})" for key, default, doc in field_docs())
    p = sub.add_parser(
        "train", help="train an agent with every service as a local process",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train TD3 or SAC. With no arguments: TD3 on HalfCheetah-v5.",
        epilog="Any config key can be set as key=value (values parsed as YAML), e.g.\n"
               "  spreeze train learner.batch_size=512 replay.update_to_data=0.5\n\nConfig keys:\n" + rows)
    p.add_argument("--config", help="YAML config file (see configs/); overrides apply on top")
    p.add_argument("--env", help="gymnasium environment id (config key env)")
    p.add_argument("--algo", choices=("td3", "sac"), help="algorithm (config key algo)")
    p.add_argument("--network", choices=NETWORKS,
                   help="dense, static sparse or dynamic sparse (ds) networks (config key sparse.network)")
    p.add_argument("--seed", type=int, help="base seed (config key seed)")
    p.add_argument("--total-steps", type=int, help="env steps budget (config key total_steps)")
    p.add_argument("--time-limit", type=float, help="wall-clock budget in seconds (config key time_limit)")
    p.add_argument("--run-dir", help="run directory (config key run_dir)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a stopped or crashed run with its saved config; only budget keys "
                        f"({', '.join(RESUMABLE_KEYS)}) may be changed")
    p.add_argument("--listen", metavar="tcp://HOST:PORT",
                   help="let remote samplers attach on PORT (and PORT+1..3) (config key supervisor.listen)")
    p.add_argument("--keys", metavar="DIR",
                   help="CURVE key directory from `spreeze keys`: tcp endpoints admit its authorized clients "
                        "only (config key supervisor.keys)")
    p.add_argument("--quiet", action="store_true", help="no console progress lines")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


RESUMABLE_KEYS = ("total_steps", "time_limit", "supervisor.listen", "supervisor.keys")  # budget and where it listens
RUN_STATE = ("checkpoints", "replay")  # what a started run leaves in its run directory


def train_overrides(args: argparse.Namespace) -> list[str]:
    """key=value overrides of `spreeze train`, the named flags included."""
    flags = {"env": args.env, "algo": args.algo, "seed": args.seed, "total_steps": args.total_steps,
             "time_limit": args.time_limit, "run_dir": args.run_dir, "sparse.network": args.network,
             "supervisor.listen": args.listen,
             "supervisor.keys": str(Path(args.keys).resolve()) if args.keys else None}
    return list(args.overrides) + [f"{k}={v}" for k, v in flags.items() if v is not None]


def resume_config(args: argparse.Namespace) -> Config:
    """RUN_DIR/config.yaml with only budget keys overridden; anything else is refused by name."""
    run_dir = Path(args.resume).resolve()
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"--resume {str(run_dir)!r}: no config.yaml there, so it is not a run directory")
    if args.config is not None:
        raise ConfigError(f"--config {args.config!r} cannot be used with --resume: the run keeps its config")
    overrides = train_overrides(args)
    for text in overrides:
        key = ".".join(parse_override(text)[0])
        if key == "run_dir" and Path(str(parse_override(text)[1])).resolve() == run_dir:
            continue
        if key not in RESUMABLE_KEYS:
            raise ConfigError(f"--resume: {key} cannot change when resuming a run (only "
                              f"{', '.join(RESUMABLE_KEYS)} can); start a new run instead")
    cfg = load_config(saved, overrides)
    return dataclasses.replace(cfg, run_dir=str(run_dir))


def train_config(args: argparse.Namespace) -> Config:
    if args.resume:
        return resume_config(args)
    cfg = load_config(args.config, train_overrides(args))
    if not cfg.run_dir:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        cfg = dataclasses.replace(cfg, run_dir=f"runs/{cfg.env}-{cfg.algo}-s{cfg.seed}-{stamp}")
    run_dir = Path(cfg.run_dir).resolve()
    return dataclasses.replace(cfg, run_dir=str(run_dir))


def cmd_train(args: argparse.Namespace) -> int:
    from services.supervisor import probe
    from services.supervisor.main import Supervisor

    from common.envs import env_spec

    cfg = train_config(args)
    layout, _, _ = env_spec(cfg.env)  # refuse unknown or discrete-action envs before anything starts
    pinned = given_keys(args.config, train_overrides(args))
    hardware = probe.probe()
    resumed = bool(args.resume)  # a resumed run keeps its saved config: nothing is re-planned
    choices = probe.plan(hardware, cfg, pinned, layout.width * 4) if cfg.supervisor.auto and not resumed else []
    cfg = probe.apply(cfg, choices)
    run_dir = Path(cfg.run_dir)
    started = [name for name in RUN_STATE if (run_dir / name).is_dir() and any((run_dir / name).iterdir())]
    if started and not args.resume:
        raise ConfigError(f"run directory {str(run_dir)!r} already holds a run ({', '.join(started)}): "
                          f"continue it with --resume {run_dir}, or choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    logging.basicConfig(filename=run_dir / "supervisor.log", level=logging.INFO,
                        format="%(asctime)s supervisor %(levelname)s %(name)s: %(message)s")
    verb = "resuming" if args.resume else "training"
    print(f"spreeze: {verb} {cfg.algo} on {cfg.env} for {cfg.total_steps:,} env steps; run dir {run_dir}",
          flush=True)
    print(f"spreeze: hardware: {hardware.describe()}", flush=True)
    logging.getLogger(__name__).info("hardware: %s; pinned by the user: %s", hardware.describe(),
                                     ", ".join(sorted(pinned)) or "nothing")
    return asyncio.run(Supervisor(cfg, quiet=args.quiet, pinned=pinned, plan=choices).run())


def cmd_eval(args: argparse.Namespace) -> int:
    from common.evaluation import evaluate_checkpoint

    returns = evaluate_checkpoint(Path(args.run_dir), args.episodes, args.checkpoint)
    import numpy as np

    print(f"{args.checkpoint} checkpoint of {args.run_dir}: return {np.mean(returns):.1f} "
          f"± {np.std(returns):.1f} over {len(returns)} episodes")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from common.plot import plot_runs

    for path in plot_runs([Path(d) for d in args.run_dirs], Path(args.out) if args.out else None):
        print(path)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from importlib import import_module

    return import_module(f"bench.{args.what}").main(args.rest)


def cmd_results(argv: list[str]) -> int:
    from bench.results import main as results_main

    return results_main(argv)


def cmd_sampler(args: argparse.Namespace) -> int:
    """A sampler process attaching to a running training from anywhere (`--connect`)."""
    import os

    from common.service import ENV_CONTROL, ENV_KEY_NAME, ENV_KEYS, ENV_REGISTER_TIMEOUT, ENV_SERVICE_ID, run_service
    from common.transport import check_endpoint

    os.environ[ENV_CONTROL] = check_endpoint(args.connect)
    if args.keys:
        os.environ[ENV_KEYS] = str(Path(args.keys).resolve())
        os.environ[ENV_KEY_NAME] = args.key_name
    if args.id:
        os.environ[ENV_SERVICE_ID] = args.id
    if args.register_timeout is not None:
        os.environ[ENV_REGISTER_TIMEOUT] = str(args.register_timeout)
    from services.sampler.main import Sampler

    run_service(Sampler)  # exits 1 on a crash
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    from common.curve_auth import make_keys

    d = make_keys(args.dir, args.client)
    print(f"CURVE keys in {d}: server pair server.key(_secret), client pair {args.client}.key(_secret), "
          f"authorized/{args.client}.key.\nTrainer: spreeze train --listen tcp://HOST:PORT --keys {d}\n"
          f"Remote sampler host: copy {d / 'server.key'} and {d / (args.client + '.key_secret')} into one "
          f"directory D there, then: spreeze sampler --connect tcp://HOST:PORT --keys D"
          + (f" --key-name {args.client}" if args.client != "client" else ""))
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    import os

    from common.health import ENV_HEALTH, probe

    endpoint = args.endpoint or os.environ.get(ENV_HEALTH)
    if not endpoint:
        print(f"spreeze health: give an endpoint or set {ENV_HEALTH}", file=sys.stderr)
        return 2
    ok, detail = probe(endpoint, args.timeout)
    print(f"{'healthy' if ok else 'unhealthy'}: {detail}")
    return 0 if ok else 1


def _remote_parsers(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("sampler", help="attach a sampler to a running training (spreeze train --listen)")
    s.add_argument("--connect", required=True, metavar="tcp://HOST:PORT", help="the trainer's --listen address")
    s.add_argument("--keys", metavar="DIR", help="directory holding server.key and the client pair (CURVE)")
    s.add_argument("--key-name", default="client", help="client pair name in --keys (default client)")
    s.add_argument("--id", help="service id (default sampler-<host>-<pid>)")
    s.add_argument("--register-timeout", type=float, help="seconds to wait for the trainer's welcome (default 30)")
    k = sub.add_parser("keys", help="make CURVE server and client key pairs for tcp endpoints")
    k.add_argument("dir")
    k.add_argument("--client", default="client", help="name of the client pair (run again for more clients)")
    h = sub.add_parser("health", help="ask a service over its health socket; exit 0 when it answers healthy")
    h.add_argument("endpoint", nargs="?", help="health endpoint (default: $SPREEZE_HEALTH)")
    h.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spreeze", description="High-throughput actor-critic RL.")
    sub = p.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    e = sub.add_parser("eval", help="evaluate a run's best checkpoint")
    e.add_argument("run_dir")
    e.add_argument("--episodes", type=int, default=10)
    e.add_argument("--checkpoint", choices=("best", "latest"), default="best")
    pl = sub.add_parser("plot", help="PNG learning curves (mean ± std over several runs) and throughput")
    pl.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    pl.add_argument("--out", help="folder for the PNGs (default: the run directory of one run, else .)")
    b = sub.add_parser("bench", help=f"benchmarks: {' | '.join(BENCHES)} (each has --help)")
    b.add_argument("what", choices=BENCHES)
    b.add_argument("rest", nargs=argparse.REMAINDER, help="arguments of the benchmark")
    sub.add_parser("results", add_help=False,  # parsed by bench.results (see main)
                   help="train dense | static | ds over seeds, table in results/<env>.md (has --help)")
    _remote_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["results"]:  # its own parser: options and key=value overrides in any order
        return guarded("results", lambda: cmd_results(argv[1:]))
    p = parser()
    args, extra = p.parse_known_args(argv)
    if args.command == "train":  # key=value overrides may come between or after options
        stray = [x for x in extra if x.startswith("-") or "=" not in x]
        if stray:
            p.error(f"unrecognized arguments: {' '.join(stray)}")
        args.overrides = list(args.overrides) + extra
    elif extra and args.command != "bench":
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    handlers = {"train": cmd_train, "eval": cmd_eval, "plot": cmd_plot, "bench": cmd_bench,
                "sampler": cmd_sampler, "keys": cmd_keys, "health": cmd_health}
    return guarded(args.command, lambda: handlers[args.command](args))


def guarded(command: str, run: Callable[[], int]) -> int:
    """``run()``'s exit status; a SpreezeError is printed and exits 2."""
    try:
        return run()
    except SpreezeError as exc:
        print(f"spreeze {command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
