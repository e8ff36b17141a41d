"""The configuration reference: every run configuration key with its default and its doc,
read from the comments beside the fields in the config dataclasses (`spreeze train --help`,
the docs site's configuration page)."""

from __future__ import annotations

import dataclasses
import inspect
import typing

from spreeze.common.config import SECTIONS, Config


def field_docs(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, doc) for every leaf field, docs taken from the source comments."""
    source = inspect.getsource(cls)
    docs = {}
    for line in source.splitlines():
        stripped = line.strip()
        if ":" in stripped and "#" in stripped and not stripped.startswith(("#", "def", "raise")):
            docs[stripped.split(":")[0].strip()] = stripped.split("#", 1)[1].strip()
    rows = []
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        if f.metadata.get(SECTIONS):
            for name, section in f.default_factory().items():  # type: ignore[misc,operator]
                rows += field_docs(type(section), f"{prefix}{name}.")
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            rows += field_docs(hint, f"{prefix}{f.name}.")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
            rows.append((f"{prefix}{f.name}", repr(default), docs.get(f.name, "")))
    return rows
