"""The `spreeze` command line: train, eval, plot, bench, results, sampler, keys, health, conformance.

One table names every command and the module that implements it; a command's module is
imported only when that command runs, so `spreeze health` (a container's health check)
starts without torch, gymnasium or the run config. Keep this module's imports light.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib import import_module, metadata

from spreeze.bench import BENCHES
from spreeze.proto.errors import SpreezeError

MORE = ("More: README.md (Usage; Stopping, crashing and resuming; Configuration) and proto/SPEC.md\n"
        "(the wire protocol) in the repository. Each command has --help.")

# command -> (module defining its PARSERS and HANDLERS entries, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("spreeze.cli.train", "train an agent with every service as a local process"),
    "eval": ("spreeze.cli.tools", "evaluate a run's best checkpoint"),
    "plot": ("spreeze.cli.tools", "PNG learning curves (mean ± std over several runs) and throughput"),
    "bench": ("spreeze.cli.tools", f"benchmarks: {' | '.join(BENCHES)} (each has --help)"),
    "results": ("spreeze.cli.tools", "train dense | static | ds over seeds, table in results/<env>.md (has --help)"),
    "sampler": ("spreeze.cli.remote", "attach a sampler to a running training (spreeze train --listen)"),
    "keys": ("spreeze.cli.remote", "make CURVE server and client key pairs for tcp endpoints"),
    "health": ("spreeze.cli.remote", "ask a service over its health socket; exit 0 when it answers healthy"),
    "conformance": ("spreeze.cli.conformance", "check a replay or sampler from outside against proto/SPEC.md"),
}


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with `command`'s arguments (None: every command's, importing every module)."""
    p = argparse.ArgumentParser(prog="spreeze", description="High-throughput actor-critic RL.", epilog=MORE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"spreeze {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, text) in COMMANDS.items():
        s = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".",
                           add_help=name != "results")  # results: parsed by bench.results
        if command is None or command == name:
            add_arguments = import_module(module).PARSERS.get(name)
            if add_arguments is not None:
                add_arguments(s)
    return p


def version() -> str:
    """The installed package's version; the source tree's when it runs uninstalled."""
    try:
        return metadata.version("spreeze")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in COMMANDS else ""
    if command == "results":  # its own parser: options and key=value overrides in any order
        from spreeze.bench.results import main as results_main

        return guarded("results", lambda: results_main(argv[1:]))
    p = parser(command)
    args, extra = p.parse_known_args(argv)
    if args.command == "train":  # key=value overrides may come between or after options
        stray = [x for x in extra if x.startswith("-") or "=" not in x]
        if stray:
            p.error(f"unrecognized arguments: {' '.join(stray)}")
        args.overrides = list(args.overrides) + extra
    elif extra and args.command != "bench":
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    handler = import_module(COMMANDS[args.command][0]).HANDLERS[args.command]
    return guarded(args.command, lambda: handler(args))


def guarded(command: str, run: Callable[[], int]) -> int:
    """``run()``'s exit status; a SpreezeError is printed and exits 2."""
    try:
        return run()
    except SpreezeError as exc:
        print(f"spreeze {command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
