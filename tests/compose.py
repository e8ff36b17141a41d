"""Reading docker-compose.yml the way Docker Compose does, for tests on a machine without Docker.

`services(variables, profiles)` gives each active service's command, environment,
healthcheck and replica count after compose's variable interpolation (`${VAR}`,
`${VAR:-default}`, `${VAR-default}`, `$$`), with `.env` as the defaults. `Local` then
maps the container paths of one run (named volumes, the container-local health socket,
the image's /app/configs, the published tcp port) to local ones, so each compose
service can be started as a local process with the environment compose would give it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOTENV = ROOT / ".env"
IMAGE_CONFIGS = "/app/configs"  # where the Dockerfiles put configs/
HEALTH_SOCKET = "/tmp/spreeze-health"  # container-local: one per container
_VAR = re.compile(r"\$(?:\$|\{(\w+)(?:(:?-)([^}]*))?\}|(\w+))")


def dotenv(path: Path = DOTENV) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def interpolate(value: Any, variables: dict[str, str]) -> Any:
    """Compose's interpolation over every string of a parsed file."""
    if isinstance(value, dict):
        return {k: interpolate(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, variables) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        got = variables.get(name)
        if m.group(2) == ":-":
            return got if got else m.group(3)
        if m.group(2) == "-":
            return got if got is not None else m.group(3)
        return got or ""
    return _VAR.sub(one, value)


@dataclass
class ComposeService:
    name: str
    command: list[str]
    environment: dict[str, str]
    healthcheck: list[str]
    replicas: int
    volumes: dict[str, str] = field(default_factory=dict)  # target -> named volume
    profiles: list[str] = field(default_factory=list)


def services(overrides: dict[str, str] | None = None) -> dict[str, ComposeService]:
    """The services compose would start with .env plus `overrides` (COMPOSE_PROFILES included)."""
    variables = {**dotenv(), **(overrides or {})}
    data = interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), variables)
    profiles = {p for p in variables.get("COMPOSE_PROFILES", "").split(",") if p}
    out = {}
    for name, svc in data["services"].items():
        if svc.get("profiles") and not profiles & set(svc["profiles"]):
            continue
        test = svc.get("healthcheck", {}).get("test", [])
        out[name] = ComposeService(
            name=name, command=[str(c) for c in svc["command"]],
            environment={k: str(v) for k, v in (svc.get("environment") or {}).items()},
            healthcheck=[str(c) for c in test[1:]] if test[:1] == ["CMD"] else [],
            replicas=int(svc.get("deploy", {}).get("replicas", 1)),
            volumes={v.split(":")[1]: v.split(":")[0] for v in svc.get("volumes", [])},
            profiles=list(svc.get("profiles", [])))
    return out


@dataclass
class Local:
    """Container paths of one run mapped to local ones."""

    volumes: dict[str, Path]  # named volume -> local directory
    tcp: dict[str, str]  # endpoint in the compose file -> local endpoint

    def paths(self, svc: ComposeService, replica: int, scratch: Path) -> dict[str, str]:
        mapping = {target: str(self.volumes[vol]) for target, vol in svc.volumes.items()}
        health = scratch / f"{svc.name}-{replica}"
        health.mkdir(parents=True, exist_ok=True)
        mapping[HEALTH_SOCKET] = str(health / "health")
        mapping[IMAGE_CONFIGS] = str(ROOT / "configs")
        mapping.update(self.tcp)
        return mapping

    @staticmethod
    def apply(value: str, mapping: dict[str, str]) -> str:
        for old in sorted(mapping, key=len, reverse=True):
            value = value.replace(old, mapping[old])
        return value

    def argv(self, words: list[str], mapping: dict[str, str]) -> list[str]:
        """The image's entry points run by this interpreter: `spreeze` and `python`."""
        words = [self.apply(w, mapping) for w in words]
        head = {"spreeze": [sys.executable, "-m", "spreeze.cli"], "python": [sys.executable]}[words[0]]
        return head + words[1:]

    def env(self, svc: ComposeService, mapping: dict[str, str]) -> dict[str, str]:
        return {k: self.apply(v, mapping) for k, v in svc.environment.items()}
