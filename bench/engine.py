"""The local Docker engine, driven through its command line: shared by `bench containers` and the
real-path tests. Images come from docker/base.sh, docker/wheelhouse.sh and the compose file's
build (docs/containers.md, "Building without a package index or registry")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
BARE_IMAGE = "spreeze-base:bookworm"  # Debian bookworm, python3 and its venv module only
GL_IMAGE = "spreeze-base:bookworm-gl"  # the same plus libosmesa6: the CPU image's base
CPU_IMAGE = "spreeze-cpu:latest"
T = TypeVar("T")


def sh(*argv: str, timeout: float = 600, env: dict[str, str] | None = None, check: bool = True,
       cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run a command; with `check`, a non-zero exit raises AssertionError with its output's tail."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}\n{done.stdout[-4000:]}\n"
                             f"{done.stderr[-4000:]}")
    return done


def compose_command() -> list[str] | None:
    """`docker compose` (v2) where the plugin is installed, else Debian's `docker-compose` (1.29)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60).returncode == 0:
        return ["docker", "compose"]
    exe = shutil.which("docker-compose")
    return [exe] if exe else None


def compose(project: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    command = compose_command()
    if command is None:
        raise RuntimeError("neither `docker compose` nor `docker-compose` is installed")
    return sh(*command, "-p", project, *args, env=env, timeout=timeout, check=check)


def images(project: str) -> None:
    """Base images, wheelhouse and the CPU image, built offline (each step keeps what it has)."""
    sh("bash", "docker/base.sh", timeout=1200)
    sh("bash", "docker/wheelhouse.sh", timeout=1200, env={"PYTHON": sys.executable, "TORCH_INDEX": ""})
    compose(project, "build", "supervisor", env={"SPREEZE_BASE_IMAGE": GL_IMAGE}, timeout=1800)


def volume_file(volume: str, path: str) -> str:
    """A file of a named volume, read through a throw-away container ("" when missing)."""
    done = sh("docker", "run", "--rm", "-v", f"{volume}:/v:ro", "--entrypoint", "cat", CPU_IMAGE,
              f"/v/{path}", check=False, timeout=120)
    return done.stdout if done.returncode == 0 else ""


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_for(probe: Callable[[], T], timeout: float, what: str, every: float = 2.0) -> T:
    """probe()'s first truthy result; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
