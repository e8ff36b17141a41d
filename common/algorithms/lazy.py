"""`lazy(name)`: a module imported on first attribute access, so an algorithm module imports
no torch until a learner uses it.

Every process reads the run config, and the config holds each algorithm's hyperparameter
dataclass, which lives in the algorithm's own module beside its networks and its update. So
an algorithm module must import without torch: it names torch and the torch helpers as
``lazy`` modules at run time and imports them for real under ``TYPE_CHECKING`` (for mypy)::

    if TYPE_CHECKING:
        import torch
    else:
        torch = lazy("torch")

The first ``torch.something`` inside a function imports torch; the attribute is then kept on
the proxy, so later accesses cost what a module attribute costs.
"""

from __future__ import annotations

import importlib
import types
from typing import Any


class LazyModule(types.ModuleType):
    """Stands for module ``name`` until an attribute is read; then imports it."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)  # copy, pickle and inspect probe dunders: no import for them
        value = getattr(importlib.import_module(self.__name__), attr)
        setattr(self, attr, value)
        return value


def lazy(name: str) -> Any:
    """A stand-in for module ``name`` that imports it when first used."""
    return LazyModule(name)


def resolve(namespace: dict[str, Any]) -> None:
    """Replace every `lazy` module in ``namespace`` (a module's globals) by the module itself.

    `make_parts` does this for the algorithm's module before building it: from then on its
    functions see real modules, which torch.compile traces like any other (a stand-in's
    ``__getattr__`` it would not)."""
    for key, value in list(namespace.items()):
        if isinstance(value, LazyModule):
            namespace[key] = importlib.import_module(value.__name__)
