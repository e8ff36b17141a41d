"""TD3 (Fujimoto et al. 2018) split into an actor part and a critic part.

Target schedule (original TD3): the critic steps every update; every ``policy_delay``
critic updates the actor steps and *all* targets are Polyak-updated. The critic part
counts its own updates and Polyak-updates the critic targets on every ``policy_delay``-th
one; :meth:`TD3ActorPart.update` Polyak-updates the target actor after each actor step.
With :func:`~common.algorithms.base.fused_step` this is exactly the reference algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from spreeze.common.algorithms.base import (critic_step, load_critics, save_critics, Batch, State, adam,
                                    load_module_state, load_sparse, module_snapshot, module_state,
                                    optimizer_state, params, polyak, save_sparse, scalars,
                                    sparse_prune, sparse_step, with_sparse)
from spreeze.common.algorithms.base import frozen_copy, make_generator, seeded
from spreeze.common.algorithms.build import ACTOR_INIT, CRITIC_RNG, Sparsifier, critics, sub_seed, track
from spreeze.common.algorithms.configs import TD3Config
from spreeze.common.algorithms import steps
from spreeze.common.algorithms.compiled import CompileOptions
from spreeze.common.algorithms.steps import FastUpdate
from spreeze.common.networks import DeterministicActor, TwinCritic
from spreeze.common.sparse import SparseTopology


class TD3ActorPart:
    """Actor, target actor and (a copy of, unless shared) the online twin critic.

    ``load_critic`` copies critic weights in place; with ``shared=True`` the critic *is*
    the critic part's module and ``load_critic`` is a no-op. ``sparse``: the actor's masks
    (re-applied after each step, target pruned after each Polyak update), ``None`` when dense.
    """

    def __init__(self, actor: DeterministicActor, actor_target: DeterministicActor,
                 critic: TwinCritic, cfg: TD3Config, shared: bool,
                 sparse: SparseTopology | None = None) -> None:
        self.actor, self.actor_target, self.critic = actor, actor_target, critic
        self.cfg, self.shared, self.sparse = cfg, shared, sparse
        self.policy_delay = cfg.policy_delay
        self.updates = 0
        self.fast: FastUpdate | None = None  # the compiled step, once compile() ran
        self._params = params(actor)
        self._target_params = params(actor_target)
        self.opt = adam(self._params, cfg.actor_lr, cfg.weight_decay)

    def compile(self, options: CompileOptions) -> None:
        """From now on update with the compiled step (common/algorithms/steps.py)."""
        if options.enabled:
            self.fast = steps.TD3ActorStep(self, options, self._params[0].device)

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One deterministic policy gradient step on -Q1(s, pi(s)), then Polyak the target actor."""
        if self.fast is not None:
            return self.fast.update(batch, want_metrics)
        obs = batch["obs"]
        loss = -self.critic.q1(obs, self.actor(obs)).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward(inputs=self._params)  # no gradients into the critic's weights
        self.opt.step()
        sparse_step(self.sparse, self.opt, self.updates + 1)
        polyak(self._target_params, self._params, self.cfg.tau)
        sparse_prune(self.sparse)
        self.updates += 1
        return with_sparse(scalars([("actor_loss", loss)]), self.sparse) if want_metrics else {}

    def actor_state(self) -> State:
        return module_state(self.actor)

    def target_actor_state(self) -> State | None:
        return module_state(self.actor_target)

    def extras(self) -> dict[str, float]:
        return {}

    def load_critic(self, state: State) -> None:
        if not self.shared:
            load_module_state(self.critic, state)

    def save(self) -> dict[str, Any]:
        d: dict[str, Any] = {"actor": module_snapshot(self.actor), "updates": self.updates,
                             "actor_target": module_snapshot(self.actor_target),
                             "opt": optimizer_state(self.opt)}
        if not self.shared:
            d["critic"] = module_snapshot(self.critic)
        return save_sparse(d, self.sparse)

    def load(self, d: dict[str, Any]) -> None:
        self.actor.load_state_dict(d["actor"])
        self.actor_target.load_state_dict(d["actor_target"])
        self.opt.load_state_dict(d["opt"])
        self.updates = int(d["updates"])
        load_sparse(d, self.sparse)
        if not self.shared:
            self.critic.load_state_dict(d["critic"])
        if self.fast is not None:
            self.fast.rebind()


class TD3CriticPart:
    """Twin critics, their targets and (a copy of, unless shared) the target actor.

    ``load_actor`` copies the *target* actor in place (the online actor is not needed);
    with ``shared=True`` the target actor is the actor part's module and it is a no-op.
    ``sparse``: the critics' masks, ``None`` when dense.
    """

    def __init__(self, critic: TwinCritic, critic_target: TwinCritic,
                 actor_target: DeterministicActor, cfg: TD3Config, shared: bool,
                 generator: torch.Generator, sparse: SparseTopology | None = None) -> None:
        self.critic, self.critic_target, self.actor_target = critic, critic_target, actor_target
        self.cfg, self.shared, self.generator, self.sparse = cfg, shared, generator, sparse
        self.updates = 0
        self.fast: FastUpdate | None = None  # the compiled step, once compile() ran
        self._params = params(critic)
        self._target_params = params(critic_target)
        self.opt = adam(self._params, cfg.critic_lr, cfg.weight_decay)
        scale, bias = actor_target.scale.clone(), actor_target.bias.clone()
        self._scale, self._low, self._high = scale, bias - scale, bias + scale

    def target_action(self, next_obs: torch.Tensor) -> torch.Tensor:
        """Target policy smoothing: clip(pi'(s') + clip(N(0, sigma), -c, c) * scale, low, high)."""
        with torch.no_grad():
            a = self.actor_target(next_obs)
            noise = torch.randn(a.shape, generator=self.generator, device=a.device, dtype=a.dtype)
            noise.mul_(self.cfg.policy_noise).clamp_(-self.cfg.noise_clip, self.cfg.noise_clip)
            return torch.clamp(torch.addcmul(a, noise, self._scale), self._low, self._high)

    def td_target(self, batch: Batch) -> torch.Tensor:
        """r + gamma * (1 - done) * min(Q1', Q2')(s', target_action(s'))."""
        with torch.no_grad():
            next_obs = batch["next_obs"]
            tq1, tq2 = self.critic_target(next_obs, self.target_action(next_obs))
            return torch.addcmul(batch["reward"], 1.0 - batch["done"], torch.minimum(tq1, tq2),
                                 value=self.cfg.gamma)

    def compile(self, options: CompileOptions) -> None:
        """From now on update with the compiled step (common/algorithms/steps.py)."""
        if options.enabled:
            self.fast = steps.td3_critic(self, options, self._params[0].device)

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One critic step; Polyak the critic targets on every ``policy_delay``-th update."""
        if self.fast is not None:
            return self.fast.update(batch, want_metrics)
        targets_due = (self.updates + 1) % self.cfg.policy_delay == 0
        return critic_step(self, batch, self.td_target(batch), targets_due, want_metrics)

    def critic_state(self) -> State:
        return module_state(self.critic)

    def load_actor(self, state: State, target: State | None, extras: Mapping[str, float]) -> None:
        if self.shared:
            return
        if target is None:
            raise ValueError("TD3 critic part needs the target actor state, got None")
        load_module_state(self.actor_target, target)

    def save(self) -> dict[str, Any]:
        d = save_critics(self)
        if not self.shared:
            d["actor_target"] = module_snapshot(self.actor_target)
        return d

    def load(self, d: dict[str, Any]) -> None:
        load_critics(self, d)
        if not self.shared:
            self.actor_target.load_state_dict(d["actor_target"])
        if self.fast is not None:
            self.fast.rebind()


def build(obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, cfg: TD3Config,
          device: torch.device, shared: bool, seed: int,
          sp: Sparsifier) -> tuple[TD3ActorPart, TD3CriticPart]:
    """TD3's parts (see common.algorithms.make_parts)."""
    actor = seeded(sub_seed(seed, ACTOR_INIT),
                   lambda: DeterministicActor(obs_dim, act_dim, cfg.hidden, low, high)).to(device)
    actor_topology = sp.mask(actor, "actor", unit=cfg.policy_delay)
    actor_target = frozen_copy(actor)
    track(actor_topology, actor_target)
    critic, critic_target, critic_topology = critics(obs_dim, act_dim, cfg, device, seed, sp)
    actor_part = TD3ActorPart(actor, actor_target, critic if shared else frozen_copy(critic),
                              cfg, shared, sparse=actor_topology)
    critic_part = TD3CriticPart(critic, critic_target,
                                actor_target if shared else frozen_copy(actor_target), cfg,
                                shared, make_generator(device, sub_seed(seed, CRITIC_RNG)),
                                sparse=critic_topology)
    return actor_part, critic_part
