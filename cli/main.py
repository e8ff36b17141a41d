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

MORE = ("More: README.md (start here), the manual in docs/ (docs/index.md; `mkdocs serve` builds it as a\n"
        "site) and proto/SPEC.md (the wire protocol), in the repository. Each command has --help.")

# command -> (module defining its PARSERS and HANDLERS entries, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("spreeze.cli.train", "train an agent with every service as a local process"),
    "eval": ("spreeze.cli.tools", "evaluate a run's best checkpoint"),
    "export": ("spreeze.cli.tools", "write a run's policy as TorchScript or ONNX, to run without Spreeze"),
    "plot": ("spreeze.cli.tools", "PNG learning curves (mean ± std over several runs) and throughput"),
    "bench": ("spreeze.cli.tools", f"benchmarks: {' | '.join(BENCHES)} (each has --help)"),
    "results": ("spreeze.cli.tools", "train dense | static | ds over seeds, table in results/<env>.md (has --help)"),
    "sampler": ("spreeze.cli.remote", "attach a sampler to a running training (spreeze train --listen)"),
    "keys": ("spreeze.cli.remote", "make CURVE server and client key pairs for tcp endpoints"),
    "health": ("spreeze.cli.remote", "ask a service over its health socket; exit 0 when it answers healthy"),
    "conformance": ("spreeze.cli.conformance", "check a replay or sampler from outside against proto/SPEC.md"),
}

# command -> the docs pages (files in the repository) that say more, named at the end of its --help
DOCS: dict[str, str] = {
    "train": "docs/training.md, docs/reference/configuration.md",
    "eval": "docs/training.md",
    "export": "docs/python-api.md",
    "plot": "docs/watching.md",
    "bench": "docs/performance.md",
    "results": "docs/performance.md",
    "sampler": "docs/remote-samplers.md",
    "keys": "docs/remote-samplers.md",
    "health": "docs/containers.md",
    "conformance": "docs/protocol.md",
}


def docs_line(command: str) -> str:
    """The last line of `command`'s --help: where the docs say more."""
    return f"docs: {DOCS[command]}"


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
        s.epilog = "\n\n".join(text for text in (s.epilog, docs_line(name)) if text)
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
        from spreeze.bench.results import parser as results_parser

        if {"-h", "--help"} & set(argv[1:]):  # its own parser's help, plus where the docs say more
            rp = results_parser()
            rp.epilog = "\n\n".join(text for text in (rp.epilog, docs_line("results")) if text)
            rp.print_help()
            return 0
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
