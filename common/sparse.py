"""Dynamic sparse training of the actor and critics (DS-TD3 / DS-SAC, Sokar et al. 2022).

A :class:`SparseTopology` owns the masks of one *trained* network's hidden layers, found by
module type: every ``nn.Linear`` of an ``nn.Sequential`` that something follows in it (an
activation, a normalisation, another Linear: whatever sits between), i.e. the hidden layers
:func:`spreeze.common.networks.mlp` builds, the first one included. A Linear that ends its
Sequential or stands alone (an output layer, SAC's head) and all biases stay dense. The
algorithm part that trains the network holds it and calls:

- :meth:`SparseTopology.step` right after ``opt.step()``: re-zero masked weights, then every
  ``every`` updates of that part adapt the topology (drop + regrow);
- :meth:`SparseTopology.prune_target` right after ``polyak(...)``: magnitude-prune the
  target network to the online connection count.

With ``network: dense`` no topology exists and the parts' hot path is unchanged.

Decisions:

- Masking zeroes *weights*, never gradients: a masked weight is 0 in the forward pass, so
  ``dL/dW_ij = delta_i * x_j`` at an empty position is exactly the dense gradient. The
  weight's ``.grad`` after ``backward()`` is therefore dense, and since adaptation runs in
  :meth:`step` right after ``opt.step()`` (before the next ``zero_grad``), RigL growth reads
  it from the current batch at no extra cost.
- Adam state: at every dropped and every regrown position ``exp_avg`` and ``exp_avg_sq`` are
  zeroed (as RigL resets optimizer slots). Because gradients stay dense, Adam keeps moments
  at empty positions of a connection that did not exist; a regrown weight starts at 0 as a
  fresh parameter instead of inheriting them, and a dropped one keeps no stale state. (Adam's
  bias correction uses the tensor's step count, so a fresh moment's first steps are somewhat
  larger than lr; accepted, it is what RigL does.)
- Target networks: only after an adaptation can the target's support leave the online mask
  (Polyak of two tensors zero outside the mask stays zero there), so pruning runs only from
  then until the target's support lies inside the mask again (checked every
  ``ALIGN_CHECK_EVERY`` prunes; pruning a target inside the mask changes nothing).
- The topology's random draws (initial masks, SET regrowth) use its own CPU generator,
  seeded from the run seed and the role, and saved with the masks: fused and split parts
  built with one seed get the same masks, and checkpoints restore the topology exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import numpy as np
import torch
from torch import nn

from spreeze.common.sparse_config import SparseConfig
from spreeze.common.sparse_masks import (
    Shape,
    change_count,
    connection_count,
    drop_indices,
    grow_gradient,
    grow_random,
    keep_largest,
    lambda_densities,
    random_mask,
    target_densities,
    zero_optimizer_state,
)
from spreeze.common.sparse_stats import (
    LayerStats,
    dense_training_flops,
    overall_sparsity,
    training_flops_ratio,
)

_ROLES = {"actor": 1, "critic": 2}
_MASK_STREAM = 0x5BA25E  # keeps mask seeds apart from every other use of the run seed
ALIGN_CHECK_EVERY = 8  # target prunes between checks (each one device sync) that it is inside the mask


def forward_flops(module: nn.Module, nnz: Mapping[str, int]) -> tuple[int, int]:
    """(dense, sparse) forward multiply-adds per sample of every ``nn.Linear`` in ``module``;
    ``nnz`` maps a weight name (``"qf1.0.weight"``) to its connection count."""
    dense = sparse = 0
    for name, layer in module.named_modules():
        if isinstance(layer, nn.Linear):
            size = layer.in_features * layer.out_features
            dense += size
            sparse += nnz.get(f"{name}.weight", size)
    return dense, sparse


def hidden_layers(module: nn.Module) -> list[tuple[str, nn.Linear, int]]:
    """(name, layer, depth) of each Linear that some module follows in its ``nn.Sequential``
    (whatever that module is); depth counts the hidden layers of that Sequential from 0."""
    found = []
    for seq_name, seq in module.named_modules():
        if not isinstance(seq, nn.Sequential):
            continue
        kids, depth = list(seq.named_children()), 0
        for (name, layer), _ in pairwise(kids):
            if isinstance(layer, nn.Linear):
                found.append((f"{seq_name}.{name}" if seq_name else name, layer, depth))
                depth += 1
    return found


def densities(cfg: SparseConfig, shapes: list[Shape], depths: list[int]) -> list[float]:
    """Initial density per layer: ER with per-depth lambdas, or one scale for ``sparsity``."""
    if cfg.sparsity is not None:
        return target_densities(shapes, cfg.sparsity)
    last = len(cfg.lambdas) - 1
    return lambda_densities(shapes, [cfg.lambdas[min(d, last)] for d in depths])


def mask_seed(seed: int, role: str) -> int:
    """Seed of a topology's generator, distinct per (run seed, role)."""
    return int(np.random.SeedSequence([seed, _ROLES[role], _MASK_STREAM]).generate_state(1)[0])


class SparseTopology:
    """Masks of one network's hidden layers; see the module docstring for the protocol.

    ``total_updates``: the run's budget in critic updates (0 = unknown, never freeze);
    ``unit``: critic updates per update of this network (TD3 actor: policy_delay), so the
    freeze threshold compares ``updates * unit`` with ``total_updates - freeze_last``.
    """

    def __init__(self, module: nn.Module, cfg: SparseConfig, seed: int, role: str,
                 total_updates: int = 0, unit: int = 1) -> None:
        self.cfg, self.role, self.total_updates, self.unit = cfg, role, total_updates, unit
        self.generator = torch.Generator().manual_seed(mask_seed(seed, role))
        found = hidden_layers(module)
        if not found:
            raise ValueError(f"{type(module).__name__} has no hidden Linear layers to sparsify")
        self.names = [f"{name}.weight" for name, _, _ in found]
        self.weights = [layer.weight for _, layer, _ in found]
        shapes: list[Shape] = [(w.shape[0], w.shape[1]) for w in self.weights]
        dens = densities(cfg, shapes, [depth for _, _, depth in found])
        self.counts = [connection_count(s, d) for s, d in zip(shapes, dens)]
        self.masks = [random_mask(s, c, self.generator).to(w.device, w.dtype)
                      for s, c, w in zip(shapes, self.counts, self.weights)]
        self.grown = [torch.zeros(w.numel(), dtype=torch.bool, device=w.device) for w in self.weights]
        self.targets: list[torch.Tensor] = []
        self.adaptations, self.target_dirty, self._prunes = 0, False, 0
        self.last: dict[str, float] = {}
        self._account(module)
        self.apply()

    def _account(self, module: nn.Module) -> None:
        """Cache the (constant) sparsity and FLOPs ratio reported as metrics."""
        dense, sparse = forward_flops(module, dict(zip(self.names, self.counts)))
        rigl = self.cfg.every if self.cfg.dynamic and self.cfg.growth == "gradient" else None
        self.flops_ratio = training_flops_ratio(dense, sparse, rigl)
        self.dense_flops = dense_training_flops(dense, self.unit)
        self.sparsity = overall_sparsity(self.layer_stats(measure=False))

    def attach_target(self, target: nn.Module) -> None:
        """Track ``target``'s copies of the sparse weights (pruned by :meth:`prune_target`)."""
        named = dict(target.named_parameters())
        self.targets = [named[name] for name in self.names]

    def set_mask(self, index: int, mask: torch.Tensor) -> None:
        """Replace layer ``index``'s mask (any 0/1 or bool tensor of its shape) and re-mask."""
        self.masks[index].copy_(mask)
        self.counts[index] = int(self.masks[index].count_nonzero())
        self.apply()

    def apply(self) -> None:
        """Zero the masked weights (one foreach multiply)."""
        with torch.no_grad():
            torch._foreach_mul_(self.weights, self.masks)

    def frozen(self, updates: int) -> bool:
        """True once ``updates`` of this network reach the frozen tail of the budget."""
        return self.total_updates > 0 and updates * self.unit >= self.total_updates - self.cfg.freeze_last

    def due(self, updates: int) -> bool:
        """Whether update number ``updates`` (1-based) ends with an adaptation."""
        return self.cfg.dynamic and updates % self.cfg.every == 0 and not self.frozen(updates)

    def step(self, opt: torch.optim.Optimizer, updates: int) -> None:
        """After ``opt.step()`` of update number ``updates``: re-mask, adapt when due."""
        self.apply()
        if self.due(updates):
            self.adapt(opt)

    def adapt(self, opt: torch.optim.Optimizer) -> dict[str, float]:
        """Drop eta of each layer's connections closest to zero (per sign), regrow as many at
        empty positions (not the just-dropped ones) with weight 0; returns the statistics."""
        totals = np.zeros(4)  # moved, |w| of dropped summed, grown last round, of those still active
        with torch.no_grad():
            for i in range(len(self.weights)):
                totals += self._adapt_layer(i, opt)
        self.adaptations += 1
        self.target_dirty = bool(self.targets)
        moved, abs_sum, prev, survived = totals.tolist()
        self.last = {"dropped": moved, "grown": moved,
                     "dropped_abs_w": abs_sum / moved if moved else 0.0}
        if prev:
            self.last["survival"] = survived / prev
        return dict(self.last)

    def _adapt_layer(self, i: int, opt: torch.optim.Optimizer) -> np.ndarray:
        weight, mask = self.weights[i], self.masks[i].view(-1)
        n = change_count(self.counts[i], mask.numel(), self.cfg.eta)
        if n <= 0:
            return np.zeros(4)
        flat = weight.detach().view(-1)
        empty = mask == 0
        drop = drop_indices(flat, mask, n)
        grow = self._grow(weight, empty, n)
        abs_sum = flat[drop].abs().sum()
        mask[drop], flat[drop] = 0.0, 0.0
        mask[grow], flat[grow] = 1.0, 0.0  # empty positions: their weight is already 0
        zero_optimizer_state(opt, weight, torch.cat([drop, grow]))
        prev = self.grown[i]
        stats = torch.stack([abs_sum, prev.sum().to(abs_sum), (prev & (mask > 0)).sum().to(abs_sum)])
        prev.zero_()[grow] = True
        return np.array([n, *stats.tolist()])

    def _grow(self, weight: torch.Tensor, empty: torch.Tensor, n: int) -> torch.Tensor:
        if self.cfg.growth == "random":
            return grow_random(empty, n, self.generator)
        if weight.grad is None:
            raise RuntimeError("gradient growth needs the weight's dense .grad: adapt right after backward")
        return grow_gradient(empty, weight.grad, n)

    def prune_target(self) -> None:
        """After a Polyak update: keep the k largest-magnitude target weights per layer,
        k = the online connection count; stops once the target lies inside the mask."""
        if not self.target_dirty:
            return
        self._prunes += 1
        with torch.no_grad():
            for target, k in zip(self.targets, self.counts):
                keep_largest(target, k)
            if self._prunes % ALIGN_CHECK_EVERY == 0:
                outside = [(t.ne(0) & (m == 0)).any() for t, m in zip(self.targets, self.masks)]
                self.target_dirty = bool(torch.stack(outside).any())

    def layer_stats(self, measure: bool = True) -> list[LayerStats]:
        """Per layer name, shape and non-zeros (``measure``: counted in the masks now)."""
        counts = [int(m.count_nonzero()) for m in self.masks] if measure else self.counts
        return [LayerStats(name, (w.shape[0], w.shape[1]), c)
                for name, w, c in zip(self.names, self.weights, counts)]

    def metrics(self) -> dict[str, float]:
        """Cheap (no device sync) metrics: sparsity, FLOPs ratio, the dense network's training
        FLOPs per critic update (to weigh the roles' ratios), last adaptation's stats."""
        r = self.role
        out = {f"sparsity/{r}": self.sparsity, f"flops_ratio/{r}": self.flops_ratio,
               f"dense_flops/{r}": self.dense_flops}
        if self.cfg.dynamic:
            out[f"topology/{r}/adaptations"] = float(self.adaptations)
            out.update({f"topology/{r}/{k}": v for k, v in self.last.items()})
        return out

    def state_dict(self) -> dict[str, Any]:
        """Masks, last regrown positions, RNG and counters (CPU copies, torch.save-able)."""
        return {"masks": {n: m.detach().to("cpu", torch.bool) for n, m in zip(self.names, self.masks)},
                "grown": {n: g.detach().to("cpu", copy=True) for n, g in zip(self.names, self.grown)},
                "generator": self.generator.get_state(), "adaptations": self.adaptations,
                "target_dirty": self.target_dirty, "last": dict(self.last)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (in place); weights are loaded by the part."""
        if sorted(d["masks"]) != sorted(self.names):
            raise ValueError(f"sparse masks {sorted(d['masks'])} do not match {sorted(self.names)}")
        for name, mask, grown in zip(self.names, self.masks, self.grown):
            mask.copy_(d["masks"][name])
            grown.copy_(d["grown"][name])
        self.counts = [int(m.count_nonzero()) for m in self.masks]
        self.generator.set_state(d["generator"])
        self.adaptations, self.target_dirty = int(d["adaptations"]), bool(d["target_dirty"])
        self.last = dict(d["last"])


def build_topology(module: nn.Module, cfg: SparseConfig | None, seed: int, role: str,
                   total_updates: int = 0, unit: int = 1) -> SparseTopology | None:
    """A topology masking ``module`` now, or ``None`` when ``cfg`` is dense or absent."""
    if cfg is None or not cfg.enabled:
        return None
    return SparseTopology(module, cfg, seed, role, total_updates, unit)
