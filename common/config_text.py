"""A run config as plain data: a YAML file and ``key=value`` overrides merged into nested
dicts, before common/config.py builds and checks the dataclasses from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from spreeze.common.errors import ConfigError


def parse_override(text: str) -> tuple[list[str], Any]:
    """'replay.capacity=1000' -> (['replay', 'capacity'], 1000), values parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML: {exc}") from None
    return key.strip().split("."), value


def raw_config(path: str | Path | None, overrides: list[str] | None,
               base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plain data of a YAML file with overrides applied on top (not yet validated)."""
    data: dict[str, Any] = dict(base or {})
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping at top level")
        data = _merge(data, loaded)
    for text in overrides or []:
        keys, value = parse_override(text)
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {k} is not a section")
        node[keys[-1]] = value
    return data


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
