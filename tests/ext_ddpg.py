"""DDPG (Lillicrap et al. 2016), written the way a user adds an algorithm: this one module,
outside the package, run with ``algo=tests.ext_ddpg`` (its config section: ``ddpg``).

A deterministic actor and one critic, each with a target network Polyak-averaged every
update; exploration by Gaussian action noise in the samplers (the paper used an
Ornstein-Uhlenbeck process; Gaussian noise does as well, Fujimoto et al. 2018). Like the
built-ins it imports torch only when a learner builds it (common/algorithms/lazy.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spreeze.common.algorithms.checkpointed import Checkpointed
from spreeze.common.algorithms.checks import check, check_hidden
from spreeze.common.algorithms.descriptor import Algorithm
from spreeze.common.algorithms.lazy import lazy

if TYPE_CHECKING:
    import numpy as np
    import torch

    from spreeze.common import networks
    from spreeze.common.algorithms import base, build as builder
    from spreeze.common.algorithms.base import Batch, CompiledUpdate, Named, State
    from spreeze.common.algorithms.build import Sparsifier
    from spreeze.common.algorithms.compiled import CompileOptions
    from spreeze.common.networks import DeterministicActor
    from spreeze.common.sparse import SparseTopology
else:
    torch, base = lazy("torch"), lazy("spreeze.common.algorithms.base")
    builder = lazy("spreeze.common.algorithms.build")
    networks = lazy("spreeze.common.networks")


@dataclass(frozen=True)
class DDPGConfig:
    """DDPG hyperparameters (Lillicrap et al. 2016, with TD3's paper's learning rates)."""

    hidden: tuple[int, ...] = (64, 64)  # MLP hidden sizes, actor and critic
    actor_lr: float = 1e-3  # Adam learning rate of the actor
    critic_lr: float = 1e-3  # Adam learning rate of the critic
    gamma: float = 0.99  # discount factor
    tau: float = 0.005  # Polyak rate of the target networks
    exploration_noise: float = 0.1  # std of sampler Gaussian noise, in half action ranges

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        check_hidden("ddpg.hidden", self.hidden)
        for name in ("actor_lr", "critic_lr"):
            check(getattr(self, name) > 0, f"ddpg.{name}", getattr(self, name), "must be > 0")
        check(0 <= self.gamma <= 1, "ddpg.gamma", self.gamma, "must be in [0, 1]")
        check(0 < self.tau <= 1, "ddpg.tau", self.tau, "must be in (0, 1]")
        check(self.exploration_noise >= 0, "ddpg.exploration_noise", self.exploration_noise, "must be >= 0")


def q(critic: torch.nn.Module, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Q(s, a) of an MLP critic on concat(obs, action): [B]."""
    return critic(torch.cat([obs, action], dim=-1)).squeeze(-1)


class DDPGActorPart(Checkpointed):
    """Actor, its target, and (a copy of, unless shared) the critic."""

    algo = "ddpg"
    role = "actor part"
    policy_delay = 1

    def __init__(self, actor: DeterministicActor, critic: torch.nn.Module, cfg: DDPGConfig, shared: bool,
                 sparse: SparseTopology | None) -> None:
        self.actor, self.critic, self.cfg, self.shared, self.sparse = actor, critic, cfg, shared, sparse
        self.target = base.Target(actor, sparse, cfg.tau)
        self.updates = 0
        self.fast: CompiledUpdate | None = None  # no compiled step: it updates eagerly
        self.params = base.params(actor)
        self.opt = base.adam(self.params, cfg.actor_lr, 0.0)

    def compile(self, options: CompileOptions) -> None:
        """No compiled step: the eager update always."""

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One deterministic policy gradient step on -Q(s, pi(s)), then Polyak the target actor."""
        obs = batch["obs"]
        loss = -q(self.critic, obs, self.actor(obs)).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward(inputs=self.params)
        self.opt.step()
        self.updates += 1
        base.sparse_step(self.sparse, self.opt, self.updates)
        self.target.update()
        return base.scalars([("actor_loss", loss)]) if want_metrics else {}

    def actor_state(self) -> State:
        return base.module_state(self.actor)

    def target_actor_state(self) -> State | None:
        return base.module_state(self.target.network)

    def extras(self) -> dict[str, float]:
        return {}

    def load_critic(self, state: State) -> None:
        if not self.shared:
            base.load_module_state(self.critic, state)

    def named(self) -> Named:
        named: Named = {"actor": self.actor, "actor_target": self.target.network, "opt": self.opt}
        return named if self.shared else {**named, "critic": self.critic}



class DDPGCriticPart(Checkpointed):
    """The critic, its target, and (a copy of, unless shared) the target actor."""

    algo = "ddpg"
    role = "critic part"

    def __init__(self, critic: torch.nn.Module, actor_target: DeterministicActor, cfg: DDPGConfig,
                 shared: bool, sparse: SparseTopology | None) -> None:
        self.critic, self.actor_target, self.cfg, self.shared, self.sparse = critic, actor_target, cfg, shared, sparse
        self.target = base.Target(critic, sparse, cfg.tau)
        self.updates = 0
        self.fast: CompiledUpdate | None = None
        self.params = base.params(critic)
        self.opt = base.adam(self.params, cfg.critic_lr, 0.0)

    def compile(self, options: CompileOptions) -> None:
        """No compiled step: the eager update always."""

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """Regress Q(s, a) on r + gamma * (1 - done) * Q'(s', pi'(s')), then Polyak the target critic."""
        with torch.no_grad():
            next_obs = batch["next_obs"]
            next_q = q(self.target.network, next_obs, self.actor_target(next_obs))
            y = batch["reward"] + self.cfg.gamma * (1.0 - batch["done"]) * next_q
        pred = q(self.critic, batch["obs"], batch["action"])
        loss = torch.nn.functional.mse_loss(pred, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.updates += 1
        base.sparse_step(self.sparse, self.opt, self.updates)
        self.target.update()
        return base.scalars([("critic_loss", loss), ("q_mean", pred.mean())]) if want_metrics else {}

    def critic_state(self) -> State:
        return base.module_state(self.critic)

    def load_actor(self, state: State, target: State | None, extras: Mapping[str, float]) -> None:
        if self.shared:
            return
        if target is None:
            raise ValueError("the DDPG critic part needs the target actor's state, got None")
        base.load_module_state(self.actor_target, target)

    def named(self) -> Named:
        named: Named = {"critic": self.critic, "critic_target": self.target.network, "opt": self.opt}
        return named if self.shared else {**named, "actor_target": self.actor_target}



def build(obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, cfg: DDPGConfig,
          device: torch.device, shared: bool, seed: int,
          sp: Sparsifier) -> tuple[DDPGActorPart, DDPGCriticPart]:
    """DDPG's parts from common/networks.py's layers (see common.algorithms.build.make_parts)."""
    actor = builder.network(seed, builder.ACTOR_INIT, device,
                            lambda: networks.DeterministicActor(obs_dim, act_dim, cfg.hidden, low, high))
    critic = builder.network(seed, builder.CRITIC_INIT, device,
                             lambda: networks.mlp(obs_dim + act_dim, cfg.hidden, 1))
    actor_sparse, critic_sparse = sp.mask(actor, "actor"), sp.mask(critic, "critic")
    actor_part = DDPGActorPart(actor, critic if shared else base.frozen_copy(critic), cfg, shared, actor_sparse)
    actor_target = actor_part.target.network
    critic_part = DDPGCriticPart(critic, actor_target if shared else base.frozen_copy(actor_target), cfg,
                                 shared, critic_sparse)
    return actor_part, critic_part


ALGORITHM = Algorithm(name="ddpg", config=DDPGConfig, build=build,
                      policy_delay=lambda cfg: 1,
                      exploration_noise=lambda cfg: cfg.exploration_noise,
                      actor_nets=("actor", "actor_target"))  # TD targets use the target actor
