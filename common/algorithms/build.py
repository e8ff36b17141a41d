"""`make_parts`, which builds an algorithm's actor and critic parts, and the helpers every
algorithm's `build` shares: seed streams, sparsification, the twin critics.

Seeds: network init and each part's noise RNG come from ``seed`` through fixed, distinct
sub-seeds, so a fused pair and a split pair built with the same seed start identical and
draw identical noise (split with weight exchange every update == fused, bit for bit).
Sparse masks (``sparse``, see :mod:`spreeze.common.sparse`) are drawn from ``seed`` too, and applied
before any target or peer copy is made, so every copy starts with the same topology.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import torch

from spreeze.common.algorithms import algorithm
from spreeze.common.algorithms.base import ActorPart, CriticPart, M, seeded
from spreeze.common.algorithms.lazy import resolve
from spreeze.common.networks import TwinCritic
from spreeze.common.sparse import SparseTopology, build_topology
from spreeze.common.sparse_config import SparseConfig

# Sub-seed offsets: seed * STREAMS + offset keeps every (seed, stream) pair distinct.
STREAMS, ACTOR_INIT, CRITIC_INIT, ACTOR_RNG, CRITIC_RNG = 4, 0, 1, 2, 3


def sub_seed(seed: int, stream: int) -> int:
    return seed * STREAMS + stream


class Sparsifier:
    """How a part's builder sparsifies a freshly built network (a no-op when dense)."""

    def __init__(self, cfg: SparseConfig | None, seed: int, total_updates: int) -> None:
        self.cfg, self.seed, self.total_updates = cfg, seed, total_updates

    def mask(self, module: torch.nn.Module, role: str, unit: int = 1) -> SparseTopology | None:
        """Mask ``module`` in place (before any copy of it is made); its topology or None."""
        return build_topology(module, self.cfg, self.seed, role, self.total_updates, unit)


def network(seed: int, stream: int, device: torch.device, factory: Callable[[], M]) -> M:
    """``factory()``'s network, initialised from sub-seed ``stream`` of ``seed``, on ``device``."""
    return seeded(sub_seed(seed, stream), factory).to(device)


def twin_critics(obs_dim: int, act_dim: int, hidden: tuple[int, ...], device: torch.device, seed: int,
                 sp: Sparsifier) -> tuple[TwinCritic, SparseTopology | None]:
    """Twin critics of hidden sizes ``hidden`` and their topology (None: dense)."""
    critic = network(seed, CRITIC_INIT, device, lambda: TwinCritic(obs_dim, act_dim, hidden))
    return critic, sp.mask(critic, "critic")


def generator(device: torch.device, seed: int, stream: int) -> torch.Generator:
    """A private RNG for one part (sub-seed ``stream``), so fused and split runs draw the same noise."""
    g = torch.Generator(device=device)
    g.manual_seed(sub_seed(seed, stream))
    return g


def make_parts(algo: str, obs_dim: int, act_dim: int, action_low: np.ndarray,
               action_high: np.ndarray, cfg: object, device: torch.device,
               shared: bool, seed: int = 0, *, sparse: SparseConfig | None = None,
               total_updates: int = 0) -> tuple[ActorPart, CriticPart]:
    """Build (actor part, critic part) for ``algo`` (a name or module path) on ``device``.

    ``shared=True`` (fused learner): both parts hold the same module objects, so
    :func:`fused_step` is exactly the standard algorithm and ``load_*`` are no-ops.
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
    resolve(vars(sys.modules[spec.build.__module__]))  # its update traced by torch.compile sees real modules
    return spec.build(obs_dim, act_dim, action_low, action_high, cfg, device, shared, seed,
                      Sparsifier(sparse, seed, total_updates))
