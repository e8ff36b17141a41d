"""Test-only service module: exits at once with code 3 (run as `python -m tests.crashing_service`)."""

import sys

print("crashing_service: exiting with code 3 on purpose", file=sys.stderr, flush=True)
raise SystemExit(3)
