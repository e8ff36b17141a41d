"""Compiled steps: an algorithm's update, from the functions its module writes once.

The algorithm (common/algorithms/td3.py, sac.py, crossq.py) writes its TD target and its losses as
functions of (parameters, batch, noise); its eager ``update`` calls them with autograd and
torch's Adam, and the steps here call the same functions inside one compiled function
(machinery: common/algorithms/compiled.py):

- the twin critics run as one batched network (:func:`spreeze.common.networks.twin_q`);
- gradients come from ``torch.func.grad_and_value`` and Adam is written out
  (:class:`~common.algorithms.compiled.AdamState`, torch's formula, torch's state tensors);
- the noise (TD3's target smoothing, SAC's reparameterisation) is drawn *outside* the graph
  from the part's own generator, in the eager order, so compiled and eager parts, fused and
  split, draw identical noise;
- the Polyak rate is an input: 0 on an update without a target update, so TD3's every
  ``policy_delay``-th target update is the same graph as the others;
- what cannot be a fixed graph runs eagerly around it, as rarely as in the eager part: the
  sparse topology adaptation every ``sparse.every`` updates (on that update the Polyak step
  moves after it, as in the eager order) and the target pruning that follows one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.func import grad_and_value

from spreeze.common.algorithms.base import Batch, Target, polyak, scalars, sparse_prune, twin_loss, with_sparse
from spreeze.common.algorithms.compiled import AdamState, CompiledStep, CompileOptions, Trained
from spreeze.common.networks import RenormStats, move_renorm_stats
from spreeze.common.sparse import SparseTopology

BATCH_KEYS = ("obs", "action", "reward", "next_obs", "done")
Tensor = torch.Tensor
TargetFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]  # (next_obs, reward, done, noise) -> TD target
ActorLoss = Callable[[list[Tensor], Tensor], Tensor]  # (actor params, obs) -> loss
StochasticLoss = Callable[[list[Tensor], Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]  # (params, obs, eps, alpha) -> (loss, logp)
TemperatureFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (log_alpha, logp) -> (loss, d loss / d log_alpha)
NextValue = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (next_obs, noise) -> (a', entropy term)
JointLoss = Callable[[list[Tensor], dict[str, Tensor], Tensor, Tensor],
                     tuple[Tensor, tuple[Tensor, RenormStats]]]  # (params, batch, a', entropy) -> (loss, (q_mean, stats))


class Trainee(Protocol):
    """What a compiled step uses of the part it updates (public members only)."""

    updates: int

    @property
    def params(self) -> list[torch.Tensor]: ...  # the trained network's parameters, in order
    @property
    def opt(self) -> torch.optim.Optimizer: ...  # their Adam (its state is the step's)
    @property
    def sparse(self) -> SparseTopology | None: ...  # their masks (None: dense)


class Noisy(Trainee, Protocol):
    @property
    def generator(self) -> torch.Generator: ...  # the part's noise RNG


class Hyper(Protocol):
    """The hyperparameters the TD3 and SAC steps read (TD3Config, SACConfig)."""

    @property
    def tau(self) -> float: ...
    @property
    def gamma(self) -> float: ...


class TwinCriticPart(Noisy, Protocol):
    @property
    def cfg(self) -> Hyper: ...
    @property
    def target(self) -> Target[Any]: ...


class TargetedActor(Trainee, Protocol):
    """A deterministic actor part, with or without a target actor, as its compiled step sees it."""

    @property
    def target(self) -> Target[Any] | None: ...


class SACActor(Noisy, Protocol):
    """SAC's actor part as its compiled step sees it."""

    @property
    def log_alpha(self) -> torch.Tensor: ...
    @property
    def alpha_opt(self) -> torch.optim.Optimizer | None: ...


def _noise(part: Noisy, batch: Batch) -> torch.Tensor:
    """A standard normal draw of the action batch's shape from the part's generator."""
    a = batch["action"]
    return torch.randn(a.shape, generator=part.generator, device=a.device, dtype=a.dtype)


def _taus(tau: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.tensor(tau, dtype=torch.float32, device=device),
            torch.zeros((), dtype=torch.float32, device=device))


class FastUpdate:
    """Shared by the steps: the compiled function, its warm-up, and the eager work around it."""

    step: CompiledStep
    trained: Trained

    def __init__(self, part: Trainee, tau: float, device: torch.device) -> None:
        self.part, self.tau = part, tau
        self.tau_on, self.tau_off = _taus(tau, device)

    def inputs(self, batch: Batch, with_polyak: bool) -> list[torch.Tensor]:
        """The step's arguments for this batch (noise drawn now; Polyak rate 0 unless ``with_polyak``)."""
        raise NotImplementedError

    def warm_up(self, batch: Batch) -> float:
        """Compile for this batch's shapes on it (a dummy batch will do), changing no state;
        returns the seconds it took."""
        return self.step.warm_up(*self._dummy_inputs(batch))

    def _dummy_inputs(self, batch: Batch) -> list[torch.Tensor]:
        return self.inputs(batch, True)

    def update(self, batch: Batch, want_metrics: bool) -> dict[str, float]:
        """One update of the part (its compiled step and the eager work around it)."""
        raise NotImplementedError

    def rebind(self) -> None:
        """After the part loaded a checkpoint: keep the optimizer state at its addresses."""
        self.trained.adam.rebind()

    def run(self, batch: Batch, n: int, polyak_due: bool) -> tuple[torch.Tensor, ...]:
        """Update number ``n`` of the part: the compiled step, then the eager topology work."""
        sparse = self.part.sparse
        adapting = sparse is not None and sparse.due(n)
        out = self.step(*self.inputs(batch, polyak_due and not adapting))
        if adapting and sparse is not None:
            sparse.adapt(self.part.opt)
            if polyak_due:
                polyak(self.trained.targets, self.trained.params, self.tau)
        if polyak_due:
            sparse_prune(sparse)
        return out


class CriticStep(FastUpdate):
    """TD3 / SAC critic update: TD target (``target_fn``), twin regression, Adam, Polyak."""

    def __init__(self, part: TwinCriticPart, target_fn: TargetFn, polyak_every: int, options: CompileOptions,
                 device: torch.device) -> None:
        super().__init__(part, part.cfg.tau, device)
        self.noisy = part
        self.polyak_every = polyak_every
        t = self.trained = Trained(part.params, part.opt, part.target.params, part.sparse)

        def step(obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, next_obs: torch.Tensor,
                 done: torch.Tensor, noise: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, ...]:
            with torch.no_grad():
                y = target_fn(next_obs, reward, done, noise)

            def loss_fn(ps: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
                return twin_loss(ps, obs, action, y)

            grads, (loss, q_mean) = grad_and_value(loss_fn, has_aux=True)(t.inputs())
            with torch.no_grad():
                t.apply_(grads, tau)
            return loss.detach(), q_mean.detach()

        self.step = CompiledStep(step, t.mutated(), device, options)

    def inputs(self, batch: Batch, with_polyak: bool) -> list[torch.Tensor]:
        return [*(batch[k] for k in BATCH_KEYS), _noise(self.noisy, batch),
                self.tau_on if with_polyak else self.tau_off]

    def _dummy_inputs(self, batch: Batch) -> list[torch.Tensor]:
        return [*(batch[k] for k in BATCH_KEYS), torch.randn_like(batch["action"]), self.tau_on]

    def update(self, batch: Batch, want_metrics: bool) -> dict[str, float]:
        n = self.part.updates + 1
        loss, q_mean = self.run(batch, n, n % self.polyak_every == 0)
        self.part.updates = n
        if not want_metrics:
            return {}
        return with_sparse(scalars([("critic_loss", loss), ("q_mean", q_mean)]), self.part.sparse)


class ActorStep(FastUpdate):
    """A deterministic actor's update: its loss (``loss(params, obs)``), Adam, Polyak of its
    target (an actor without a target, as CrossQ's: none)."""

    def __init__(self, part: TargetedActor, loss: ActorLoss, options: CompileOptions, device: torch.device) -> None:
        target = part.target
        super().__init__(part, target.tau if target is not None else 0.0, device)
        self.polyak = target is not None
        t = self.trained = Trained(part.params, part.opt, target.params if target is not None else (), part.sparse)

        def step(obs: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, ...]:
            grads, value = grad_and_value(loss)(t.inputs(), obs)
            with torch.no_grad():
                t.apply_(grads, tau)
            return (value.detach(),)

        self.step = CompiledStep(step, t.mutated(), device, options)

    def inputs(self, batch: Batch, with_polyak: bool) -> list[torch.Tensor]:
        return [batch["obs"], self.tau_on if with_polyak else self.tau_off]

    def update(self, batch: Batch, want_metrics: bool) -> dict[str, float]:
        (loss,) = self.run(batch, self.part.updates + 1, self.polyak)
        self.part.updates += 1
        return with_sparse(scalars([("actor_loss", loss)]), self.part.sparse) if want_metrics else {}


class SACActorStep(FastUpdate):
    """Actor step on its loss (``loss(params, obs, eps, alpha) -> (loss, logp)``), then the
    temperature step (autotune) from ``temperature(log_alpha, logp) -> (loss, gradient)``."""

    def __init__(self, part: SACActor, loss: StochasticLoss, temperature: TemperatureFn, options: CompileOptions,
                 device: torch.device) -> None:
        super().__init__(part, 0.0, device)
        self.noisy = part
        t = self.trained = Trained(part.params, part.opt, (), part.sparse)
        log_alpha = part.log_alpha
        alpha_adam = AdamState(part.alpha_opt) if part.alpha_opt is not None else None
        self.alpha_adam = alpha_adam

        def step(obs: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, ...]:
            la = log_alpha.detach()
            alpha = la.exp()
            grads, (value, logp) = grad_and_value(loss, has_aux=True)(t.inputs(), obs, eps, alpha)
            with torch.no_grad():
                t.apply_(grads, None)
                out = (value.detach(), alpha, -logp.mean())
                if alpha_adam is None:
                    return out
                alpha_loss, alpha_grad = temperature(la, logp)  # before the step: la aliases log_alpha
                alpha_adam.update_([alpha_grad])
                return (*out, alpha_loss)

        mutated = t.mutated() + ([log_alpha.detach(), *alpha_adam.tensors()] if alpha_adam else [])
        self.step = CompiledStep(step, mutated, device, options)

    def inputs(self, batch: Batch, with_polyak: bool) -> list[torch.Tensor]:
        return [batch["obs"], _noise(self.noisy, batch)]

    def _dummy_inputs(self, batch: Batch) -> list[torch.Tensor]:
        return [batch["obs"], torch.randn_like(batch["action"])]

    def rebind(self) -> None:
        super().rebind()
        if self.alpha_adam is not None:
            self.alpha_adam.rebind()

    def update(self, batch: Batch, want_metrics: bool) -> dict[str, float]:
        out = self.run(batch, self.part.updates + 1, False)
        self.part.updates += 1
        if not want_metrics:
            return {}
        names = ("actor_loss", "alpha", "entropy", "alpha_loss")
        return with_sparse(scalars(list(zip(names, out))), self.part.sparse)


class JointCriticStep(FastUpdate):
    """A critic without target networks whose normalisation layers keep running statistics
    (CrossQ): a' and the entropy term from ``next_value(next_obs, noise)``, then
    ``loss(params, batch, a', entropy) -> (loss, (q_mean, batch statistics))``, Adam, and the
    running statistics (``buffers``) move by ``momentum`` (networks.move_renorm_stats)."""

    def __init__(self, part: Noisy, next_value: NextValue, loss: JointLoss, buffers: list[torch.Tensor],
                 momentum: float, options: CompileOptions, device: torch.device) -> None:
        super().__init__(part, 0.0, device)
        self.noisy = part
        t = self.trained = Trained(part.params, part.opt, (), part.sparse)

        def step(obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, next_obs: torch.Tensor,
                 done: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, ...]:
            batch = {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs, "done": done}
            with torch.no_grad():
                next_action, entropy = next_value(next_obs, noise)

            def loss_fn(ps: list[torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor, RenormStats]]:
                return loss(ps, batch, next_action, entropy)

            grads, (value, (q_mean, stats)) = grad_and_value(loss_fn, has_aux=True)(t.inputs())
            with torch.no_grad():
                t.apply_(grads, None)
                move_renorm_stats(buffers, stats, momentum)
            return value.detach(), q_mean.detach()

        self.step = CompiledStep(step, [*t.mutated(), *buffers], device, options)

    def inputs(self, batch: Batch, with_polyak: bool) -> list[torch.Tensor]:
        return [*(batch[k] for k in BATCH_KEYS), _noise(self.noisy, batch)]

    def _dummy_inputs(self, batch: Batch) -> list[torch.Tensor]:
        return [*(batch[k] for k in BATCH_KEYS), torch.randn_like(batch["action"])]

    def update(self, batch: Batch, want_metrics: bool) -> dict[str, float]:
        n = self.part.updates + 1
        loss, q_mean = self.run(batch, n, False)
        self.part.updates = n
        if not want_metrics:
            return {}
        return with_sparse(scalars([("critic_loss", loss), ("q_mean", q_mean)]), self.part.sparse)
