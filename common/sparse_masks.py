"""Mask arithmetic of dynamic sparse training: layer densities, drop / grow selection.

Pure tensor functions on one weight matrix, used by :mod:`spreeze.common.sparse`. Flat indices are
C-order positions in the ``[n_out, n_in]`` weight (the order the wire format uses).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

Shape = tuple[int, int]
"""(n_out, n_in) of a Linear weight."""

ADAM_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def er_score(shape: Shape) -> float:
    """Erdős–Rényi density per unit lambda: (n_in + n_out) / (n_in * n_out).

    ERK (RigL) uses (sum of all kernel dims) / (product of them); an MLP layer has no
    kernel dims beyond (n_out, n_in), so for it ERK and ER are the same formula.
    """
    n_out, n_in = shape
    return (n_in + n_out) / (n_in * n_out)


def lambda_densities(shapes: Sequence[Shape], lambdas: Sequence[float]) -> list[float]:
    """Density of each layer from its lambda: min(1, lambda * er_score)."""
    if len(shapes) != len(lambdas):
        raise ValueError(f"{len(shapes)} sparse layers but {len(lambdas)} lambdas")
    return [min(1.0, lam * er_score(s)) for s, lam in zip(shapes, lambdas)]


def target_densities(shapes: Sequence[Shape], sparsity: float) -> list[float]:
    """Densities ``min(1, eps * er_score)`` with one scale ``eps`` giving the target sparsity.

    Layers that would exceed density 1 are made dense and ``eps`` is solved again over the
    rest (RigL's ERK procedure), so the overall sparsity is exact up to rounding.
    """
    if not 0.0 < sparsity < 1.0:
        raise ValueError(f"sparsity={sparsity!r} must be in (0, 1)")
    sizes = [o * i for o, i in shapes]
    budget = (1.0 - sparsity) * sum(sizes)
    dense: set[int] = set()
    while True:
        free = [j for j in range(len(shapes)) if j not in dense]
        left = budget - sum(sizes[j] for j in dense)
        eps = left / sum(er_score(shapes[j]) * sizes[j] for j in free) if free else 0.0
        over = {j for j in free if eps * er_score(shapes[j]) > 1.0}
        if not over:
            return [1.0 if j in dense else eps * er_score(s) for j, s in enumerate(shapes)]
        dense |= over


def connection_count(shape: Shape, density: float) -> int:
    """Connections of a layer at ``density``: rounded, at least 1, at most all."""
    size = shape[0] * shape[1]
    return min(size, max(1, math.floor(density * size + 0.5)))


def random_mask(shape: Shape, count: int, generator: torch.Generator) -> torch.Tensor:
    """A float 0/1 mask with exactly ``count`` ones at uniformly random positions (CPU)."""
    size = shape[0] * shape[1]
    mask = torch.zeros(size)
    mask[torch.randperm(size, generator=generator)[:count]] = 1.0
    return mask.view(shape)


def change_count(active: int, size: int, eta: float) -> int:
    """Connections to move in one adaptation: round(eta * active), bounded by the empty ones."""
    return min(math.floor(eta * active + 0.5), size - active)


def split_by_sign(n: int, n_pos: int, n_neg: int) -> tuple[int, int]:
    """(from non-negative, from negative) for dropping ``n``: half each, the odd one from the
    non-negative side, any shortfall of one sign taken from the other."""
    neg = n // 2
    pos = n - neg
    if pos > n_pos:
        pos, neg = n_pos, neg + pos - n_pos
    if neg > n_neg:
        pos, neg = pos + neg - n_neg, n_neg
    return pos, neg


def drop_indices(weight: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """Flat indices of the ``n`` active weights closest to zero, per sign.

    Half come from the smallest non-negative active weights (an active weight that is exactly
    0, e.g. a just regrown one never updated, counts as the smallest of them), half from the
    largest (closest to zero) negative ones; see :func:`split_by_sign`.
    """
    w, active = weight.detach().reshape(-1), mask.reshape(-1) > 0
    pos, neg = active & (w >= 0), active & (w < 0)
    n_pos, n_neg = split_by_sign(n, int(pos.sum()), int(neg.sum()))
    inf = torch.full_like(w, math.inf)
    from_pos = torch.where(pos, w, inf).topk(n_pos, largest=False).indices
    from_neg = torch.where(neg, -w, inf).topk(n_neg, largest=False).indices
    return torch.cat([from_pos, from_neg])


def grow_random(empty: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` flat indices drawn uniformly among the True positions of ``empty`` (SET)."""
    candidates = empty.reshape(-1).nonzero().squeeze(1)
    pick = torch.randperm(candidates.numel(), generator=generator)[:n]
    return candidates[pick.to(candidates.device)]


def grow_gradient(empty: torch.Tensor, grad: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` flat indices among ``empty`` with the largest |gradient| (RigL)."""
    scores = torch.where(empty.reshape(-1), grad.detach().reshape(-1).abs(), -math.inf)
    return scores.topk(n).indices


def zero_optimizer_state(opt: torch.optim.Optimizer, param: torch.Tensor,
                         idx: torch.Tensor) -> None:
    """Zero Adam's moment estimates of ``param`` at flat indices ``idx`` (no-op before step 1)."""
    state = opt.state.get(param, {})
    for key in ADAM_MOMENTS:
        if key in state:
            state[key].view(-1)[idx] = 0.0


def keep_largest(weight: torch.Tensor, k: int) -> None:
    """In place: zero all but the ``k`` largest-magnitude entries of ``weight``."""
    flat = weight.view(-1)
    if k >= flat.numel():
        return
    keep = torch.zeros_like(flat)
    keep[flat.abs().topk(k, sorted=False).indices] = 1.0
    flat.mul_(keep)
