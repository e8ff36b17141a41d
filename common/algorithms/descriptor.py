"""What the plumbing knows about an algorithm: one `Algorithm` descriptor each, by name.

Services, replay, the config and the numpy actor ask the descriptor (common.algorithms
`algorithm(name)`) and never branch on an algorithm's name. A new algorithm is one file
holding its parts, its hyperparameter dataclass and its descriptor, registered in
common/algorithms/__init__.py (and given its config section in common/config.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from common.algorithms.base import ActorPart, CriticPart
    from common.algorithms.build import Sparsifier

Build = Callable[[int, int, np.ndarray, np.ndarray, Any, torch.device, bool, int, "Sparsifier"],
                 "tuple[ActorPart, CriticPart]"]
"""(obs_dim, act_dim, action_low, action_high, config, device, shared, seed, sparsifier) -> parts."""


@dataclass(frozen=True)
class NumpyLayout:
    """How the numpy actor (samplers, evaluator) reads the actor's weights."""

    trunk: str  # module holding the Linear layers, in order ("<trunk>.<i>.weight")
    head: str | None  # a last Linear layer outside the trunk (None: the trunk's last layer is the output)
    stochastic: bool  # output: mean and log-std pre-activation of a tanh-Gaussian (else the action itself)


@dataclass(frozen=True)
class Algorithm:
    """One algorithm, as the rest of the system sees it."""

    name: str  # --algo value, and the name of the algorithm's section of the run config
    config: type  # its hyperparameter dataclass (frozen, with validate())
    build: Build  # its actor and critic parts, from freshly built networks
    policy_delay: Callable[[Any], int]  # critic updates per actor update, from its config
    exploration_noise: Callable[[Any], float]  # samplers' Gaussian action noise (half action ranges), from its config
    actor_nets: tuple[str, ...]  # actor networks the critic part needs (weights message names), in load order
    numpy_actor: NumpyLayout  # how samplers and the evaluator act without torch

    def samples_per_update(self, cfg: Any, fused: bool) -> float:
        """Batches replay serves per critic update: the fused learner reuses one batch for both
        parts; split learners sample separately, the actor once per policy delay."""
        return 1.0 if fused else 1.0 + 1.0 / self.policy_delay(cfg)
