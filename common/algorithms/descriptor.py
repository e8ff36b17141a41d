"""What the plumbing knows about an algorithm: one `Algorithm` descriptor each, by name.

Services, replay and the config ask the descriptor (common.algorithms
`algorithm(name)`) and never branch on an algorithm's name. Descriptors and hyperparameters
import no torch (common/algorithms/configs.py): samplers, replay, the visualizer and the
supervisor read a run config without it, and only a learner imports the parts module that
`Algorithm.build` names. A new algorithm is its parts module (with a `build` function) plus
its hyperparameter dataclass and descriptor in configs.py, registered in
common/algorithms/__init__.py (and given its config section in common/config.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spreeze.common.algorithms.base import ActorPart, CriticPart


@dataclass(frozen=True)
class Algorithm:
    """One algorithm, as the rest of the system sees it."""

    name: str  # --algo value, and the name of the algorithm's section of the run config
    config: type  # its hyperparameter dataclass (frozen, with validate())
    parts: str  # the module (torch) whose build(obs_dim, act_dim, low, high, config, device, shared, seed, sparsifier) makes its parts
    policy_delay: Callable[[Any], int]  # critic updates per actor update, from its config
    exploration_noise: Callable[[Any], float]  # Gaussian action noise (half action ranges) the learner writes into the acting policy
    actor_nets: tuple[str, ...]  # actor networks the critic part needs (weights message names), in load order

    def build(self, *args: Any) -> tuple[ActorPart, CriticPart]:
        """The algorithm's actor and critic parts from freshly built networks: its parts
        module's ``build`` (imported here, so only a learner imports torch)."""
        parts: tuple[ActorPart, CriticPart] = importlib.import_module(self.parts).build(*args)
        return parts

    def samples_per_update(self, cfg: Any, fused: bool) -> float:
        """Batches replay serves per critic update: the fused learner reuses one batch for both
        parts; split learners sample separately, the actor once per policy delay."""
        return 1.0 if fused else 1.0 + 1.0 / self.policy_delay(cfg)
