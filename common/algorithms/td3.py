"""TD3 (Fujimoto et al. 2018): its hyperparameters, its descriptor, its networks and its update,
split into an actor part and a critic part.

Target schedule (original TD3): the critic steps every update; every ``policy_delay``
critic updates the actor steps and *all* targets are Polyak-updated. The critic part
counts its own updates and Polyak-updates the critic targets on every ``policy_delay``-th
one; :meth:`TD3ActorPart.update` Polyak-updates the target actor after each actor step.
With :func:`~common.algorithms.base.fused_step` this is exactly the reference algorithm.

Imports no torch until `build` runs (common/algorithms/lazy.py): the config is read by
every service.
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
    from spreeze.common.algorithms import base, build as builder, steps
    from spreeze.common.algorithms.base import Batch, CompiledUpdate, Named, State, Target
    from spreeze.common.algorithms.build import Sparsifier
    from spreeze.common.algorithms.compiled import CompileOptions
    from spreeze.common.networks import DeterministicActor, TwinCritic
    from spreeze.common.sparse import SparseTopology
else:
    torch, base, builder, steps = lazy("torch"), lazy("spreeze.common.algorithms.base"), \
        lazy("spreeze.common.algorithms.build"), lazy("spreeze.common.algorithms.steps")
    networks = lazy("spreeze.common.networks")


@dataclass(frozen=True)
class TD3Config:
    """TD3 hyperparameters (defaults: the TD3 paper / DS-TD3 paper)."""

    hidden: tuple[int, ...] = (64, 64)  # MLP hidden sizes, actor and critics (paper: 256, 256; 64-64 learns HalfCheetah as fast per step at ~1/5 the CPU)
    actor_lr: float = 1e-3  # Adam learning rate of the actor
    critic_lr: float = 1e-3  # Adam learning rate of the twin critics
    weight_decay: float = 0.0  # Adam (L2) weight decay; the DS-TD3 paper used 2e-4
    gamma: float = 0.99  # discount factor
    tau: float = 0.005  # Polyak rate of the target networks
    policy_noise: float = 0.2  # std of target policy smoothing noise, in half action ranges
    noise_clip: float = 0.5  # clip of that noise, in half action ranges
    policy_delay: int = 2  # critic updates per actor update (and per target update)
    exploration_noise: float = 0.1  # std of sampler Gaussian noise, in half action ranges

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        check_hidden("td3.hidden", self.hidden)
        for name in ("actor_lr", "critic_lr"):
            value = getattr(self, name)
            check(value > 0, f"td3.{name}", value, "must be > 0")
        for name in ("weight_decay", "policy_noise", "noise_clip", "exploration_noise"):
            value = getattr(self, name)
            check(value >= 0, f"td3.{name}", value, "must be >= 0")
        check(0 <= self.gamma <= 1, "td3.gamma", self.gamma, "must be in [0, 1]")
        check(0 < self.tau <= 1, "td3.tau", self.tau, "must be in (0, 1]")
        check(isinstance(self.policy_delay, int) and self.policy_delay >= 1,
              "td3.policy_delay", self.policy_delay, "must be an int >= 1")


def smoothed_action(cfg: TD3Config, actor_target: torch.nn.Module, scale: torch.Tensor, low: torch.Tensor,
                    high: torch.Tensor, next_obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Target policy smoothing: clip(pi'(s') + clip(noise * sigma, -c, c) * scale, low, high)."""
    a = actor_target(next_obs)
    noise = (noise * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
    return torch.clamp(torch.addcmul(a, noise, scale), low, high)


def td_target(cfg: TD3Config, actor_target: torch.nn.Module, target_params: list[torch.Tensor],
              scale: torch.Tensor, low: torch.Tensor, high: torch.Tensor, next_obs: torch.Tensor,
              reward: torch.Tensor, done: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """r + gamma * (1 - done) * min(Q1', Q2')(s', smoothed_action(s')), the target critics batched."""
    tq = networks.twin_q(target_params, next_obs, smoothed_action(cfg, actor_target, scale, low, high,
                                                                   next_obs, noise))
    return torch.addcmul(reward, 1.0 - done, torch.minimum(tq[0], tq[1]), value=cfg.gamma)


def actor_loss(actor: torch.nn.Module, names: list[str], critic_params: list[torch.Tensor],
               params: list[torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
    """The deterministic policy gradient's loss -Q1(s, pi(s)), from the actor's parameters."""
    action = torch.func.functional_call(actor, dict(zip(names, params)), (obs,))
    return -networks.q1_only(critic_params, obs, action).mean()


class TD3ActorPart(Checkpointed):
    """Actor, target actor and (a copy of, unless shared) the online twin critic.

    ``load_critic`` copies critic weights in place; with ``shared=True`` the critic *is*
    the critic part's module and ``load_critic`` is a no-op. ``sparse``: the actor's masks
    (re-applied after each step, target pruned after each Polyak update), ``None`` when dense.
    """

    algo = "td3"
    role = "actor part"

    def __init__(self, actor: DeterministicActor, critic: TwinCritic, cfg: TD3Config, shared: bool,
                 sparse: SparseTopology | None = None) -> None:
        self.actor, self.critic = actor, critic
        self.cfg, self.shared, self.sparse = cfg, shared, sparse
        self.target: Target[DeterministicActor] = base.Target(actor, sparse, cfg.tau)
        self.actor_target: DeterministicActor = self.target.network
        self.policy_delay = cfg.policy_delay
        self.updates = 0
        self.fast: CompiledUpdate | None = None  # the compiled step, once compile() ran
        self.params = base.params(actor)
        self.opt = base.adam(self.params, cfg.actor_lr, cfg.weight_decay)

    def loss(self) -> steps.ActorLoss:
        """`actor_loss` of (params, obs), the critic's parameters read without gradient."""
        actor, names = self.actor, [n for n, _ in self.actor.named_parameters()]
        critic = list(self.critic.parameters())

        def loss(params: list[torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
            return actor_loss(actor, names, [p.detach() for p in critic], params, obs)
        return loss

    def compile(self, options: CompileOptions) -> None:
        """From now on update with the compiled step (common/algorithms/steps.py)."""
        if options.enabled:
            self.fast = steps.ActorStep(self, self.loss(), options, self.params[0].device)

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One deterministic policy gradient step on -Q1(s, pi(s)), then Polyak the target actor."""
        if self.fast is not None:
            return self.fast.update(batch, want_metrics)
        loss = self.loss()(self.params, batch["obs"])
        self.opt.zero_grad(set_to_none=True)
        loss.backward(inputs=self.params)  # no gradients into the critic's weights
        self.opt.step()
        base.sparse_step(self.sparse, self.opt, self.updates + 1)
        self.target.update()
        self.updates += 1
        return base.with_sparse(base.scalars([("actor_loss", loss)]), self.sparse) if want_metrics else {}

    def actor_state(self) -> State:
        return base.module_state(self.actor)

    def target_actor_state(self) -> State | None:
        return base.module_state(self.actor_target)

    def extras(self) -> dict[str, float]:
        return {}

    def load_critic(self, state: State) -> None:
        if not self.shared:
            base.load_module_state(self.critic, state)

    def named(self) -> Named:
        """What it checkpoints, by name (the critic copy too when it owns one)."""
        named: Named = {"actor": self.actor, "actor_target": self.actor_target, "opt": self.opt}
        return named if self.shared else {**named, "critic": self.critic}



class TD3CriticPart(Checkpointed):
    """Twin critics, their targets and (a copy of, unless shared) the target actor.

    ``load_actor`` copies the *target* actor in place (the online actor is not needed);
    with ``shared=True`` the target actor is the actor part's module and it is a no-op.
    ``sparse``: the critics' masks, ``None`` when dense.
    """

    algo = "td3"
    role = "critic part"

    def __init__(self, critic: TwinCritic, actor_target: DeterministicActor, cfg: TD3Config, shared: bool,
                 generator: torch.Generator, sparse: SparseTopology | None = None) -> None:
        self.critic, self.actor_target = critic, actor_target
        self.cfg, self.shared, self.generator, self.sparse = cfg, shared, generator, sparse
        self.target: Target[TwinCritic] = base.Target(critic, sparse, cfg.tau)
        self.critic_target: TwinCritic = self.target.network
        self.updates = 0
        self.fast: CompiledUpdate | None = None  # the compiled step, once compile() ran
        self.params = base.params(critic)
        self.opt = base.adam(self.params, cfg.critic_lr, cfg.weight_decay)
        scale, bias = actor_target.scale.clone(), actor_target.bias.clone()
        self.scale, self.low, self.high = scale, bias - scale, bias + scale

    def noise(self, rows: int) -> torch.Tensor:
        """A standard normal draw [rows, act_dim] from the part's RNG (what the compiled step draws)."""
        return torch.randn((rows, self.scale.shape[0]), generator=self.generator, device=self.scale.device)

    def target_action(self, next_obs: torch.Tensor) -> torch.Tensor:
        """`smoothed_action` of ``next_obs`` with fresh noise."""
        with torch.no_grad():
            return smoothed_action(self.cfg, self.actor_target, self.scale, self.low, self.high, next_obs,
                                   self.noise(next_obs.shape[0]))

    def target_fn(self) -> steps.TargetFn:
        """`td_target` of (next_obs, reward, done, noise) on this part's networks."""
        cfg, actor_target, targets = self.cfg, self.actor_target, self.target.params
        scale, low, high = self.scale, self.low, self.high

        def target(next_obs: torch.Tensor, reward: torch.Tensor, done: torch.Tensor,
                   noise: torch.Tensor) -> torch.Tensor:
            return td_target(cfg, actor_target, targets, scale, low, high, next_obs, reward, done, noise)
        return target

    def td_target(self, batch: Batch) -> torch.Tensor:
        """`td_target` of the batch with fresh noise."""
        with torch.no_grad():
            return self.target_fn()(batch["next_obs"], batch["reward"], batch["done"],
                                    self.noise(batch["next_obs"].shape[0]))

    def compile(self, options: CompileOptions) -> None:
        """From now on update with the compiled step (common/algorithms/steps.py)."""
        if options.enabled:
            self.fast = steps.CriticStep(self, self.target_fn(), self.cfg.policy_delay, options,
                                         self.params[0].device)

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One critic step; Polyak the critic targets on every ``policy_delay``-th update."""
        if self.fast is not None:
            return self.fast.update(batch, want_metrics)
        targets_due = (self.updates + 1) % self.cfg.policy_delay == 0
        return base.critic_step(self, batch, self.td_target(batch), targets_due, want_metrics)

    def critic_state(self) -> State:
        return base.module_state(self.critic)

    def load_actor(self, state: State, target: State | None, extras: Mapping[str, float]) -> None:
        if self.shared:
            return
        if target is None:
            raise ValueError("TD3 critic part needs the target actor state, got None")
        base.load_module_state(self.actor_target, target)

    def named(self) -> Named:
        """What it checkpoints, by name (the target actor copy too when it owns one)."""
        named: Named = {"critic": self.critic, "critic_target": self.critic_target, "opt": self.opt,
                        "generator": self.generator}
        return named if self.shared else {**named, "actor_target": self.actor_target}



def build(obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, cfg: TD3Config,
          device: torch.device, shared: bool, seed: int,
          sp: Sparsifier) -> tuple[TD3ActorPart, TD3CriticPart]:
    """TD3's parts (see common.algorithms.build.make_parts)."""
    actor = builder.network(seed, builder.ACTOR_INIT, device,
                            lambda: networks.DeterministicActor(obs_dim, act_dim, cfg.hidden, low, high))
    actor_topology = sp.mask(actor, "actor", unit=cfg.policy_delay)
    critic, critic_topology = builder.twin_critics(obs_dim, act_dim, cfg.hidden, device, seed, sp)
    actor_part = TD3ActorPart(actor, critic if shared else base.frozen_copy(critic), cfg, shared,
                              sparse=actor_topology)
    actor_target = actor_part.actor_target
    critic_part = TD3CriticPart(critic, actor_target if shared else base.frozen_copy(actor_target), cfg,
                                shared, builder.generator(device, seed, builder.CRITIC_RNG),
                                sparse=critic_topology)
    return actor_part, critic_part


ALGORITHM = Algorithm(name="td3", config=TD3Config, build=build,
                      policy_delay=lambda cfg: cfg.policy_delay,
                      exploration_noise=lambda cfg: cfg.exploration_noise,
                      actor_nets=("actor", "actor_target"))  # TD targets use the target actor
