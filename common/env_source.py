"""`EnvSource`: how every process of a run makes its environment (no gymnasium import here:
the run config, which every service reads, names it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spreeze.common.errors import ConfigError


@dataclass(frozen=True)
class WrapperSpec:
    """One entry of ``env_wrappers``: a wrapper class by name (gymnasium's ``ClipAction``, or a
    user's ``my_package.wrappers:ActionRepeat``) and its keyword arguments."""

    name: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs)
        return f"{self.name}({args})"


def parse_wrappers(entries: Any) -> tuple[WrapperSpec, ...]:
    """``env_wrappers`` as written in config: a list whose entries are a wrapper's name, or a map
    of one name to its keyword arguments (``{"TimeAwareObservation": {"flatten": true}}``)."""
    if not isinstance(entries, (list, tuple)):
        raise ConfigError(f"env_wrappers={entries!r:.80} must be a list of wrapper names or "
                          "{name: {keyword: value}} maps")
    specs = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str) and entry.strip():
            specs.append(WrapperSpec(entry.strip()))
        elif (isinstance(entry, Mapping) and len(entry) == 1 and isinstance(name := next(iter(entry)), str)
              and name.strip() and isinstance(kwargs := entry[name] or {}, Mapping)
              and all(isinstance(k, str) for k in kwargs)):
            specs.append(WrapperSpec(name.strip(), tuple(sorted(kwargs.items()))))
        else:
            raise ConfigError(f"env_wrappers[{i}]={entry!r:.80} must be a wrapper name (gymnasium.wrappers' "
                              "ClipAction, or module:Class) or a map of one name to its keyword arguments")
    return tuple(specs)


@dataclass(frozen=True)
class EnvSource:
    """How every process of a run makes its environment: a gymnasium id (or gymnasium's
    ``module:EnvId``), keyword arguments for ``gymnasium.make`` (config ``env_kwargs``), modules
    to import first, which register a user's environments (config ``env_imports``), and the
    wrappers put around it, innermost first (config ``env_wrappers``)."""

    id: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    imports: tuple[str, ...] = ()
    wrappers: tuple[WrapperSpec, ...] = ()

    @staticmethod
    def of(env: str | EnvSource) -> EnvSource:
        return env if isinstance(env, EnvSource) else EnvSource(env)

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs)
        return f"env={self.id!r}" + (f" with env_kwargs {{{args}}}" if args else "")
