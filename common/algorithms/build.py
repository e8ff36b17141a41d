"""Helpers every algorithm's `build` shares: seed streams, sparsification, the twin critics.

Seeds: network init and each part's noise RNG come from ``seed`` through fixed, distinct
sub-seeds, so a fused pair and a split pair built with the same seed start identical and
draw identical noise (split with weight exchange every update == fused, bit for bit).
Sparse masks (``sparse``, see :mod:`common.sparse`) are drawn from ``seed`` too, and applied
before any target or peer copy is made, so every copy starts with the same topology.
"""

from __future__ import annotations

from typing import Any

import torch

from common.algorithms.base import frozen_copy, seeded
from common.networks import TwinCritic
from common.sparse import SparseConfig, SparseTopology, build_topology

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


def track(topology: SparseTopology | None, target: torch.nn.Module) -> None:
    """Let a sparse topology prune ``target`` (a target network) with its online network."""
    if topology is not None:
        topology.attach_target(target)


def critics(obs_dim: int, act_dim: int, cfg: Any, device: torch.device, seed: int,
            sp: Sparsifier) -> tuple[TwinCritic, TwinCritic, SparseTopology | None]:
    """Twin critics of hidden sizes ``cfg.hidden``, their target copy, and their topology."""
    critic = seeded(sub_seed(seed, CRITIC_INIT), lambda: TwinCritic(obs_dim, act_dim, cfg.hidden))
    critic = critic.to(device)
    topology = sp.mask(critic, "critic")
    critic_target = frozen_copy(critic)
    track(topology, critic_target)
    return critic, critic_target, topology
