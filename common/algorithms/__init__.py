"""TD3 and SAC as split actor / critic parts, and the factory that builds them.

Seeds: network init and each part's noise RNG come from ``seed`` through fixed, distinct
sub-seeds, so a fused pair and a split pair built with the same seed start identical and
draw identical noise (split with weight exchange every update == fused, bit for bit).
Sparse masks (``sparse``, see :mod:`common.sparse`) are drawn from ``seed`` too, and applied
before any target or peer copy is made, so every copy starts with the same topology.
"""

from __future__ import annotations

import numpy as np
import torch

from common.algorithms.base import (ActorPart, Batch, CriticPart, State, fused_step,
                                    frozen_copy, make_generator, seeded)
from common.algorithms.sac import SACActorPart, SACConfig, SACCriticPart
from common.algorithms.td3 import TD3ActorPart, TD3Config, TD3CriticPart
from common.networks import DeterministicActor, GaussianActor, TwinCritic
from common.sparse import SparseConfig, SparseTopology, build_topology

__all__ = ["ActorPart", "Batch", "CriticPart", "SACConfig", "SparseConfig", "State", "TD3Config",
           "fused_step", "make_parts", "ALGOS"]

ALGOS = ("td3", "sac")
# Sub-seed offsets: seed * _STREAMS + offset keeps every (seed, stream) pair distinct.
_STREAMS, _ACTOR_INIT, _CRITIC_INIT, _ACTOR_RNG, _CRITIC_RNG = 4, 0, 1, 2, 3


def _sub(seed: int, stream: int) -> int:
    return seed * _STREAMS + stream


def make_parts(algo: str, obs_dim: int, act_dim: int, action_low: np.ndarray,
               action_high: np.ndarray, cfg: TD3Config | SACConfig, device: torch.device,
               shared: bool, seed: int = 0, *, sparse: SparseConfig | None = None,
               total_updates: int = 0) -> tuple[ActorPart, CriticPart]:
    """Build (actor part, critic part) for ``algo`` on ``device``.

    ``shared=True`` (fused learner): both parts hold the same module objects, so
    :func:`fused_step` is exactly standard TD3/SAC and ``load_*`` are no-ops.
    ``shared=False``: each part owns its copies, refreshed in place by ``load_*``.
    ``sparse``: sparse actor and critics (``None`` or network dense: the dense parts);
    ``total_updates``: the run's budget in critic updates, for the topology freeze (0: none).
    """
    if sparse is not None:
        sparse.validate()
    sp = _Sparse(sparse, seed, total_updates)
    if algo == "td3" and isinstance(cfg, TD3Config):
        cfg.validate()
        return _td3(obs_dim, act_dim, action_low, action_high, cfg, device, shared, seed, sp)
    if algo == "sac" and isinstance(cfg, SACConfig):
        cfg.validate()
        return _sac(obs_dim, act_dim, action_low, action_high, cfg, device, shared, seed, sp)
    raise ValueError(f"algo={algo!r} with config {type(cfg).__name__}: expected one of "
                     f"'td3' + TD3Config, 'sac' + SACConfig")


class _Sparse:
    """How make_parts sparsifies a freshly built network (a no-op when dense)."""

    def __init__(self, cfg: SparseConfig | None, seed: int, total_updates: int) -> None:
        self.cfg, self.seed, self.total_updates = cfg, seed, total_updates

    def mask(self, module: torch.nn.Module, role: str, unit: int = 1) -> SparseTopology | None:
        """Mask ``module`` in place (before any copy of it is made); its topology or None."""
        return build_topology(module, self.cfg, self.seed, role, self.total_updates, unit)


def _track(topology: SparseTopology | None, target: torch.nn.Module) -> None:
    if topology is not None:
        topology.attach_target(target)


def _critics(obs_dim: int, act_dim: int, cfg: TD3Config | SACConfig, device: torch.device,
             seed: int, sp: _Sparse) -> tuple[TwinCritic, TwinCritic, SparseTopology | None]:
    critic = seeded(_sub(seed, _CRITIC_INIT), lambda: TwinCritic(obs_dim, act_dim, cfg.hidden))
    critic = critic.to(device)
    topology = sp.mask(critic, "critic")
    critic_target = frozen_copy(critic)
    _track(topology, critic_target)
    return critic, critic_target, topology


def _td3(obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, cfg: TD3Config,
         device: torch.device, shared: bool, seed: int,
         sp: _Sparse) -> tuple[TD3ActorPart, TD3CriticPart]:
    actor = seeded(_sub(seed, _ACTOR_INIT),
                   lambda: DeterministicActor(obs_dim, act_dim, cfg.hidden, low, high)).to(device)
    actor_topology = sp.mask(actor, "actor", unit=cfg.policy_delay)
    actor_target = frozen_copy(actor)
    _track(actor_topology, actor_target)
    critic, critic_target, critic_topology = _critics(obs_dim, act_dim, cfg, device, seed, sp)
    actor_part = TD3ActorPart(actor, actor_target, critic if shared else frozen_copy(critic),
                              cfg, shared, sparse=actor_topology)
    critic_part = TD3CriticPart(critic, critic_target,
                                actor_target if shared else frozen_copy(actor_target), cfg,
                                shared, make_generator(device, _sub(seed, _CRITIC_RNG)),
                                sparse=critic_topology)
    return actor_part, critic_part


def _sac(obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, cfg: SACConfig,
         device: torch.device, shared: bool, seed: int,
         sp: _Sparse) -> tuple[SACActorPart, SACCriticPart]:
    actor = seeded(_sub(seed, _ACTOR_INIT), lambda: GaussianActor(
        obs_dim, act_dim, cfg.hidden, low, high, cfg.log_std_min, cfg.log_std_max)).to(device)
    actor_topology = sp.mask(actor, "actor")
    critic, critic_target, critic_topology = _critics(obs_dim, act_dim, cfg, device, seed, sp)
    log_alpha = torch.tensor(float(np.log(cfg.init_alpha)), dtype=torch.float32, device=device)
    log_alpha = torch.nn.Parameter(log_alpha, requires_grad=cfg.autotune)
    target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy
    actor_part = SACActorPart(actor, critic if shared else frozen_copy(critic), log_alpha, cfg,
                              shared, make_generator(device, _sub(seed, _ACTOR_RNG)),
                              target_entropy, sparse=actor_topology)
    critic_part = SACCriticPart(critic, critic_target,
                                actor if shared else frozen_copy(actor),
                                log_alpha if shared else log_alpha.detach().clone(), cfg,
                                shared, make_generator(device, _sub(seed, _CRITIC_RNG)),
                                sparse=critic_topology)
    return actor_part, critic_part
