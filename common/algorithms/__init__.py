"""TD3 and SAC as split actor / critic parts: the registry of algorithm descriptors, and the
factory that builds an algorithm's parts.

Each algorithm is one module holding its parts, its config dataclass and its `Algorithm`
descriptor (common/algorithms/descriptor.py); registering it here is one line in ALGORITHMS.
Seeds and sparse masks are drawn as common/algorithms/build.py describes, so a fused pair
and a split pair built with the same seed start identical.
"""

from __future__ import annotations

import numpy as np
import torch

from common.algorithms.base import ActorPart, Batch, CriticPart, State, fused_step
from common.algorithms.build import Sparsifier
from common.algorithms.descriptor import Algorithm
from common.algorithms.sac import SAC, SACConfig
from common.algorithms.td3 import TD3, TD3Config
from common.sparse import SparseConfig

__all__ = ["ALGORITHMS", "ALGOS", "ActorPart", "Algorithm", "Batch", "CriticPart", "SACConfig", "SparseConfig",
           "State", "TD3Config", "algorithm", "fused_step", "make_parts"]

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (TD3, SAC)}
ALGOS = tuple(ALGORITHMS)  # the algorithm names, for choices and validation


def algorithm(name: str) -> Algorithm:
    """The descriptor of algorithm ``name``; ``ValueError`` naming it when there is none."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"algo={name!r} must be one of {', '.join(ALGOS)}") from None


def make_parts(algo: str, obs_dim: int, act_dim: int, action_low: np.ndarray,
               action_high: np.ndarray, cfg: object, device: torch.device,
               shared: bool, seed: int = 0, *, sparse: SparseConfig | None = None,
               total_updates: int = 0) -> tuple[ActorPart, CriticPart]:
    """Build (actor part, critic part) for ``algo`` on ``device``.

    ``shared=True`` (fused learner): both parts hold the same module objects, so
    :func:`fused_step` is exactly standard TD3/SAC and ``load_*`` are no-ops.
    ``shared=False``: each part owns its copies, refreshed in place by ``load_*``.
    ``sparse``: sparse actor and critics (``None`` or network dense: the dense parts);
    ``total_updates``: the run's budget in critic updates, for the topology freeze (0: none).
    """
    spec = algorithm(algo)
    if not isinstance(cfg, spec.config):
        raise ValueError(f"algo={algo!r} with config {type(cfg).__name__}: expected {spec.config.__name__}")
    if sparse is not None:
        sparse.validate()
    cfg.validate()  # type: ignore[attr-defined]
    return spec.build(obs_dim, act_dim, action_low, action_high, cfg, device, shared, seed,
                      Sparsifier(sparse, seed, total_updates))
