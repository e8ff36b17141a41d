"""Accounting of sparse networks: per-layer sparsity and training FLOPs relative to dense.

FLOPs follow RigL's counting (Evci et al. 2020, appendix H): one multiply-add per weight
and sample, biases and activations ignored. A sparse layer's forward costs its non-zeros,
a dense layer (outputs) its full size; the backward pass costs 2x the forward. RigL growth
also needs the dense weight gradient once per adaptation: that step's backward costs
``f_S + f_D`` instead of ``2 f_S``, so on average ``(f_D - f_S) / every`` more per step.
SET and static masks add nothing. These are the FLOPs a truly sparse implementation would
spend; this dense-with-masks simulation spends dense FLOPs. Pure arithmetic, without torch (the
supervisor reads it); counting a module's layers is common.sparse.forward_flops.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerStats:
    """One sparse layer: its state_dict weight name, shape and connection count."""

    name: str
    shape: tuple[int, int]
    nnz: int

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def density(self) -> float:
        return self.nnz / self.size

    @property
    def sparsity(self) -> float:
        return 1.0 - self.density


def overall_sparsity(layers: Iterable[LayerStats]) -> float:
    """Fraction of zero weights over all given layers together."""
    rows = list(layers)
    return 1.0 - sum(r.nnz for r in rows) / sum(r.size for r in rows)


def training_flops_ratio(dense: int, sparse: int, rigl_every: int | None = None) -> float:
    """Training FLOPs per step of the sparse network over the dense one.

    ``rigl_every``: adaptation period when growth uses dense gradients, else ``None``.
    """
    extra = (dense - sparse) / rigl_every if rigl_every else 0.0
    return (3.0 * sparse + extra) / (3.0 * dense)


def dense_training_flops(dense_forward: int, unit: int = 1) -> float:
    """Dense training multiply-adds per sample and *critic* update of a network whose forward
    costs ``dense_forward`` and which trains once per ``unit`` critic updates (TD3 actor:
    policy_delay); the weight of its FLOPs ratio in :func:`combined_flops_ratio`."""
    return 3.0 * dense_forward / unit


def combined_flops_ratio(values: Mapping[str, float],
                         roles: Iterable[str] = ("actor", "critic")) -> float | None:
    """Training FLOPs of actor and critics together relative to dense, from learner metrics:
    the roles' ``flops_ratio/<role>`` weighted by their ``dense_flops/<role>`` (dense training
    FLOPs per critic update). Forward passes of one network inside another's update (target
    networks, the critics in the actor loss) are not counted. ``None`` when no role reports
    both keys; a role that does not is left out."""
    pairs = [(float(values[f"flops_ratio/{r}"]), float(values[f"dense_flops/{r}"])) for r in roles
             if f"flops_ratio/{r}" in values and f"dense_flops/{r}" in values]
    total = sum(w for _, w in pairs)
    return sum(r * w for r, w in pairs) / total if total > 0 else None
