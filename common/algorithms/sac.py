"""SAC (Haarnoja et al. 2018, with temperature auto-tuning) split into two parts.

Schedule: one actor (+ temperature) step per critic step (``policy_delay = 1``); critic
targets are Polyak-updated after every critic step. The critic part computes TD targets
with the *online* actor and the current temperature, which it gets via ``load_actor``
(``extras`` carries ``alpha`` and ``log_alpha``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from spreeze.common.algorithms.base import (critic_step, load_critics, save_critics, Batch, State, adam,
                                    load_module_state, load_sparse, module_snapshot, module_state,
                                    optimizer_state, params, save_sparse, scalars,
                                    sparse_step, with_sparse)
from spreeze.common.algorithms.base import frozen_copy, make_generator, seeded
from spreeze.common.algorithms.build import ACTOR_INIT, ACTOR_RNG, CRITIC_RNG, Sparsifier, critics, sub_seed
from spreeze.common.algorithms.configs import SACConfig
from spreeze.common.algorithms import steps
from spreeze.common.algorithms.compiled import CompileOptions
from spreeze.common.algorithms.steps import FastUpdate
from spreeze.common.networks import GaussianActor, TwinCritic
from spreeze.common.sparse import SparseTopology


class SACActorPart:
    """Gaussian actor, temperature ``log_alpha`` and (a copy of, unless shared) the critics.

    With ``shared=True`` the critic *is* the critic part's module; ``load_critic`` is a no-op.
    ``sparse``: the actor's masks (re-applied after each step), ``None`` when dense.
    """

    def __init__(self, actor: GaussianActor, critic: TwinCritic, log_alpha: torch.Tensor,
                 cfg: SACConfig, shared: bool, generator: torch.Generator,
                 target_entropy: float, sparse: SparseTopology | None = None) -> None:
        self.actor, self.critic, self.log_alpha = actor, critic, log_alpha
        self.cfg, self.shared, self.generator, self.sparse = cfg, shared, generator, sparse
        self.target_entropy = target_entropy
        self.policy_delay = 1
        self.updates = 0
        self.fast: FastUpdate | None = None  # the compiled step, once compile() ran
        self._params = params(actor)
        self.opt = adam(self._params, cfg.actor_lr, 0.0)
        self.alpha_opt = adam([log_alpha], cfg.alpha_lr, 0.0) if cfg.autotune else None

    def compile(self, options: CompileOptions) -> None:
        """From now on update with the compiled step (common/algorithms/steps.py)."""
        if options.enabled:
            self.fast = steps.SACActorStep(self, options, self._params[0].device)

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One actor step on E[alpha*logp - min Q], then one temperature step if autotune."""
        if self.fast is not None:
            return self.fast.update(batch, want_metrics)
        obs = batch["obs"]
        alpha = self.log_alpha.detach().exp()
        action, logp = self.actor(obs, generator=self.generator)
        q1, q2 = self.critic(obs, action)
        loss = (alpha * logp - torch.minimum(q1, q2)).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward(inputs=self._params)  # no gradients into the critic's weights
        self.opt.step()
        sparse_step(self.sparse, self.opt, self.updates + 1)
        metrics = [("actor_loss", loss), ("alpha", alpha), ("entropy", -logp.detach().mean())]
        if self.alpha_opt is not None:
            alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
            self.alpha_opt.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_opt.step()
            metrics.append(("alpha_loss", alpha_loss))
        self.updates += 1
        return with_sparse(scalars(metrics), self.sparse) if want_metrics else {}

    def actor_state(self) -> State:
        return module_state(self.actor)

    def target_actor_state(self) -> State | None:
        return None

    def extras(self) -> dict[str, float]:
        """``alpha`` and the exact ``log_alpha`` (so a peer reproduces alpha bit for bit)."""
        la = self.log_alpha.detach()
        return scalars([("alpha", la.exp()), ("log_alpha", la)])

    def load_critic(self, state: State) -> None:
        if not self.shared:
            load_module_state(self.critic, state)

    def save(self) -> dict[str, Any]:
        d: dict[str, Any] = {"actor": module_snapshot(self.actor), "updates": self.updates,
                             "log_alpha": self.log_alpha.detach().clone(),
                             "opt": optimizer_state(self.opt),
                             "generator": self.generator.get_state()}
        if self.alpha_opt is not None:
            d["alpha_opt"] = optimizer_state(self.alpha_opt)
        if not self.shared:
            d["critic"] = module_snapshot(self.critic)
        return save_sparse(d, self.sparse)

    def load(self, d: dict[str, Any]) -> None:
        self.actor.load_state_dict(d["actor"])
        with torch.no_grad():
            self.log_alpha.copy_(d["log_alpha"])
        self.opt.load_state_dict(d["opt"])
        if self.alpha_opt is not None:
            self.alpha_opt.load_state_dict(d["alpha_opt"])
        self.generator.set_state(d["generator"])
        self.updates = int(d["updates"])
        load_sparse(d, self.sparse)
        if not self.shared:
            self.critic.load_state_dict(d["critic"])
        if self.fast is not None:
            self.fast.rebind()


class SACCriticPart:
    """Twin critics, their targets, and (copies of, unless shared) the actor and log_alpha.

    With ``shared=True`` actor and ``log_alpha`` are the actor part's; ``load_actor`` is a no-op.
    ``sparse``: the critics' masks, ``None`` when dense.
    """

    def __init__(self, critic: TwinCritic, critic_target: TwinCritic, actor: GaussianActor,
                 log_alpha: torch.Tensor, cfg: SACConfig, shared: bool,
                 generator: torch.Generator, sparse: SparseTopology | None = None) -> None:
        self.critic, self.critic_target, self.actor = critic, critic_target, actor
        self.log_alpha = log_alpha
        self.cfg, self.shared, self.generator, self.sparse = cfg, shared, generator, sparse
        self.updates = 0
        self.fast: FastUpdate | None = None  # the compiled step, once compile() ran
        self._params = params(critic)
        self._target_params = params(critic_target)
        self.opt = adam(self._params, cfg.critic_lr, 0.0)

    def td_target(self, batch: Batch) -> torch.Tensor:
        """r + gamma * (1 - done) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s')), a' ~ pi."""
        with torch.no_grad():
            next_obs = batch["next_obs"]
            next_a, next_logp = self.actor(next_obs, generator=self.generator)
            tq1, tq2 = self.critic_target(next_obs, next_a)
            v = torch.minimum(tq1, tq2) - self.log_alpha.exp() * next_logp
            return torch.addcmul(batch["reward"], 1.0 - batch["done"], v, value=self.cfg.gamma)

    def compile(self, options: CompileOptions) -> None:
        """From now on update with the compiled step (common/algorithms/steps.py)."""
        if options.enabled:
            self.fast = steps.sac_critic(self, options, self._params[0].device)

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One critic step, then Polyak the critic targets."""
        if self.fast is not None:
            return self.fast.update(batch, want_metrics)
        return critic_step(self, batch, self.td_target(batch), True, want_metrics)

    def critic_state(self) -> State:
        return module_state(self.critic)

    def load_actor(self, state: State, target: State | None, extras: Mapping[str, float]) -> None:
        """Copy the online actor and the temperature (``log_alpha``, else log of ``alpha``)."""
        if self.shared:
            return
        load_module_state(self.actor, state)
        la = extras["log_alpha"] if "log_alpha" in extras else math.log(extras["alpha"])
        with torch.no_grad():
            self.log_alpha.fill_(la)

    def save(self) -> dict[str, Any]:
        d = save_critics(self)
        if not self.shared:
            d["actor"] = module_snapshot(self.actor)
            d["log_alpha"] = self.log_alpha.detach().clone()
        return d

    def load(self, d: dict[str, Any]) -> None:
        load_critics(self, d)
        if not self.shared:
            self.actor.load_state_dict(d["actor"])
            with torch.no_grad():
                self.log_alpha.copy_(d["log_alpha"])
        if self.fast is not None:
            self.fast.rebind()


def build(obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, cfg: SACConfig,
          device: torch.device, shared: bool, seed: int,
          sp: Sparsifier) -> tuple[SACActorPart, SACCriticPart]:
    """SAC's parts (see common.algorithms.make_parts)."""
    actor = seeded(sub_seed(seed, ACTOR_INIT), lambda: GaussianActor(
        obs_dim, act_dim, cfg.hidden, low, high, cfg.log_std_min, cfg.log_std_max)).to(device)
    actor_topology = sp.mask(actor, "actor")
    critic, critic_target, critic_topology = critics(obs_dim, act_dim, cfg, device, seed, sp)
    log_alpha = torch.tensor(float(np.log(cfg.init_alpha)), dtype=torch.float32, device=device)
    log_alpha = torch.nn.Parameter(log_alpha, requires_grad=cfg.autotune)
    target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy
    actor_part = SACActorPart(actor, critic if shared else frozen_copy(critic), log_alpha, cfg,
                              shared, make_generator(device, sub_seed(seed, ACTOR_RNG)),
                              target_entropy, sparse=actor_topology)
    critic_part = SACCriticPart(critic, critic_target,
                                actor if shared else frozen_copy(actor),
                                log_alpha if shared else log_alpha.detach().clone(), cfg,
                                shared, make_generator(device, sub_seed(seed, CRITIC_RNG)),
                                sparse=critic_topology)
    return actor_part, critic_part
