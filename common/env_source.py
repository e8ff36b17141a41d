"""`EnvSource`: how every process of a run makes its environment (no gymnasium import here:
the run config, which every service reads, names it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EnvSource:
    """How every process of a run makes its environment: a gymnasium id (or gymnasium's
    ``module:EnvId``), keyword arguments for ``gymnasium.make`` (config ``env_kwargs``) and
    modules to import first, which register a user's environments (config ``env_imports``)."""

    id: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    imports: tuple[str, ...] = ()

    @staticmethod
    def of(env: str | EnvSource) -> EnvSource:
        return env if isinstance(env, EnvSource) else EnvSource(env)

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs)
        return f"env={self.id!r}" + (f" with env_kwargs {{{args}}}" if args else "")
