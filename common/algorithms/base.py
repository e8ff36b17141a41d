"""Shared interfaces and helpers for the split actor / critic algorithm parts.

An algorithm is two parts: the :class:`ActorPart` (actor-learner) and the
:class:`CriticPart` (critic-learner). They exchange weights as :data:`State` dicts. Built
with ``shared=True`` they hold the same module objects, and :func:`fused_step` then is
exactly the standard single-process algorithm (the correctness reference).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from spreeze.common.sparse import SparseTopology

Batch = dict[str, torch.Tensor]
"""obs [B,obs_dim], action [B,act_dim], reward [B], next_obs [B,obs_dim], done [B] (1.0 =
terminated, no bootstrap; truncation is stored as 0.0); all float32 on the learner device."""
State = dict[str, np.ndarray]
"""Flat ``state_dict`` name -> float32 C-contiguous numpy array (a copy, safe to send)."""

M = TypeVar("M", bound=nn.Module)


class ActorPart(Protocol):
    """The actor-learner's half: actor (+ SAC temperature) and a read-only critic copy."""

    updates: int
    policy_delay: int  # call update() once per this many critic updates (TD3: d, SAC: 1)
    sparse: SparseTopology | None  # the actor's masks (None: dense)
    fast: Any  # the compiled step (common/algorithms/steps.py) once compile() ran, else None
    actor: nn.Module  # the acting network (common/policy_export.py describes it to samplers)

    def compile(self, options: Any) -> None: ...
    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]: ...
    def actor_state(self) -> State: ...
    def target_actor_state(self) -> State | None: ...
    def extras(self) -> dict[str, float]: ...
    def load_critic(self, state: State) -> None: ...
    def save(self) -> dict[str, Any]: ...
    def load(self, d: dict[str, Any]) -> None: ...


class CriticPart(Protocol):
    """The critic-learner's half: twin critics, their targets and a read-only actor copy."""

    updates: int
    sparse: SparseTopology | None  # the critics' masks (None: dense)
    fast: Any  # the compiled step (common/algorithms/steps.py) once compile() ran, else None

    def compile(self, options: Any) -> None: ...
    def update(self, batch: Batch, want_metrics: bool = True) -> dict[str, float]: ...
    def critic_state(self) -> State: ...
    def load_actor(self, state: State, target: State | None,
                   extras: Mapping[str, float]) -> None: ...
    def save(self) -> dict[str, Any]: ...
    def load(self, d: dict[str, Any]) -> None: ...


def fused_step(actor: ActorPart, critic: CriticPart, batch: Batch,
               want_metrics: bool = True) -> dict[str, float]:
    """One step of the standard algorithm: a critic update, then an actor update every
    ``actor.policy_delay`` critic updates, on the same batch."""
    metrics = critic.update(batch, want_metrics)
    if critic.updates % actor.policy_delay == 0:
        metrics.update(actor.update(batch, want_metrics))
    return metrics


def seeded(seed: int, factory: Callable[[], M]) -> M:
    """Build a module with the CPU RNG seeded, leaving the global RNG state untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory()


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """A private RNG for one part, so fused and split runs draw identical noise."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def frozen_copy(module: M) -> M:
    """A deep copy whose parameters never take gradients (targets and peer copies)."""
    dup = copy.deepcopy(module)
    dup.requires_grad_(False)
    return dup


def adam(module_params: list[torch.Tensor], lr: float, weight_decay: float) -> torch.optim.Adam:
    """Adam with the fused kernel (one kernel for all tensors, CPU and CUDA)."""
    return torch.optim.Adam(module_params, lr=lr, weight_decay=weight_decay, fused=True)


def polyak(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """In-place ``target += tau * (online - target)`` for all tensors at once."""
    with torch.no_grad():
        torch._foreach_lerp_(target, online, tau)


def module_state(module: nn.Module) -> State:
    """Snapshot of a module's ``state_dict`` as CPU float32 numpy copies."""
    return {k: np.ascontiguousarray(v.detach().to("cpu", copy=True).numpy())
            for k, v in module.state_dict().items()}


def load_module_state(module: nn.Module, state: Mapping[str, np.ndarray]) -> None:
    """Copy ``state`` into the module's existing tensors in place (no reallocation).

    Raises ``ValueError`` on a missing key or a shape mismatch (``copy_`` would broadcast).
    """
    targets = module.state_dict()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only zmq buffers: copied at once
        for name, tensor in targets.items():
            if name not in state:
                raise ValueError(f"state is missing {name!r}")
            arr = np.asarray(state[name])
            if arr.shape != tuple(tensor.shape):
                raise ValueError(f"state[{name!r}] shape {arr.shape} != {tuple(tensor.shape)}")
            tensor.copy_(torch.from_numpy(arr))


def params(module: nn.Module) -> list[torch.Tensor]:
    """The module's parameters as a list (for foreach ops and optimizers)."""
    return list(module.parameters())


def scalars(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
    """Turn 0-dim tensors into python floats with a single device sync."""
    pairs = list(named)
    values = torch.stack([t.detach().float() for _, t in pairs]).tolist()
    return {name: v for (name, _), v in zip(pairs, values)}


def optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """A deep snapshot of an optimizer's state (not aliased to live tensors)."""
    return copy.deepcopy(opt.state_dict())


def module_snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """A cloned ``state_dict`` (not aliased to live tensors), torch.save-able."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def sparse_step(sparse: SparseTopology | None, opt: torch.optim.Optimizer, updates: int) -> None:
    """After ``opt.step()``: re-mask and maybe adapt the topology (nothing when dense)."""
    if sparse is not None:
        sparse.step(opt, updates)


def sparse_prune(sparse: SparseTopology | None) -> None:
    """After ``polyak(...)``: magnitude-prune the target to the online count (nothing when dense)."""
    if sparse is not None:
        sparse.prune_target()


def with_sparse(metrics: dict[str, float], sparse: SparseTopology | None) -> dict[str, float]:
    """``metrics`` plus the topology's metrics when sparse (call only when metrics are wanted)."""
    if sparse is not None:
        metrics.update(sparse.metrics())
    return metrics


def save_sparse(d: dict[str, Any], sparse: SparseTopology | None) -> dict[str, Any]:
    """Add the topology (masks, RNG) to a part's checkpoint dict when sparse."""
    if sparse is not None:
        d["sparse"] = sparse.state_dict()
    return d


def load_sparse(d: dict[str, Any], sparse: SparseTopology | None) -> None:
    """Inverse of `save_sparse`."""
    if sparse is not None:
        sparse.load_state_dict(d["sparse"])


def save_critics(part: Any) -> dict[str, Any]:
    """What every critic part checkpoints: critics, targets, optimizer, noise RNG, count, masks."""
    return save_sparse({"critic": module_snapshot(part.critic), "updates": part.updates,
                        "critic_target": module_snapshot(part.critic_target),
                        "opt": optimizer_state(part.opt), "generator": part.generator.get_state()},
                       part.sparse)


def load_critics(part: Any, d: dict[str, Any]) -> None:
    """Inverse of `save_critics`."""
    part.critic.load_state_dict(d["critic"])
    part.critic_target.load_state_dict(d["critic_target"])
    part.opt.load_state_dict(d["opt"])
    part.generator.set_state(d["generator"])
    part.updates = int(d["updates"])
    load_sparse(d, part.sparse)


def critic_step(part: Any, batch: Batch, y: torch.Tensor, update_targets: bool,
                want_metrics: bool) -> dict[str, float]:
    """One twin-critic regression step toward `y`, shared by TD3 and SAC: MSE of both
    heads, optimizer step, sparse mask step, then (if asked) Polyak targets + pruning."""
    q1, q2 = part.critic(batch["obs"], batch["action"])
    loss = torch.nn.functional.mse_loss(q1, y) + torch.nn.functional.mse_loss(q2, y)
    part.opt.zero_grad(set_to_none=True)
    loss.backward()
    part.opt.step()
    part.updates += 1
    sparse_step(part.sparse, part.opt, part.updates)
    if update_targets:
        polyak(part._target_params, part._params, part.cfg.tau)
        sparse_prune(part.sparse)
    if not want_metrics:
        return {}
    return with_sparse(scalars([("critic_loss", loss), ("q_mean", q1.mean())]), part.sparse)
