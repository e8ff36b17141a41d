"""`python -m spreeze.services.supervisor`: start the run described on stdin, as
`spreeze.train` resolved it (YAML: config, pinned keys, resumed), and exit with its status:
0 at its budget or on SIGTERM, 130 after Ctrl-C, 1 when it failed, 2 for a config it refuses."""

from __future__ import annotations

import sys

import yaml

from spreeze.common.config import from_dict
from spreeze.common.errors import ConfigError
from spreeze.services.supervisor.start import start


def main() -> int:
    try:
        spec = yaml.safe_load(sys.stdin.read())
        cfg = from_dict(spec["config"])
        return start(cfg, frozenset(spec["pinned"]), resumed=bool(spec["resumed"]), quiet=False)
    except ConfigError as exc:
        print(f"spreeze: error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
