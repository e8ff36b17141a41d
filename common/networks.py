"""Torch modules of the algorithms: MLP trunks, actors, twin critics and the layers they use.

Every hidden layer is a plain ``nn.Linear`` built by :func:`mlp`, so a sparse mode can find
and mask them. Action bounds live in registered buffers (``scale``, ``bias``) so they move
with ``.to(device)`` and travel inside ``state_dict()`` to samplers. The actors, and the
blocks plain torch has no module for (:class:`Residual`, :class:`ObsNorm`), describe their
acting policy with ``policy_ops`` (common/policy_export.py walks the rest by module type).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
LOG_2 = math.log(2.0)

PolicyOps = list[dict[str, Any]]  # ops of an acting-policy description (proto/SPEC.md §4.4)
Walk = Callable[[nn.Module, str], PolicyOps]  # describes a submodule at a state_dict path


def join(path: str, name: str) -> str:
    """The state_dict name of `name` inside the module at `path`."""
    return f"{path}.{name}" if path else name


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int | None) -> nn.Sequential:
    """Linear+ReLU per hidden size, then a final Linear to ``out_dim`` (none if ``None``).

    Layer ``i`` of the result is an ``nn.Linear`` at even indices (0, 2, 4, ...).
    """
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU(inplace=True)]
        d = h
    if out_dim is not None:
        layers.append(nn.Linear(d, out_dim))
    return nn.Sequential(*layers)


def _bounds(low: np.ndarray, high: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, bias) float32 tensors mapping [-1, 1] onto [low, high]."""
    lo = np.asarray(low, dtype=np.float32)
    hi = np.asarray(high, dtype=np.float32)
    if lo.shape != hi.shape or lo.ndim != 1:
        raise ValueError(f"action bounds must be 1-D and equal shape, got {lo.shape} {hi.shape}")
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(hi > lo)):
        raise ValueError(f"action bounds must be finite with high > low, got {lo} {hi}")
    return torch.from_numpy((hi - lo) / 2.0), torch.from_numpy((hi + lo) / 2.0)


class DeterministicActor(nn.Module):
    """TD3 actor: ``tanh(mlp(obs)) * scale + bias``."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int],
                 low: np.ndarray, high: np.ndarray) -> None:
        super().__init__()
        self.net = mlp(obs_dim, hidden, act_dim)
        scale, bias = _bounds(low, high)
        if scale.shape != (act_dim,):
            raise ValueError(f"action bounds shape {tuple(scale.shape)} != ({act_dim},)")
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.bias, torch.tanh(self.net(obs)), self.scale)

    def policy_ops(self, path: str, walk: Walk) -> PolicyOps:
        """The MLP, then ``tanh(x) * scale + bias`` (the exporter sets the exploration noise)."""
        return [*walk(self.net, join(path, "net")),
                {"op": "squash", "scale": join(path, "scale"), "bias": join(path, "bias"), "exploration_noise": 0.0}]


class GaussianActor(nn.Module):
    """SAC actor: tanh-squashed Gaussian rescaled to the action bounds.

    ``log_std`` is squashed smoothly into ``[log_std_min, log_std_max]`` with a tanh (as in
    CleanRL / pytorch_sac) instead of a hard clamp that would kill its gradient.
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], low: np.ndarray,
                 high: np.ndarray, log_std_min: float = -5.0, log_std_max: float = 2.0) -> None:
        super().__init__()
        if not log_std_min < log_std_max:
            raise ValueError(f"log_std_min={log_std_min} must be < log_std_max={log_std_max}")
        self.trunk = mlp(obs_dim, hidden, None)
        self.head = nn.Linear(hidden[-1] if hidden else obs_dim, 2 * act_dim)
        scale, bias = _bounds(low, high)
        if scale.shape != (act_dim,):
            raise ValueError(f"action bounds shape {tuple(scale.shape)} != ({act_dim},)")
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        self.register_buffer("log_std_bounds", torch.tensor([log_std_min, log_std_max]))
        self.register_buffer("log_scale_sum", scale.log().sum(), persistent=False)
        self._lo, self._half_range = log_std_min, 0.5 * (log_std_max - log_std_min)

    def policy_ops(self, path: str, walk: Walk) -> PolicyOps:
        """Trunk and head, then the tanh-Gaussian over [mean | log-std pre-activation]."""
        lo, hi = (float(v) for v in self.log_std_bounds.tolist())
        return [*walk(self.trunk, join(path, "trunk")), *walk(self.head, join(path, "head")),
                {"op": "tanh_gaussian", "scale": join(path, "scale"), "bias": join(path, "bias"),
                 "log_std_min": lo, "log_std_max": hi}]

    def dist_params(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-squash Gaussian (mean, log_std), each [B, act_dim]."""
        mean, raw = self.head(self.trunk(obs)).chunk(2, dim=-1)
        return mean, self._lo + self._half_range * (torch.tanh(raw) + 1.0)

    def forward(self, obs: torch.Tensor, deterministic: bool = False,
                generator: torch.Generator | None = None,
                eps: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(action [B, act_dim], log_prob [B]); deterministic uses the mean (log_prob at eps=0).

        ``eps``: the standard normal draw [B, act_dim] to use (a compiled step draws it
        outside the graph from the part's generator); ``None`` draws it from ``generator``.
        """
        mean, log_std = self.dist_params(obs)
        if deterministic:
            u = mean
            gauss = -log_std - HALF_LOG_2PI
        else:
            if eps is None:
                eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            u = torch.addcmul(mean, eps, log_std.exp())
            gauss = -0.5 * eps.square() - log_std - HALF_LOG_2PI
        # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), stable for large |u|.
        log_det = 2.0 * (LOG_2 - u - F.softplus(-2.0 * u))
        log_prob = (gauss - log_det).sum(-1) - self.log_scale_sum
        return torch.addcmul(self.bias, torch.tanh(u), self.scale), log_prob


class Residual(nn.Module):
    """``x + block(x)`` (the block keeps the width)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)

    def policy_ops(self, path: str, walk: Walk) -> PolicyOps:
        slot = path or "residual"
        return [{"op": "save", "slot": slot}, *walk(self.block, join(path, "block")), {"op": "add", "slot": slot}]


class ObsNorm(nn.Module):
    """``clip((x - mean) / sqrt(var + eps), -clip, clip)`` with ``mean``, ``var`` buffers [dim]
    (whoever trains with it keeps them up to date; they travel in ``state_dict()``)."""

    def __init__(self, dim: int, eps: float = 1e-8, clip: float = 10.0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.eps, self.clip = eps, clip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)

    def policy_ops(self, path: str, walk: Walk) -> PolicyOps:
        return [{"op": "obs_norm", "mean": join(path, "mean"), "var": join(path, "var"),
                 "eps": self.eps, "clip": self.clip}]


class TwinCritic(nn.Module):
    """Two independent Q MLPs on ``concat(obs, action)``; each returns [B]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.qf1 = mlp(obs_dim + act_dim, hidden, 1)
        self.qf2 = mlp(obs_dim + act_dim, hidden, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, action], dim=-1)
        return self.qf1(x).squeeze(-1), self.qf2(x).squeeze(-1)

    def q1(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """First critic only (TD3's policy gradient uses Q1)."""
        return self.qf1(torch.cat([obs, action], dim=-1)).squeeze(-1)


def twin_q(params: Sequence[torch.Tensor], obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Both critics of a :class:`TwinCritic` as one batched network: [2, B] (Q1, Q2).

    ``params``: the TwinCritic's parameters in ``parameters()`` order (qf1's weight, bias per
    layer, then qf2's). Each layer's two weight matrices are stacked and applied with one
    batched matmul, so the twins cost one kernel per layer instead of two; the first layer
    shares its input, so it is one matmul of the concatenated weights.
    """
    half = len(params) // 2
    x = torch.cat([obs, action], dim=-1)
    w0 = torch.cat([params[0], params[half]])  # [2 * h0, in]
    b0 = torch.cat([params[1], params[half + 1]])
    h = torch.relu(torch.addmm(b0, x, w0.t())).view(x.shape[0], 2, -1).transpose(0, 1)
    layers = half // 2
    for i in range(1, layers):
        w = torch.stack([params[2 * i], params[half + 2 * i]])  # [2, out, in]
        b = torch.stack([params[2 * i + 1], params[half + 2 * i + 1]]).unsqueeze(1)
        h = torch.baddbmm(b, h, w.transpose(1, 2))
        if i < layers - 1:
            h = torch.relu(h)
    return h.squeeze(-1)


def q1_only(params: Sequence[torch.Tensor], obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """The first critic of a :class:`TwinCritic` from its ``parameters()`` list: [B]."""
    h = torch.cat([obs, action], dim=-1)
    layers = len(params) // 4
    for i in range(layers):
        h = torch.nn.functional.linear(h, params[2 * i], params[2 * i + 1])
        if i < layers - 1:
            h = torch.relu(h)
    return h.squeeze(-1)


RENORM_EPS = 1e-3  # added to the variances before the square root (as the CrossQ authors' renorm layer)


class BatchRenorm(nn.Module):
    """Batch renormalisation (Ioffe 2017) of [B, dim] inputs, then a learned scale and shift.

    Train mode: ``(x - mean_B) / std_B * r + d`` with ``r = std_B / std_run`` clipped to
    [1/r_max, r_max] and ``d = (mean_B - mean_run) / std_run`` clipped to [-d_max, d_max]
    (both without gradient); plain batch norm (r = 1, d = 0) for the first ``warmup`` steps;
    the running statistics move toward the batch's by ``momentum``. Eval mode: the running
    statistics. Every buffer is float32 (they travel with the network's weights).
    """

    running_mean: torch.Tensor
    running_var: torch.Tensor
    steps: torch.Tensor

    def __init__(self, dim: int, momentum: float = 0.01, warmup: int = 100_000, r_max: float = 3.0,
                 d_max: float = 5.0) -> None:
        super().__init__()
        self.momentum, self.warmup, self.r_max, self.d_max = momentum, warmup, r_max, d_max
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("steps", torch.zeros(1))  # 1-D: states travel as arrays of at least one dimension

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, mean, var = batch_renorm(x, self.weight, self.bias, self.running_mean, self.running_var, self.steps,
                                    self, self.training)
        if mean is not None and var is not None:
            with torch.no_grad():
                self.running_mean.lerp_(mean, self.momentum)
                self.running_var.lerp_(var, self.momentum)
                self.steps.add_(1.0)
        return y


def batch_renorm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, running_mean: torch.Tensor,
                 running_var: torch.Tensor, steps: torch.Tensor, spec: BatchRenorm,
                 training: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:class:`BatchRenorm`'s formula, without side effects: (output, batch mean, batch variance)
    of ``x`` [..., B, dim] over its rows; the statistics are ``None`` in eval mode and carry no
    gradient. Leading dimensions stack independent layers (the twin critics: [2, B, dim], with
    parameters and buffers [2, dim] and steps [2, 1]); the caller moves the running statistics
    toward the returned ones by ``spec.momentum`` and counts the step.
    """
    if not training:
        scale = torch.rsqrt(running_var + RENORM_EPS) * weight
        return (x - running_mean.unsqueeze(-2)) * scale.unsqueeze(-2) + bias.unsqueeze(-2), None, None
    mean, var = x.mean(-2), x.var(-2, unbiased=False)
    std = (var + RENORM_EPS).sqrt()
    with torch.no_grad():
        run_std = (running_var + RENORM_EPS).sqrt()
        on = (steps >= spec.warmup).to(x.dtype)  # 0 during the warm-up: plain batch norm
        r = 1.0 + on * ((std / run_std).clamp(1.0 / spec.r_max, spec.r_max) - 1.0)
        d = on * ((mean - running_mean) / run_std).clamp(-spec.d_max, spec.d_max)
    y = ((x - mean.unsqueeze(-2)) / std.unsqueeze(-2) * r.unsqueeze(-2) + d.unsqueeze(-2)) * weight.unsqueeze(-2)
    return y + bias.unsqueeze(-2), mean.detach(), var.detach()


def renorm_mlp(in_dim: int, hidden: Sequence[int], renorm: Callable[[int], nn.Module]) -> nn.Sequential:
    """renorm(input), then per hidden size Linear -> renorm -> ReLU, then a Linear to one value
    (CrossQ's critic; ``renorm(dim)`` makes a normalisation layer)."""
    layers: list[nn.Module] = [renorm(in_dim)]
    for width in hidden:
        layers += [nn.Linear(in_dim, width), renorm(width), nn.ReLU()]
        in_dim = width
    return nn.Sequential(*layers, nn.Linear(in_dim, 1))


class RenormTwinCritic(nn.Module):
    """Two `renorm_mlp` critics of ``concat(obs, action)``; forward gives Q1, Q2 stacked: [2, B]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int],
                 renorm: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.qf1 = renorm_mlp(obs_dim + act_dim, hidden, renorm)
        self.qf2 = renorm_mlp(obs_dim + act_dim, hidden, renorm)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], dim=-1)
        return torch.stack([self.qf1(x).squeeze(-1), self.qf2(x).squeeze(-1)])


RenormStats = list[tuple[torch.Tensor, torch.Tensor]]  # per renorm layer: the twins' batch (mean, var) [2, dim]


def renorm_twin_q(params: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor], obs: torch.Tensor,
                  action: torch.Tensor, spec: BatchRenorm, training: bool) -> tuple[torch.Tensor, RenormStats]:
    """Both critics of a :class:`RenormTwinCritic` as one batched network, without side
    effects: (Q1, Q2 [2, B], the batch statistics of each renorm layer for
    :func:`move_renorm_stats`; empty in eval mode).

    ``params`` / ``buffers``: the critic's ``parameters()`` / ``buffers()`` in order (qf1's,
    then qf2's); ``spec``: one of its renorm layers (they share their settings). Each layer's
    two weight matrices are stacked and applied with one batched matmul, as :func:`twin_q`.
    """
    half, bhalf = len(params) // 2, len(buffers) // 2
    stats: RenormStats = []

    def pair(seq: Sequence[torch.Tensor], i: int, at: int) -> torch.Tensor:
        return torch.stack([seq[i], seq[at + i]])

    def norm(h: torch.Tensor, layer: int, p: int) -> torch.Tensor:
        b = 3 * layer  # running_mean, running_var, steps per renorm layer
        y, mean, var = batch_renorm(h, pair(params, p, half), pair(params, p + 1, half), pair(buffers, b, bhalf),
                                    pair(buffers, b + 1, bhalf), pair(buffers, b + 2, bhalf), spec, training)
        if mean is not None and var is not None:
            stats.append((mean, var))
        return y

    x = torch.cat([obs, action], dim=-1)
    h = norm(x.unsqueeze(0).expand(2, *x.shape), 0, 0)
    for i in range((half - 4) // 4):  # per hidden layer: Linear (weight, bias), renorm (weight, bias)
        p = 2 + 4 * i
        h = torch.baddbmm(pair(params, p + 1, half).unsqueeze(1), h, pair(params, p, half).transpose(1, 2))
        h = torch.relu(norm(h, i + 1, p + 2))
    h = torch.baddbmm(pair(params, half - 1, half).unsqueeze(1), h, pair(params, half - 2, half).transpose(1, 2))
    return h.squeeze(-1), stats


def move_renorm_stats(buffers: Sequence[torch.Tensor], stats: RenormStats, momentum: float) -> None:
    """After a train-mode :func:`renorm_twin_q`: each renorm layer's running statistics move
    toward the batch's by ``momentum`` and its step count grows by one, as the module's
    forward does; in place."""
    bhalf = len(buffers) // 2
    with torch.no_grad():
        for layer, (mean, var) in enumerate(stats):
            for twin in (0, 1):
                b = twin * bhalf + 3 * layer
                buffers[b].lerp_(mean[twin], momentum)
                buffers[b + 1].lerp_(var[twin], momentum)
                buffers[b + 2].add_(1.0)
