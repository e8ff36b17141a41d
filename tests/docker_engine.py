"""A real Docker engine for the real-path tests: images, containers and compose projects.

`ready()` says whether the tests may use the engine (SPREEZE_REAL_PATHS=1 and an engine that
answers), and why not. `images()` makes the base images without a registry
(docker/base.sh), fills the wheelhouse (docker/wheelhouse.sh) and builds the CPU image
offline the way the README says. `pip_passthrough()` gives a container this host's way of
installing Python packages, so that a bare container installs exactly like a fresh
machine of the same kind would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from spreeze.bench import engine
from spreeze.bench.engine import BARE_IMAGE, CPU_IMAGE, GL_IMAGE, ROOT, compose_command, sh, wait_for

__all__ = ["BARE_IMAGE", "CPU_IMAGE", "GL_IMAGE", "sh", "wait_for"]

ENABLE = "SPREEZE_REAL_PATHS"  # 1: build images and run containers on the local engine (.ci/run sets it)
PROJECT = "spreezeci"  # compose project of the tests: its containers, networks and volumes carry this name
SOURCE_IGNORE = shutil.ignore_patterns(".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".hypothesis",
                                       "*.egg-info", "*.whl", "keys")


def ready() -> str:
    """"" when the real-path tests can run here, else why not."""
    if os.environ.get(ENABLE) != "1":
        return f"set {ENABLE}=1 to build the images and run containers on the local Docker engine (.ci/run does)"
    if shutil.which("docker") is None:
        return "no docker command"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "the Docker engine does not answer (start dockerd)"
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    return ""


def images() -> None:
    engine.images(PROJECT)


def compose(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    return engine.compose(PROJECT, *args, env=env, timeout=timeout, check=check)


def pip_passthrough() -> list[str]:
    """`docker run` arguments giving a container this host's pip setup: its PIP_* variables, its
    configuration files, the local files and folders those name (find-links, file:// indexes,
    constraints, CA bundle), and pip's cache (shared, so that repeated runs download less)."""
    pip = [sys.executable, "-m", "pip"]
    args: list[str] = []
    mounts: set[str] = set()
    for key, value in os.environ.items():
        if key.startswith("PIP_"):
            args += ["-e", f"{key}={value}"]
            mounts |= local_paths(value)
    debug = sh(*pip, "config", "debug", check=False).stdout
    mounts |= {m.group(1) for m in re.finditer(r"^\s+(/\S+), exists: True$", debug, re.MULTILINE)}
    for line in sh(*pip, "config", "list", check=False).stdout.splitlines():
        mounts |= local_paths(line.partition("=")[2].strip("'\""))
    for path in sorted(mounts):
        args += ["-v", f"{path}:{path}:ro"]
    cache = sh(*pip, "cache", "dir", check=False).stdout.strip()
    if cache.startswith("/"):
        Path(cache).mkdir(parents=True, exist_ok=True)
        args += ["-v", f"{cache}:/root/.cache/pip"]
    return args


def local_paths(value: str) -> set[str]:
    """Existing absolute paths among the words of a pip setting. For a file:// index its parent
    folder: a simple index's pages link to files beside it (../files/...)."""
    found = set()
    for word in value.replace(",", " ").split():
        path = word.removeprefix("file://")
        if word.startswith("file://"):
            path = os.path.dirname(path.rstrip("/"))
        if path.startswith("/") and os.path.exists(path):
            found.add(path)
    return found


def source_copy(dest: Path) -> Path:
    """The project's files (no .git, virtualenvs, runs or wheels), as a fresh checkout holds them."""
    shutil.copytree(ROOT, dest, symlinks=True, ignore=SOURCE_IGNORE)
    return dest


def quick_start_commands() -> list[str]:
    """The README's two set-up commands, in order (its quick start's first bash block)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines() if line.strip()]


def containers(all_states: bool = True) -> list[dict[str, Any]]:
    """The compose project's containers as `docker inspect` describes them."""
    ids = sh("docker", "ps", "-q" + ("a" if all_states else ""), "--filter",
             f"label=com.docker.compose.project={PROJECT}").stdout.split()
    return json.loads(sh("docker", "inspect", *ids).stdout) if ids else []


def service_of(container: dict[str, Any]) -> str:
    return str(container["Config"]["Labels"]["com.docker.compose.service"])


def remove_stack(stack: str) -> None:
    """`docker stack rm` and wait until its containers, networks and run volume are gone."""
    sh("docker", "stack", "rm", stack, check=False)
    label = f"label=com.docker.stack.namespace={stack}"
    wait_for(lambda: not sh("docker", "ps", "-q", "--filter", label).stdout.strip()
             and not sh("docker", "network", "ls", "-q", "--filter", f"name={stack}_").stdout.strip(),
             180, "the stack gone")
    # the tasks' containers may still hold the volume for a moment after they are gone from `ps`
    wait_for(lambda: not sh("docker", "volume", "ls", "-q", "--filter", f"name={stack}_runs").stdout.strip()
             or sh("docker", "volume", "rm", f"{stack}_runs", check=False).returncode == 0, 120,
             "the run volume removed")


def read_volume_file(volume: str, path: str) -> str:
    """A file of one of the project's named volumes ("" when missing)."""
    return engine.volume_file(f"{PROJECT}_{volume}", path)
