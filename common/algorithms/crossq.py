"""CrossQ (Bhatt et al., ICLR 2024): batch-normalised critics and no target networks.

The critics normalise their inputs and hidden layers with batch renormalisation (Ioffe
2017; the CrossQ authors' later default, more stable than plain batch norm in long runs),
and take (s, a) and (s', a') through ONE joint forward in train mode, so both halves are
normalised by the statistics of the same mixed batch; the TD target is the stop-gradient
of the (s', a') half. No target networks and no Polyak averaging: the online critics give
the targets. The actor reads the critics in eval mode (their running statistics).
Paper settings: Adam beta1 = 0.5, learning rates 1e-3, policy delay 3, one update per env
step, 2048-wide critics and 256-wide actor; the critic width here defaults to 512 (a CPU
updates 2048-wide twin critics ~12x slower), and the start plan narrows it to 256 for
learners on CPU (`plan_choices`).

The authors' actor normalises its input with batch renorm too; here the plan turns on
``learner.obs_norm`` instead (running mean and variance of every stored observation,
carried by the exported policy), which made the difference on Hopper-v5 (`plan_choices`).

Compiled steps (common/algorithms/steps.py): the critic step runs the twins as one batched
network written without side effects (``networks.renorm_twin_q``): the loss returns the
renorm layers' batch statistics and the step moves the running ones after Adam, which is
what the modules' train-mode forward does in the eager update.

Two flavours from one file (``crossq.flavour``): ``sac`` (the paper's: tanh-Gaussian actor,
entropy temperature auto-tuned as SAC) and ``td3`` (deterministic actor, Gaussian
exploration in the samplers, target policy smoothing on a', actor on Q1), each with its DS
(dynamic sparse) version through the usual ``sparse.*`` settings: the masks sit on the
critics' Linear layers between the renorm layers.

Imports no torch until `build` runs (common/algorithms/lazy.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spreeze.common.algorithms.checkpointed import Checkpointed
from spreeze.common.algorithms.checks import check, check_hidden
from spreeze.common.algorithms.descriptor import Algorithm
from spreeze.common.algorithms.lazy import lazy

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from spreeze.common import networks
    from spreeze.common.algorithms import base, build as builder, sac, steps
    from spreeze.common.algorithms.base import Batch, CompiledUpdate, Named, State
    from spreeze.common.algorithms.build import Sparsifier
    from spreeze.common.algorithms.compiled import CompileOptions
    from spreeze.common.networks import BatchRenorm, RenormStats, RenormTwinCritic
    from spreeze.common.sparse import SparseTopology
else:
    torch, nn, base = lazy("torch"), lazy("torch.nn"), lazy("spreeze.common.algorithms.base")
    builder, sac = lazy("spreeze.common.algorithms.build"), lazy("spreeze.common.algorithms.sac")
    networks, steps = lazy("spreeze.common.networks"), lazy("spreeze.common.algorithms.steps")

FLAVOURS = ("sac", "td3")
# The widest critic layer the start plan gives learners on CPU: on 2 cores (Hopper-sized, batch
# 256, one thread) a compiled update took 10.8 ms with 256-wide critics against 28.9 ms with
# 512-wide, and 256-wide critics learned Hopper-v5 to a last-10 return of 1,991 (results/).
CPU_CRITIC_WIDTH = 256


@dataclass(frozen=True)
class CrossQConfig:
    """CrossQ hyperparameters (defaults: the CrossQ paper's, but for the critic width)."""

    flavour: str = "sac"  # sac (the paper's: stochastic actor, auto-tuned temperature) | td3 (deterministic actor)
    hidden: tuple[int, ...] = (256, 256)  # the actor's MLP hidden sizes (paper: 256, 256)
    critic_hidden: tuple[int, ...] = (512, 512)  # each critic's hidden sizes (paper: 2048, 2048; ~12x the CPU)
    actor_lr: float = 1e-3  # Adam learning rate of the actor
    critic_lr: float = 1e-3  # Adam learning rate of the critics
    alpha_lr: float = 1e-3  # Adam learning rate of log(alpha) (sac flavour, autotune)
    beta1: float = 0.5  # Adam's beta1 for every optimizer (paper: 0.5)
    gamma: float = 0.99  # discount factor
    policy_delay: int = 3  # critic updates per actor update (paper: 3)
    renorm_momentum: float = 0.01  # update rate of the renorm layers' running statistics (paper: 0.99 decay)
    renorm_warmup: int = 100_000  # critic updates of plain batch norm before renorm's r and d act (paper: 100k)
    r_max: float = 3.0  # batch renorm's bound on the std correction r
    d_max: float = 5.0  # batch renorm's bound on the mean correction d
    init_alpha: float = 1.0  # sac flavour: initial temperature
    autotune: bool = True  # sac flavour: learn alpha to hold the entropy at target_entropy
    target_entropy: float | None = None  # sac flavour: None means -act_dim
    log_std_min: float = -5.0  # sac flavour: lower bound of the pre-squash log std
    log_std_max: float = 2.0  # sac flavour: upper bound of the pre-squash log std
    policy_noise: float = 0.2  # td3 flavour: std of the smoothing noise on a', in half action ranges
    noise_clip: float = 0.5  # td3 flavour: clip of that noise, in half action ranges
    exploration_noise: float = 0.1  # td3 flavour: std of sampler Gaussian noise, in half action ranges

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        check(self.flavour in FLAVOURS, "crossq.flavour", self.flavour, f"must be one of {', '.join(FLAVOURS)}")
        check_hidden("crossq.hidden", self.hidden)
        check_hidden("crossq.critic_hidden", self.critic_hidden)
        for name in ("actor_lr", "critic_lr", "alpha_lr", "init_alpha", "r_max", "d_max"):
            value = getattr(self, name)
            check(value > 0, f"crossq.{name}", value, "must be > 0")
        check(self.r_max >= 1, "crossq.r_max", self.r_max, "must be >= 1")
        check(0 <= self.beta1 < 1, "crossq.beta1", self.beta1, "must be in [0, 1)")
        check(0 <= self.gamma <= 1, "crossq.gamma", self.gamma, "must be in [0, 1]")
        check(0 < self.renorm_momentum <= 1, "crossq.renorm_momentum", self.renorm_momentum, "must be in (0, 1]")
        check(isinstance(self.renorm_warmup, int) and self.renorm_warmup >= 0, "crossq.renorm_warmup",
              self.renorm_warmup, "must be an int >= 0")
        check(isinstance(self.policy_delay, int) and self.policy_delay >= 1,
              "crossq.policy_delay", self.policy_delay, "must be an int >= 1")
        for name in ("policy_noise", "noise_clip", "exploration_noise"):
            check(getattr(self, name) >= 0, f"crossq.{name}", getattr(self, name), "must be >= 0")
        check(self.target_entropy is None or math.isfinite(self.target_entropy),
              "crossq.target_entropy", self.target_entropy, "must be a finite float or None")
        check(self.log_std_min < self.log_std_max, "crossq.log_std_min", self.log_std_min,
              f"must be < crossq.log_std_max={self.log_std_max}")


def read_q(critic: RenormTwinCritic, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Q1, Q2 [2, B] with the critics in eval mode (running statistics, nothing updated), as
    the actor reads them; the critics' mode is put back after."""
    was = critic.training
    critic.eval()
    try:
        return critic(obs, action)  # type: ignore[no-any-return]
    finally:
        critic.train(was)


def adam(params: list[torch.Tensor], lr: float, cfg: CrossQConfig) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=lr, betas=(cfg.beta1, 0.999), fused=True)


def renorm_spec(critic: RenormTwinCritic) -> BatchRenorm:
    """One of the critic's renorm layers: they share momentum, warm-up and bounds."""
    return next(m for m in critic.modules() if isinstance(m, networks.BatchRenorm))


def joint_td_loss(both: torch.Tensor, n: int, entropy: torch.Tensor, reward: torch.Tensor, done: torch.Tensor,
                  gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, mean Q1) from the joint forward ``both`` [2, 2n]: its first n columns are Q(s, a),
    the last n, without gradient, give the target r + gamma (1 - done) (min Q(s', a') - entropy)."""
    q, next_q = both[:, :n], both[:, n:].detach()
    v = torch.minimum(next_q[0], next_q[1]) - entropy
    y = torch.addcmul(reward, 1.0 - done, v, value=gamma)
    return (q - y).square().mean(1).sum(), q[0].mean()


class CrossQActorPart(Checkpointed):
    """The actor (+ temperature, sac flavour) and (a copy of, unless shared) the critics."""

    algo = "crossq"
    role = "actor part"

    def __init__(self, actor: nn.Module, critic: RenormTwinCritic, log_alpha: torch.Tensor, cfg: CrossQConfig,
                 shared: bool, generator: torch.Generator, act_dim: int, sparse: SparseTopology | None) -> None:
        self.actor, self.critic, self.log_alpha = actor, critic, log_alpha
        self.cfg, self.shared, self.generator, self.sparse = cfg, shared, generator, sparse
        self.stochastic = cfg.flavour == "sac"
        self.act_dim = act_dim
        self.target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy
        self.policy_delay = cfg.policy_delay
        self.updates = 0
        self.fast: CompiledUpdate | None = None  # the compiled step, once compile() ran
        self.target = None  # no target actor (the compiled step asks)
        self.params = base.params(actor)
        self.opt = adam(self.params, cfg.actor_lr, cfg)
        self.alpha_opt = adam([log_alpha], cfg.alpha_lr, cfg) if self.stochastic and cfg.autotune else None

    def compile(self, options: CompileOptions) -> None:
        """From now on update with the compiled step (common/algorithms/steps.py): the actor's
        loss reads the critics through ``networks.renorm_twin_q`` in eval mode."""
        if not options.enabled:
            return
        actor, names = self.actor, [n for n, _ in self.actor.named_parameters()]
        critic, buffers = list(self.critic.parameters()), list(self.critic.buffers())
        spec, device = renorm_spec(self.critic), self.params[0].device

        def read(obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
            return networks.renorm_twin_q([p.detach() for p in critic], buffers, obs, action, spec, False)[0]

        if self.stochastic:
            def loss(params: list[torch.Tensor], obs: torch.Tensor, eps: torch.Tensor,
                     alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                action, logp = torch.func.functional_call(actor, dict(zip(names, params)), (obs,), {"eps": eps})
                return sac.soft_policy_loss(alpha, logp, read(obs, action)), logp

            target_entropy = self.target_entropy

            def temperature(log_alpha: torch.Tensor, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return sac.temperature_loss(log_alpha, logp, target_entropy)

            self.fast = steps.SACActorStep(self, loss, temperature, options, device)
            return

        def deterministic_loss(params: list[torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
            action = torch.func.functional_call(actor, dict(zip(names, params)), (obs,))
            return -read(obs, action)[0].mean()

        self.fast = steps.ActorStep(self, deterministic_loss, options, device)

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One actor step (sac: E[alpha log pi - min Q]; td3: -Q1(s, pi(s))) on the critics in
        eval mode, then (sac, autotune) one temperature step."""
        if self.fast is not None:
            return self.fast.update(batch, want_metrics)
        obs = batch["obs"]
        metrics: list[tuple[str, torch.Tensor]] = []
        if self.stochastic:
            alpha = self.log_alpha.detach().exp()
            eps = torch.randn((obs.shape[0], self.act_dim), generator=self.generator, device=obs.device)
            action, logp = self.actor(obs, eps=eps)
            loss = sac.soft_policy_loss(alpha, logp, read_q(self.critic, obs, action))
            metrics += [("alpha", alpha), ("entropy", -logp.detach().mean())]
        else:
            loss = -read_q(self.critic, obs, self.actor(obs))[0].mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward(inputs=self.params)  # no gradients into the critics' weights
        self.opt.step()
        base.sparse_step(self.sparse, self.opt, self.updates + 1)
        if self.alpha_opt is not None:
            alpha_loss, grad = sac.temperature_loss(self.log_alpha.detach(), logp.detach(), self.target_entropy)
            self.log_alpha.grad = grad.reshape(self.log_alpha.shape)
            self.alpha_opt.step()
            metrics.append(("alpha_loss", alpha_loss))
        self.updates += 1
        if not want_metrics:
            return {}
        return base.with_sparse(base.scalars([("actor_loss", loss), *metrics]), self.sparse)

    def actor_state(self) -> State:
        return base.module_state(self.actor)

    def target_actor_state(self) -> State | None:
        return None  # no target networks

    def extras(self) -> dict[str, float]:
        """sac flavour: ``alpha`` and the exact ``log_alpha``; td3 flavour: nothing."""
        if not self.stochastic:
            return {}
        la = self.log_alpha.detach()
        return base.scalars([("alpha", la.exp()), ("log_alpha", la)])

    def load_critic(self, state: State) -> None:
        if not self.shared:
            base.load_module_state(self.critic, state)  # weights and the renorm statistics

    def named(self) -> Named:
        named: Named = {"actor": self.actor, "opt": self.opt, "generator": self.generator}
        if self.stochastic:
            named["log_alpha"] = self.log_alpha
        if self.alpha_opt is not None:
            named["alpha_opt"] = self.alpha_opt
        return named if self.shared else {**named, "critic": self.critic}



class CrossQCriticPart(Checkpointed):
    """The renorm twin critics and (copies of, unless shared) the actor and temperature."""

    algo = "crossq"
    role = "critic part"

    def __init__(self, critic: RenormTwinCritic, actor: nn.Module, log_alpha: torch.Tensor, cfg: CrossQConfig,
                 shared: bool, generator: torch.Generator, act_dim: int, scale: torch.Tensor,
                 low: torch.Tensor, high: torch.Tensor, sparse: SparseTopology | None) -> None:
        self.critic, self.actor, self.log_alpha = critic, actor, log_alpha
        self.cfg, self.shared, self.generator, self.sparse = cfg, shared, generator, sparse
        self.stochastic = cfg.flavour == "sac"
        self.act_dim, self.scale, self.low, self.high = act_dim, scale, low, high
        self.updates = 0
        self.fast: CompiledUpdate | None = None  # the compiled step, once compile() ran
        self.params = base.params(critic)
        self.opt = adam(self.params, cfg.critic_lr, cfg)

    def compile(self, options: CompileOptions) -> None:
        """From now on update with the compiled step (common/algorithms/steps.py): the joint
        forward through ``networks.renorm_twin_q``, the running statistics moved after Adam."""
        if not options.enabled:
            return
        buffers, spec, gamma = list(self.critic.buffers()), renorm_spec(self.critic), self.cfg.gamma

        def loss(params: list[torch.Tensor], batch: dict[str, torch.Tensor], next_action: torch.Tensor,
                 entropy: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, RenormStats]]:
            obs = batch["obs"]
            both, stats = networks.renorm_twin_q(params, buffers, torch.cat([obs, batch["next_obs"]]),
                                                 torch.cat([batch["action"], next_action]), spec, True)
            value, q_mean = joint_td_loss(both, obs.shape[0], entropy, batch["reward"], batch["done"], gamma)
            return value, (q_mean, stats)

        self.fast = steps.JointCriticStep(self, self.next_value, loss, buffers, spec.momentum, options,
                                          self.params[0].device)

    def noise(self, rows: int, device: torch.device) -> torch.Tensor:
        """A standard normal draw [rows, act_dim] from the part's RNG (what the compiled step draws)."""
        return torch.randn((rows, self.act_dim), generator=self.generator, device=device)

    def next_value(self, next_obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(a', the entropy term to subtract from min Q(s', a')) for standard normal ``noise``:
        sac: a' ~ pi and alpha log pi; td3: pi(s') with clipped smoothing noise, and 0."""
        if self.stochastic:
            action, logp = self.actor(next_obs, eps=noise)
            return action, self.log_alpha.detach().exp() * logp
        noise = (noise * self.cfg.policy_noise).clamp(-self.cfg.noise_clip, self.cfg.noise_clip)
        action = torch.clamp(torch.addcmul(self.actor(next_obs), noise, self.scale), self.low, self.high)
        return action, torch.zeros((), device=next_obs.device)

    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]:
        """One critic step: (s, a) and (s', a') through one train-mode forward; the (s', a')
        half, without gradient, gives the target r + gamma (1 - done) (min Q' - entropy term)."""
        if self.fast is not None:
            return self.fast.update(batch, want_metrics)
        obs, next_obs = batch["obs"], batch["next_obs"]
        with torch.no_grad():
            next_action, entropy = self.next_value(next_obs, self.noise(next_obs.shape[0], next_obs.device))
        both = self.critic(torch.cat([obs, next_obs]), torch.cat([batch["action"], next_action]))
        loss, q_mean = joint_td_loss(both, obs.shape[0], entropy, batch["reward"], batch["done"], self.cfg.gamma)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.updates += 1
        base.sparse_step(self.sparse, self.opt, self.updates)
        if not want_metrics:
            return {}
        return base.with_sparse(base.scalars([("critic_loss", loss), ("q_mean", q_mean)]), self.sparse)

    def critic_state(self) -> State:
        return base.module_state(self.critic)

    def load_actor(self, state: State, target: State | None, extras: Mapping[str, float]) -> None:
        """Copy the online actor (and, sac flavour, the temperature)."""
        if self.shared:
            return
        base.load_module_state(self.actor, state)
        if self.stochastic:
            base.load_temperature(self.log_alpha, extras)

    def named(self) -> Named:
        named: Named = {"critic": self.critic, "opt": self.opt, "generator": self.generator}
        if self.shared:
            return named
        return {**named, "actor": self.actor, **({"log_alpha": self.log_alpha} if self.stochastic else {})}



def build(obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, cfg: CrossQConfig,
          device: torch.device, shared: bool, seed: int,
          sp: Sparsifier) -> tuple[CrossQActorPart, CrossQCriticPart]:
    """CrossQ's parts (see common.algorithms.build.make_parts)."""
    def make_actor() -> nn.Module:
        if cfg.flavour == "sac":
            return networks.GaussianActor(obs_dim, act_dim, cfg.hidden, low, high, cfg.log_std_min, cfg.log_std_max)
        return networks.DeterministicActor(obs_dim, act_dim, cfg.hidden, low, high)

    def renorm(dim: int) -> nn.Module:
        return networks.BatchRenorm(dim, cfg.renorm_momentum, cfg.renorm_warmup, cfg.r_max, cfg.d_max)

    actor = builder.network(seed, builder.ACTOR_INIT, device, make_actor)
    actor_sparse = sp.mask(actor, "actor")
    critic = builder.network(seed, builder.CRITIC_INIT, device,
                             lambda: networks.RenormTwinCritic(obs_dim, act_dim, cfg.critic_hidden,
                                                               renorm))
    critic_sparse = sp.mask(critic, "critic")
    log_alpha = torch.nn.Parameter(torch.tensor(math.log(cfg.init_alpha), dtype=torch.float32, device=device),
                                   requires_grad=cfg.flavour == "sac" and cfg.autotune)
    lo = torch.as_tensor(low, dtype=torch.float32, device=device)
    hi = torch.as_tensor(high, dtype=torch.float32, device=device)
    actor_part = CrossQActorPart(actor, critic if shared else base.frozen_copy(critic), log_alpha, cfg, shared,
                                 builder.generator(device, seed, builder.ACTOR_RNG), act_dim, actor_sparse)
    critic_part = CrossQCriticPart(critic, actor if shared else base.frozen_copy(actor),
                                   log_alpha if shared else log_alpha.detach().clone(), cfg, shared,
                                   builder.generator(device, seed, builder.CRITIC_RNG), act_dim,
                                   (hi - lo) / 2.0, lo, hi, critic_sparse)
    return actor_part, critic_part


def plan_choices(cfg: CrossQConfig, on_gpu: bool) -> list[tuple[str, Any, str]]:
    """Observation normalisation (the authors' actor normalises its input), and on CPU critics
    no wider than CPU_CRITIC_WIDTH (a GPU keeps the configured width)."""
    choices: list[tuple[str, Any, str]] = [(
        "learner.obs_norm", True, "crossq: the authors' actor normalises its input (batch renorm); here the running "
        "observation statistics do (Hopper-v5, one seed: ~300-450 at 25k steps without, 1,536 at 41.6k with)")]
    narrow = [min(width, CPU_CRITIC_WIDTH) for width in cfg.critic_hidden]
    if not on_gpu and narrow != list(cfg.critic_hidden):
        choices.append(("critic_hidden", narrow, f"learners on CPU: {'-'.join(map(str, narrow))} critics (a "
                        "compiled update of 512-wide twin critics costs ~2.7x one of 256-wide on CPU; set "
                        f"crossq.critic_hidden to keep {'-'.join(map(str, cfg.critic_hidden))})"))
    return choices


ALGORITHM = Algorithm(name="crossq", config=CrossQConfig, build=build,
                      policy_delay=lambda cfg: cfg.policy_delay,
                      exploration_noise=lambda cfg: cfg.exploration_noise if cfg.flavour == "td3" else 0.0,
                      actor_nets=("actor",), plan_choices=plan_choices)  # TD targets use the online actor (sac: and the temperature in extras)
