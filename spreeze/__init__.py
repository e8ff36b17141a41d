"""Spreeze: high-throughput message-driven actor-critic RL for continuous control.

The installed library's one import name. The repository keeps its layers as top-level
folders (proto, common, services, bench, cli: DESIGN.md); each is a subpackage of
``spreeze`` (``spreeze.common.config``, ``python -m spreeze.services.sampler``), linked here
in a checkout and copied here by ``pip install``. The Python API is ``spreeze.train``,
``spreeze.load`` (spreeze/api.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Policy", "Run", "TrainingError", "export", "load", "train"]

if TYPE_CHECKING:
    from spreeze.api import Policy, Run, TrainingError, export, load, train


def __getattr__(name: str) -> Any:
    """The API (spreeze/api.py), imported on first use: a service that imports
    ``spreeze.common.x`` does not load it."""
    if name in __all__:
        from spreeze import api
        return getattr(api, name)
    raise AttributeError(f"module 'spreeze' has no attribute {name!r}")
