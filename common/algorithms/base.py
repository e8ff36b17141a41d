"""Shared interfaces and helpers for the split actor / critic algorithm parts.

An algorithm is two parts: the :class:`ActorPart` (actor-learner) and the
:class:`CriticPart` (critic-learner). They exchange weights as :data:`State` dicts. Built
with ``shared=True`` they hold the same module objects, and :func:`fused_step` then is
exactly the standard single-process algorithm (the correctness reference).

A part trains its own networks in train mode and keeps the copies it only reads (targets,
the peer's networks) in eval mode, so a normalisation layer behaves as the algorithm means
it to. A part checkpoints what it names (`Named`): `save_named` and `load_named` write and
read exactly those entries, and a checkpoint of another algorithm or shape is refused with
one `CheckpointMismatch` that names what differs.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from spreeze.common.algorithms.compiled import CompiledStep, CompileOptions
from spreeze.common.networks import twin_q
from spreeze.common.sparse import SparseTopology

Batch = dict[str, torch.Tensor]
"""obs [B,obs_dim], action [B,act_dim], reward [B], next_obs [B,obs_dim], done [B] (1.0 =
terminated, no bootstrap; truncation is stored as 0.0); all float32 on the learner device."""
State = dict[str, np.ndarray]
"""Flat ``state_dict`` name -> float32 C-contiguous numpy array (a copy, safe to send)."""

M = TypeVar("M", bound=nn.Module)


class CompiledUpdate(Protocol):
    """A part's compiled update (common/algorithms/steps.py), as the learner drives it."""

    @property
    def step(self) -> CompiledStep: ...  # the compiled function (its compile count and seconds)
    def warm_up(self, batch: Batch) -> float: ...
    def update(self, batch: Batch, want_metrics: bool) -> dict[str, float]: ...
    def rebind(self) -> None: ...


class ActorPart(Protocol):
    """The actor-learner's half: actor (+ SAC temperature) and a read-only critic copy."""

    updates: int
    policy_delay: int  # call update() once per this many critic updates (TD3: d, SAC: 1)
    sparse: SparseTopology | None  # the actor's masks (None: dense)
    fast: CompiledUpdate | None  # the compiled step once compile() ran (None: eager; an algorithm may have none)
    algo: str  # the algorithm's name, written into its checkpoints

    @property
    def actor(self) -> nn.Module:
        """The acting network (common/policy_export.py describes it to samplers)."""

    def compile(self, options: CompileOptions) -> None: ...
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
    fast: CompiledUpdate | None  # the compiled step once compile() ran (None: eager; an algorithm may have none)
    algo: str  # the algorithm's name, written into its checkpoints

    def compile(self, options: CompileOptions) -> None: ...
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


def frozen_copy(module: M) -> M:
    """A deep copy whose parameters never take gradients, in eval mode (targets, peer copies)."""
    dup = copy.deepcopy(module)
    dup.requires_grad_(False)
    return dup.eval()


class Target(Generic[M]):
    """A target network: a frozen copy of ``online`` moved toward it by Polyak averaging
    (Lillicrap et al. 2016), pruned to the online network's sparsity when it is sparse."""

    def __init__(self, online: M, sparse: SparseTopology | None, tau: float) -> None:
        self.network: M = frozen_copy(online)
        self.online_params, self.params = params(online), params(self.network)
        self.sparse, self.tau = sparse, tau
        if sparse is not None:
            sparse.attach_target(self.network)

    def update(self) -> None:
        """``target += tau * (online - target)``, then the sparse pruning (nothing when dense)."""
        polyak(self.params, self.online_params, self.tau)
        sparse_prune(self.sparse)


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


def load_temperature(log_alpha: torch.Tensor, extras: Mapping[str, float]) -> None:
    """Set ``log_alpha`` in place from a peer's extras: its exact ``log_alpha``, else log of ``alpha``."""
    la = extras["log_alpha"] if "log_alpha" in extras else math.log(extras["alpha"])
    with torch.no_grad():
        log_alpha.fill_(la)


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


Saved = nn.Module | torch.optim.Optimizer | torch.Generator | torch.Tensor
"""What a part checkpoints under a name: a network, an optimizer, an RNG or a tensor."""
Named = dict[str, Saved]


class CheckpointMismatch(ValueError):
    """A checkpoint that is not of this part: another algorithm, other entries, other shapes."""


def save_named(algo: str, updates: int, named: Mapping[str, Saved],
               sparse: SparseTopology | None) -> dict[str, Any]:
    """A part's checkpoint: its algorithm, update count, each named entry's state, its masks."""
    d: dict[str, Any] = {"algo": algo, "updates": updates,
                         "states": {name: _state_of(obj) for name, obj in named.items()}}
    return save_sparse(d, sparse)


def _state_of(obj: Saved) -> Any:
    if isinstance(obj, nn.Module):
        return module_snapshot(obj)
    if isinstance(obj, torch.optim.Optimizer):
        return optimizer_state(obj)
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    return obj.detach().clone()


def load_named(what: str, algo: str, named: Mapping[str, Saved], d: dict[str, Any],
               sparse: SparseTopology | None) -> int:
    """Restore ``named`` from ``save_named``'s dict; the update count. ``CheckpointMismatch``
    naming what differs (``what``: the part) when it is another algorithm's, holds other
    entries, or entries of other shapes; nothing is loaded then."""
    saved_algo, states = d.get("algo"), d.get("states")
    if saved_algo != algo or not isinstance(states, dict):
        raise CheckpointMismatch(f"{what}: the checkpoint is of algorithm {saved_algo!r}, this run's is {algo!r}")
    if set(states) != set(named):
        missing, extra = sorted(set(named) - set(states)), sorted(set(states) - set(named))
        raise CheckpointMismatch(f"{what}: the checkpoint holds {', '.join(sorted(states))}; "
                                 f"missing {missing}, not expected {extra}")
    for name, obj in named.items():
        if isinstance(obj, nn.Module):
            _check_shapes(f"{what}: {name}", obj.state_dict(), states[name])
        elif isinstance(obj, torch.Tensor):
            _check_shapes(f"{what}: {name}", {"": obj}, {"": states[name]})
    for name, obj in named.items():
        state = states[name]
        if isinstance(obj, torch.Generator):
            obj.set_state(state)
        elif isinstance(obj, torch.Tensor):
            with torch.no_grad():
                obj.copy_(state)
        else:
            obj.load_state_dict(state)
    load_sparse(d, sparse)
    return int(d["updates"])


def _check_shapes(what: str, mine: Mapping[str, torch.Tensor], saved: Any) -> None:
    if not isinstance(saved, Mapping) or set(saved) != set(mine):
        keys = sorted(saved) if isinstance(saved, Mapping) else type(saved).__name__
        raise CheckpointMismatch(f"{what} holds {keys}, this run's has {sorted(mine)}")
    for key, tensor in mine.items():
        got = tuple(getattr(saved[key], "shape", ()))
        if got != tuple(tensor.shape):
            raise CheckpointMismatch(f"{what}{'.' + key if key else ''} has shape {got}, this run's "
                                     f"{tuple(tensor.shape)}")


def twin_loss(params: list[torch.Tensor], obs: torch.Tensor, action: torch.Tensor,
              y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The twin critics' regression toward ``y`` from their parameters (TD3 and SAC, eager and
    compiled): the sum of both heads' mean squared errors, and Q1's mean."""
    q = twin_q(params, obs, action)
    return (q - y).square().mean(1).sum(), q[0].mean()


class TwinCriticTrainer(Protocol):
    """What `critic_step` uses of a critic part that regresses twin critics (TD3, SAC)."""

    @property
    def params(self) -> list[torch.Tensor]: ...
    @property
    def opt(self) -> torch.optim.Optimizer: ...
    @property
    def target(self) -> Target[Any] | None: ...
    @property
    def sparse(self) -> SparseTopology | None: ...
    updates: int


def critic_step(part: TwinCriticTrainer, batch: Batch, y: torch.Tensor, update_targets: bool,
                want_metrics: bool) -> dict[str, float]:
    """One twin-critic regression step toward `y`, shared by TD3 and SAC: MSE of both
    heads, optimizer step, sparse mask step, then (if asked) the target update."""
    loss, q_mean = twin_loss(part.params, batch["obs"], batch["action"], y)
    part.opt.zero_grad(set_to_none=True)
    loss.backward()
    part.opt.step()
    part.updates += 1
    sparse_step(part.sparse, part.opt, part.updates)
    if update_targets and part.target is not None:
        part.target.update()
    if not want_metrics:
        return {}
    return with_sparse(scalars([("critic_loss", loss), ("q_mean", q_mean)]), part.sparse)
