"""`spreeze sampler`, `spreeze keys` and `spreeze health`: attach to, secure and probe a run
from outside. Light on purpose: `spreeze health` imports no torch (the heavy parts of
`spreeze sampler` are imported when it runs)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from spreeze.cli.argtypes import positive_float


def sampler_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connect", required=True, metavar="tcp://HOST:PORT", help="the trainer's --listen address")
    p.add_argument("--keys", metavar="DIR", help="directory holding server.key and the client pair (CURVE)")
    p.add_argument("--key-name", default="client", help="client pair name in --keys (default client)")
    p.add_argument("--id", help="service id (default sampler-<host>-<pid>)")
    p.add_argument("--register-timeout", type=positive_float,
                   help="seconds to wait for the trainer's welcome (default 30)")


def cmd_sampler(args: argparse.Namespace) -> int:
    """A sampler process attaching to a running training from anywhere (`--connect`)."""
    from spreeze.common.service import ENV_CONTROL, ENV_KEY_NAME, ENV_KEYS, ENV_REGISTER_TIMEOUT, ENV_SERVICE_ID, run_service
    from spreeze.common.transport import check_endpoint

    os.environ[ENV_CONTROL] = check_endpoint(args.connect)
    if args.keys:
        os.environ[ENV_KEYS] = str(Path(args.keys).resolve())
        os.environ[ENV_KEY_NAME] = args.key_name
    if args.id:
        os.environ[ENV_SERVICE_ID] = args.id
    if args.register_timeout is not None:
        os.environ[ENV_REGISTER_TIMEOUT] = str(args.register_timeout)
    from spreeze.services.sampler.main import Sampler

    run_service(Sampler)  # exits 1 on a crash
    return 0


def keys_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Make a CURVE server key pair and a client key pair (authorized by the server) for "
                     "`spreeze train --listen ... --keys DIR` and `spreeze sampler --keys`.")
    p.add_argument("dir", metavar="DIR", help="directory for the keys (created; a server pair already there is kept)")
    p.add_argument("--client", default="client", help="name of the client pair (run again for more clients)")


def cmd_keys(args: argparse.Namespace) -> int:
    from spreeze.common.curve_auth import make_keys

    d = make_keys(args.dir, args.client)
    print(f"CURVE keys in {d}: server pair server.key(_secret), client pair {args.client}.key(_secret), "
          f"authorized/{args.client}.key.\nTrainer: spreeze train --listen tcp://HOST:PORT --keys {d}\n"
          f"Remote sampler host: copy {d / 'server.key'} and {d / (args.client + '.key_secret')} into one "
          f"directory D there, then: spreeze sampler --connect tcp://HOST:PORT --keys D"
          + (f" --key-name {args.client}" if args.client != "client" else ""))
    return 0


def health_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("endpoint", nargs="?", help="health endpoint (default: $SPREEZE_HEALTH)")
    p.add_argument("--timeout", type=positive_float, default=3.0, help="seconds to wait for the answer (default 3)")


def cmd_health(args: argparse.Namespace) -> int:
    from spreeze.common.health_probe import ENV_HEALTH, probe

    endpoint = args.endpoint or os.environ.get(ENV_HEALTH)
    if not endpoint:
        print(f"spreeze health: give an endpoint or set {ENV_HEALTH}", file=sys.stderr)
        return 2
    ok, detail = probe(endpoint, args.timeout)
    print(f"{'healthy' if ok else 'unhealthy'}: {detail}")
    return 0 if ok else 1


PARSERS = {"sampler": sampler_arguments, "keys": keys_arguments, "health": health_arguments}
HANDLERS = {"sampler": cmd_sampler, "keys": cmd_keys, "health": cmd_health}
