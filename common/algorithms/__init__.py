"""The algorithm registry: an algorithm is one module that defines ``ALGORITHM``.

An algorithm module (common/algorithms/td3.py, sac.py, or a user's own, e.g.
tests/ext_ddpg.py) holds everything that is the algorithm's: its hyperparameter dataclass,
its `Algorithm` descriptor (``ALGORITHM``), its networks (from common/networks.py's
layers), its actor and critic parts with their update, and what it checkpoints, by name.

``algo`` in the run config is a built-in name (td3, sac: short for their modules here) or an
importable module path (``algo=mypackage.ddpg``); `algorithm` imports that module in
whichever process asks, so every service finds a user's algorithm the same way it finds a
built-in one, and the run config gets the section named ``ALGORITHM.name``. Adding an
algorithm is writing that one module.

Torch-free: every service reads the run config, so an algorithm module must import without
torch. It imports torch and the torch helpers (common/algorithms/base.py, build.py,
common/networks.py) under ``TYPE_CHECKING`` for the type checker and as `lazy` modules at
run time (common/algorithms/lazy.py): torch is imported when a learner first builds or
trains the algorithm, never by reading its config (tests/test_algorithms.py checks it).
"""

from __future__ import annotations

import importlib

from spreeze.common.algorithms.descriptor import Algorithm
from spreeze.common.sparse_config import SparseConfig

__all__ = ["ALGOS", "BUILTIN", "Algorithm", "SparseConfig", "algorithm", "registered"]

BUILTIN = {"td3": "spreeze.common.algorithms.td3", "sac": "spreeze.common.algorithms.sac",
           "crossq": "spreeze.common.algorithms.crossq"}  # short names of the built-ins
ALGOS = tuple(BUILTIN)  # the built-in names (every run config has their sections)
DESCRIPTOR = "ALGORITHM"  # the name an algorithm module gives its descriptor

_registry: dict[str, Algorithm] = {}  # descriptor name -> descriptor, of every module imported so far
_by_spec: dict[str, Algorithm] = {}  # `algo` value (name or module path) -> descriptor


def algorithm(spec: str) -> Algorithm:
    """The descriptor of ``spec``: a built-in name, a registered algorithm's name, or a module
    path whose module defines ``ALGORITHM`` (imported now). ``ValueError`` naming ``spec``
    when it is none of these."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"algo={spec!r} must be one of {', '.join(ALGOS)} or a module path defining {DESCRIPTOR}")
    found = _by_spec.get(spec) or _registry.get(spec)
    if found is not None:
        return found
    path = BUILTIN.get(spec, spec)
    try:
        module = importlib.import_module(path)
    except ImportError as exc:
        if "." not in spec and spec == path:
            raise ValueError(f"algo={spec!r} must be one of {', '.join(ALGOS)} or a module path defining "
                             f"{DESCRIPTOR}") from None
        raise ValueError(f"algo={spec!r}: module {path!r} cannot be imported: {exc}") from None
    descriptor = getattr(module, DESCRIPTOR, None)
    if not isinstance(descriptor, Algorithm):
        raise ValueError(f"algo={spec!r}: module {path!r} defines no {DESCRIPTOR} = Algorithm(...)")
    _by_spec[spec] = register(descriptor)
    return descriptor


def register(descriptor: Algorithm) -> Algorithm:
    """Record ``descriptor`` under its name; ``ValueError`` when another one has that name."""
    if not descriptor.name or "." in descriptor.name:
        raise ValueError(f"algorithm name {descriptor.name!r} must be a plain, non-empty name (a config section)")
    held = _registry.setdefault(descriptor.name, descriptor)
    if held is not descriptor:
        raise ValueError(f"algorithm name {descriptor.name!r} is taken by another algorithm "
                         f"({held.build.__module__}); give {descriptor.build.__module__}'s another name")
    return descriptor


def registered() -> tuple[str, ...]:
    """The built-in names, then every other algorithm registered in this process so far."""
    for name in ALGOS:
        algorithm(name)
    return (*ALGOS, *(name for name in _registry if name not in BUILTIN))
