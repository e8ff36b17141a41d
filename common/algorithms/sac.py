"""SAC (Haarnoja et al. 2018, with temperature auto-tuning): its hyperparameters, its
descriptor, its networks and its update, split into two parts.

Schedule: one actor (+ temperature) step per critic step (``policy_delay = 1``); critic
targets are Polyak-updated after every critic step. The critic part computes TD targets
with the *online* actor and the current temperature, which it gets via ``load_actor``
(``extras`` carries ``alpha`` and ``log_alpha``).

Imports no torch until `build` runs (common/algorithms/lazy.py): the config is read by
every service.
"""

from __future__ import annotations

import math
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
    from spreeze.common.networks import GaussianActor, TwinCritic
    from spreeze.common.sparse import SparseTopology
else:
    torch, base, builder, steps = lazy("torch"), lazy("spreeze.common.algorithms.base"), \
        lazy("spreeze.common.algorithms.build"), lazy("spreeze.common.algorithms.steps")
    networks = lazy("spreeze.common.networks")


@dataclass(frozen=True)
class SACConfig:
    """SAC hyperparameters (defaults: SAC v2 / softlearning, CleanRL)."""

    hidden: tuple[int, ...] = (64, 64)  # MLP hidden sizes, actor and critics (papers: 256, 256; 64-64 learns HalfCheetah to ~4,800 in 100k steps at ~1/5 the CPU)
    actor_lr: float = 3e-4  # Adam learning rate of the actor
    critic_lr: float = 3e-4  # Adam learning rate of the twin critics
    alpha_lr: float = 3e-4  # Adam learning rate of log(alpha) when autotune
    gamma: float = 0.99  # discount factor
    tau: float = 0.005  # Polyak rate of the critic targets
    init_alpha: float = 1.0  # initial temperature, as softlearning/CleanRL/SB3; ~0.2 if no autotune
    autotune: bool = True  # learn alpha to hold the policy entropy at target_entropy
    target_entropy: float | None = None  # None means -act_dim
    log_std_min: float = -5.0  # lower bound of the pre-squash log std
    log_std_max: float = 2.0  # upper bound of the pre-squash log std

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        check_hidden("sac.hidden", self.hidden)
        for name in ("actor_lr", "critic_lr", "alpha_lr", "init_alpha"):
            value = getattr(self, name)
            check(value > 0, f"sac.{name}", value, "must be > 0")
        check(0 <= self.gamma <= 1, "sac.gamma", self.gamma, "must be in [0, 1]")
        check(0 < self.tau <= 1, "sac.tau", self.tau, "must be in (0, 1]")
        check(self.target_entropy is None or math.isfinite(self.target_entropy),
              "sac.target_entropy", self.target_entropy, "must be a finite float or None")
        check(self.log_std_min < self.log_std_max, "sac.log_std_min", self.log_std_min,
              f"must be < sac.log_std_max={self.log_std_max}")


def td_target(cfg: SACConfig, actor: torch.nn.Module, target_params: list[torch.Tensor], log_alpha: torch.Tensor,
              next_obs: torch.Tensor, reward: torch.Tensor, done: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """r + gamma * (1 - done) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s')), a' ~ pi (noise ``eps``)."""
    a, logp = actor(next_obs, eps=eps)
    tq = networks.twin_q(target_params, next_obs, a)
    v = torch.minimum(tq[0], tq[1]) - log_alpha.exp() * logp
    return torch.addcmul(reward, 1.0 - done, v, value=cfg.gamma)


def actor_loss(actor: torch.nn.Module, names: list[str], critic_params: list[torch.Tensor],
               params: list[torch.Tensor], obs: torch.Tensor, eps: torch.Tensor,
               alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E[alpha * log pi(a|s) - min(Q1, Q2)(s, a)], log pi(a|s)), a from the actor's parameters."""
    a, logp = torch.func.functional_call(actor, dict(zip(names, params)), (obs,), {"eps": eps})
    return soft_policy_loss(alpha, logp, networks.twin_q(critic_params, obs, a)), logp


def soft_policy_loss(alpha: torch.Tensor, logp: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """SAC's actor objective E[alpha * log pi(a|s) - min(Q1, Q2)(s, a)], from log pi and the twin
    Q-values [2, B] of the actor's actions."""
    return (alpha * logp - torch.minimum(q[0], q[1])).mean()


def temperature_loss(log_alpha: torch.Tensor, logp: torch.Tensor,
                     target_entropy: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The temperature's loss -E[log_alpha * (log pi + target entropy)] and its gradient in log_alpha."""
    c = logp + target_entropy
    return -(log_alpha * c).mean(), -c.mean()


class SACActorPart(Checkpointed):
    """Gaussian actor, temperature ``log_alpha`` and (a copy of, unless shared) the critics.

    With ``shared=True`` the critic *is* the critic part's module; ``load_critic`` is a no-op.
    ``sparse``: the actor's masks (re-applied after each step), ``None`` when dense.
    """

    algo = "sac"
    role = "actor part"

    def __init__(self, actor: GaussianActor, critic: TwinCritic, log_alpha: torch.Tensor,
                 cfg: SACConfig, shared: bool, generator: torch.Generator,
                 target_entropy: float, sparse: SparseTopology | None = None) -> None:
        self.actor, self.critic, self.log_alpha = actor, critic, log_alpha
        self.cfg, self.shared, self.generator, self.sparse = cfg, shared, generator, sparse
        self.target_entropy = target_entropy
        self.act_dim = actor.head.out_features // 2  # the policy's noise per row (mean and log-std per action)
        self.policy_delay = 1
        self.updates = 0
        self.fast: CompiledUpdate | None = None  # the compiled step, once compile() ran
        self.params = base.params(actor)
        self.opt = base.adam(self.params, cfg.actor_lr, 0.0)
        self.alpha_opt = base.adam([log_alpha], cfg.alpha_lr, 0.0) if cfg.autotune else None

    def loss(self) -> steps.StochasticLoss:
        """`actor_loss` of (params, obs, eps, alpha), the critics' parameters read without gradient."""
        actor, names = self.actor, [n for n, _ in self.actor.named_parameters()]
        critic = list(self.critic.parameters())

        def loss(params: list[torch.Tensor], obs: torch.Tensor, eps: torch.Tensor,
                 alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return actor_loss(actor, names, [p.detach() for p in critic], params, obs, eps, alpha)
        return loss

    def temperature(self) -> steps.TemperatureFn:
        """`temperature_loss` of (log_alpha, logp) at this part's target entropy."""
        target_entropy = self.target_entropy

        def temperature(log_alpha: torch.Tensor, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return temperature_loss(log_alpha, logp, target_entropy)
        return temperature

    def compile(self, options: CompileOptions) -> None:
        """From now on update with the compiled step (common/algorithms/steps.py)."""
        if options.enabled:
            self.fast = steps.SACActorStep(self, self.loss(), self.temperature(), options, self.params[0].device)

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One actor step on E[alpha*logp - min Q], then one temperature step if autotune."""
        if self.fast is not None:
            return self.fast.update(batch, want_metrics)
        obs = batch["obs"]
        alpha = self.log_alpha.detach().exp()
        eps = torch.randn((obs.shape[0], self.act_dim), generator=self.generator, device=obs.device)
        loss, logp = self.loss()(self.params, obs, eps, alpha)
        self.opt.zero_grad(set_to_none=True)
        loss.backward(inputs=self.params)  # no gradients into the critic's weights
        self.opt.step()
        base.sparse_step(self.sparse, self.opt, self.updates + 1)
        logp = logp.detach()
        metrics = [("actor_loss", loss), ("alpha", alpha), ("entropy", -logp.mean())]
        if self.alpha_opt is not None:
            alpha_loss, grad = self.temperature()(self.log_alpha.detach(), logp)
            self.log_alpha.grad = grad.reshape(self.log_alpha.shape)
            self.alpha_opt.step()
            metrics.append(("alpha_loss", alpha_loss))
        self.updates += 1
        return base.with_sparse(base.scalars(metrics), self.sparse) if want_metrics else {}

    def actor_state(self) -> State:
        return base.module_state(self.actor)

    def target_actor_state(self) -> State | None:
        return None

    def extras(self) -> dict[str, float]:
        """``alpha`` and the exact ``log_alpha`` (so a peer reproduces alpha bit for bit)."""
        la = self.log_alpha.detach()
        return base.scalars([("alpha", la.exp()), ("log_alpha", la)])

    def load_critic(self, state: State) -> None:
        if not self.shared:
            base.load_module_state(self.critic, state)

    def named(self) -> Named:
        """What it checkpoints, by name (the critic copy too when it owns one)."""
        named: Named = {"actor": self.actor, "log_alpha": self.log_alpha, "opt": self.opt,
                        "generator": self.generator}
        if self.alpha_opt is not None:
            named["alpha_opt"] = self.alpha_opt
        return named if self.shared else {**named, "critic": self.critic}



class SACCriticPart(Checkpointed):
    """Twin critics, their targets, and (copies of, unless shared) the actor and log_alpha.

    With ``shared=True`` actor and ``log_alpha`` are the actor part's; ``load_actor`` is a no-op.
    ``sparse``: the critics' masks, ``None`` when dense.
    """

    algo = "sac"
    role = "critic part"

    def __init__(self, critic: TwinCritic, actor: GaussianActor, log_alpha: torch.Tensor, cfg: SACConfig,
                 shared: bool, generator: torch.Generator, sparse: SparseTopology | None = None) -> None:
        self.critic, self.actor, self.log_alpha = critic, actor, log_alpha
        self.cfg, self.shared, self.generator, self.sparse = cfg, shared, generator, sparse
        self.act_dim = actor.head.out_features // 2  # the policy's noise per row
        self.target: Target[TwinCritic] = base.Target(critic, sparse, cfg.tau)
        self.critic_target: TwinCritic = self.target.network
        self.updates = 0
        self.fast: CompiledUpdate | None = None  # the compiled step, once compile() ran
        self.params = base.params(critic)
        self.opt = base.adam(self.params, cfg.critic_lr, 0.0)

    def target_fn(self) -> steps.TargetFn:
        """`td_target` of (next_obs, reward, done, eps) on this part's networks and temperature."""
        cfg, actor, targets, log_alpha = self.cfg, self.actor, self.target.params, self.log_alpha

        def target(next_obs: torch.Tensor, reward: torch.Tensor, done: torch.Tensor,
                   eps: torch.Tensor) -> torch.Tensor:
            return td_target(cfg, actor, targets, log_alpha, next_obs, reward, done, eps)
        return target

    def td_target(self, batch: Batch) -> torch.Tensor:
        """`td_target` of the batch with a fresh draw of the policy's noise."""
        with torch.no_grad():
            next_obs = batch["next_obs"]
            eps = torch.randn((next_obs.shape[0], self.act_dim), generator=self.generator, device=next_obs.device)
            return self.target_fn()(next_obs, batch["reward"], batch["done"], eps)

    def compile(self, options: CompileOptions) -> None:
        """From now on update with the compiled step (common/algorithms/steps.py)."""
        if options.enabled:
            self.fast = steps.CriticStep(self, self.target_fn(), 1, options, self.params[0].device)

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One critic step, then Polyak the critic targets."""
        if self.fast is not None:
            return self.fast.update(batch, want_metrics)
        return base.critic_step(self, batch, self.td_target(batch), True, want_metrics)

    def critic_state(self) -> State:
        return base.module_state(self.critic)

    def load_actor(self, state: State, target: State | None, extras: Mapping[str, float]) -> None:
        """Copy the online actor and the temperature (``log_alpha``, else log of ``alpha``)."""
        if self.shared:
            return
        base.load_module_state(self.actor, state)
        base.load_temperature(self.log_alpha, extras)

    def named(self) -> Named:
        """What it checkpoints, by name (the actor and temperature copies when it owns them)."""
        named: Named = {"critic": self.critic, "critic_target": self.critic_target, "opt": self.opt,
                        "generator": self.generator}
        return named if self.shared else {**named, "actor": self.actor, "log_alpha": self.log_alpha}



def build(obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, cfg: SACConfig,
          device: torch.device, shared: bool, seed: int,
          sp: Sparsifier) -> tuple[SACActorPart, SACCriticPart]:
    """SAC's parts (see common.algorithms.build.make_parts)."""
    actor = builder.network(seed, builder.ACTOR_INIT, device, lambda: networks.GaussianActor(
        obs_dim, act_dim, cfg.hidden, low, high, cfg.log_std_min, cfg.log_std_max))
    actor_topology = sp.mask(actor, "actor")
    critic, critic_topology = builder.twin_critics(obs_dim, act_dim, cfg.hidden, device, seed, sp)
    log_alpha = torch.tensor(math.log(cfg.init_alpha), dtype=torch.float32, device=device)
    log_alpha = torch.nn.Parameter(log_alpha, requires_grad=cfg.autotune)
    target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy
    actor_part = SACActorPart(actor, critic if shared else base.frozen_copy(critic), log_alpha, cfg,
                              shared, builder.generator(device, seed, builder.ACTOR_RNG),
                              target_entropy, sparse=actor_topology)
    critic_part = SACCriticPart(critic, actor if shared else base.frozen_copy(actor),
                                log_alpha if shared else log_alpha.detach().clone(), cfg,
                                shared, builder.generator(device, seed, builder.CRITIC_RNG),
                                sparse=critic_topology)
    return actor_part, critic_part


ALGORITHM = Algorithm(name="sac", config=SACConfig, build=build,
                      policy_delay=lambda cfg: 1,
                      exploration_noise=lambda cfg: 0.0,  # explores by sampling its own Gaussian
                      actor_nets=("actor",))  # TD targets use the online actor (and the temperature in extras)
