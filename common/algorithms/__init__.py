"""TD3 and SAC: the registry of algorithm descriptors and their hyperparameters.

Importing this package imports no torch, so every service can read a run config; the parts
(common/algorithms/td3.py, sac.py) and `make_parts` (common/algorithms/build.py), which
builds them, are the learners' alone. Each algorithm's hyperparameter dataclass and
`Algorithm` descriptor live in common/algorithms/configs.py; registering one is one line in
ALGORITHMS.
"""

from __future__ import annotations

from spreeze.common.algorithms.configs import SAC, TD3, SACConfig, TD3Config
from spreeze.common.algorithms.descriptor import Algorithm
from spreeze.common.sparse_config import SparseConfig

__all__ = ["ALGORITHMS", "ALGOS", "Algorithm", "SACConfig", "SparseConfig", "TD3Config", "algorithm"]

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (TD3, SAC)}
ALGOS = tuple(ALGORITHMS)  # the algorithm names, for choices and validation


def algorithm(name: str) -> Algorithm:
    """The descriptor of algorithm ``name``; ``ValueError`` naming it when there is none."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"algo={name!r} must be one of {', '.join(ALGOS)}") from None
