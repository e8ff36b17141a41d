"""`spreeze conformance ROLE ENDPOINT`: check a service of ROLE from outside, through its
sockets only, against proto/SPEC.md (the kit is proto/conformance; it imports proto only).

ENDPOINT is where the kit binds the supervisor's control socket; start the service under
test with it as its control endpoint (SPREEZE_CONTROL=ENDPOINT python -m spreeze.services.replay,
or spreeze sampler --connect tcp://HOST:PORT). Exit 0 when every check passed.
"""

from __future__ import annotations

import argparse

from spreeze.cli.argtypes import positive_float


def conformance_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("role", choices=("replay", "sampler"), help="the role of the service under test")
    p.add_argument("endpoint", help="ipc://PATH or tcp://HOST:PORT the kit binds as the supervisor's control "
                                    "socket (its other sockets: beside it; docs/remote-samplers.md)")
    p.add_argument("--timeout", type=positive_float, default=60.0,
                   help="seconds to wait for the service to register (default 60)")
    p.add_argument("--run-dir", default="", help="replay: run directory given in the welcome (default: a temp dir)")


def cmd_conformance(args: argparse.Namespace) -> int:
    from spreeze.proto.conformance import run

    report = run(args.role, args.endpoint, args.timeout, args.run_dir)
    print(report.text(), flush=True)
    return 0 if report.failed == 0 and report.results else 1


PARSERS = {"conformance": conformance_arguments}
HANDLERS = {"conformance": cmd_conformance}
