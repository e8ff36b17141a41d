"""What the plumbing knows about an algorithm: one `Algorithm` descriptor each.

Services, replay and the config ask the descriptor (common.algorithms
`algorithm(name)`) and never branch on an algorithm's name. The descriptor lives in the
algorithm's own module as ``ALGORITHM``, beside its hyperparameter dataclass, its networks
and its update (common/algorithms/td3.py, sac.py); that module imports no torch until
``build`` runs (common/algorithms/lazy.py), so samplers, replay, the visualizer and the
supervisor read a run config without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spreeze.common.algorithms.base import ActorPart, CriticPart


def no_choices(cfg: Any, on_gpu: bool) -> list[tuple[str, Any, str]]:
    """An algorithm whose defaults suit every device: the plan sets nothing for it."""
    return []


@dataclass(frozen=True)
class Algorithm:
    """One algorithm, as the rest of the system sees it."""

    name: str  # the name of the algorithm's section of the run config (td3.hidden=...)
    config: type  # its hyperparameter dataclass (frozen, with validate())
    build: Callable[..., tuple[ActorPart, CriticPart]]  # build(obs_dim, act_dim, low, high, config, device, shared, seed, sparsifier): its parts (imports torch)
    policy_delay: Callable[[Any], int]  # critic updates per actor update, from its config
    exploration_noise: Callable[[Any], float]  # Gaussian action noise (half action ranges) the learner writes into the acting policy
    actor_nets: tuple[str, ...]  # actor networks the critic part needs (weights message names), in load order
    # plan_choices(config, on_gpu): (key, value, reason) the start plan sets for this algorithm, given
    # the learners' device: a field of its own section ("critic_hidden") or a dotted key of the run
    # config ("learner.obs_norm"); a key the user set is kept. E.g. narrower networks on CPU.
    plan_choices: Callable[[Any, bool], list[tuple[str, Any, str]]] = no_choices

    def samples_per_update(self, cfg: Any, fused: bool) -> float:
        """Batches replay serves per critic update: the fused learner reuses one batch for both
        parts; split learners sample separately, the actor once per policy delay."""
        return 1.0 if fused else 1.0 + 1.0 / self.policy_delay(cfg)
