"""The kit's own reading of the acting policy (SPEC §4.4): a rich actor to publish and its
deterministic actions, computed here straight from the document (float64, op by op), apart
from any implementation under test."""

from __future__ import annotations

from typing import Any

import numpy as np

from spreeze.proto.messages import Weights

WIDTH = 8  # hidden features of the kit's rich actor


def rich_actor(version: int, obs_dim: int, act_dim: int, half_range: float) -> Weights:
    """An actor using observation normalisation, layer norm, a residual add and every
    activation, with no exploration noise: its actions are exactly :func:`deterministic`'s."""
    rng = np.random.default_rng(version)

    def t(*shape: int, scale: float = 0.6, shift: float = 0.0) -> np.ndarray:
        return (shift + scale * rng.standard_normal(shape)).astype(np.float32)

    dense = {"norm.mean": t(obs_dim), "norm.var": np.abs(t(obs_dim, shift=2.0)) + np.float32(0.1),
             "in.weight": t(WIDTH, obs_dim), "in.bias": t(WIDTH),
             "ln.weight": t(WIDTH, shift=1.0, scale=0.2), "ln.bias": t(WIDTH, scale=0.2),
             "block.weight": t(WIDTH, WIDTH, scale=0.3), "block.bias": t(WIDTH, scale=0.1),
             "out.weight": t(act_dim, WIDTH, scale=0.4),
             "scale": np.full(act_dim, half_range, np.float32), "bias": np.zeros(act_dim, np.float32)}
    ops = [{"op": "obs_norm", "mean": "norm.mean", "var": "norm.var", "eps": 1e-8, "clip": 5.0},
           {"op": "linear", "weight": "in.weight", "bias": "in.bias"},
           {"op": "layer_norm", "weight": "ln.weight", "bias": "ln.bias", "eps": 1e-5},
           {"op": "tanh"},
           {"op": "save", "slot": "skip"},
           {"op": "linear", "weight": "block.weight", "bias": "block.bias"},
           {"op": "elu", "alpha": 1.0},
           {"op": "add", "slot": "skip"},
           {"op": "silu"},
           {"op": "relu"},
           {"op": "linear", "weight": "out.weight"},  # no bias: it is optional
           {"op": "squash", "scale": "scale", "bias": "bias", "exploration_noise": 0.0}]
    return Weights("actor", version, version, dense=dense, extras={"env_steps": 0.0},
                   policy={"format": 1, "ops": ops})


def deterministic(policy: dict[str, Any], tensors: dict[str, np.ndarray], obs: np.ndarray,
                  low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The deterministic actions [E, a] of `policy` for observations [E, o], as §4.4 defines them."""
    w = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    x, slots = np.asarray(obs, np.float64), {}
    for op in policy["ops"]:
        kind = op["op"]
        if kind == "obs_norm":
            x = np.clip((x - w[op["mean"]]) / np.sqrt(w[op["var"]] + op["eps"]), -op["clip"], op["clip"])
        elif kind == "linear":
            x = x @ w[op["weight"]].T + (w[op["bias"]] if "bias" in op else 0.0)
        elif kind == "layer_norm":
            m = x.mean(-1, keepdims=True)
            x = (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + op["eps"])
            x = x * w[op["weight"]] if "weight" in op else x
            x = x + w[op["bias"]] if "bias" in op else x
        elif kind == "relu":
            x = np.maximum(x, 0.0)
        elif kind == "tanh":
            x = np.tanh(x)
        elif kind == "elu":
            x = np.where(x > 0, x, op["alpha"] * (np.exp(np.minimum(x, 0.0)) - 1.0))
        elif kind == "silu":
            x = x / (1.0 + np.exp(-x))
        elif kind == "save":
            slots[op["slot"]] = x
        elif kind == "add":
            x = x + slots[op["slot"]]
        else:
            a = len(w[op["scale"]])
            x = np.tanh(x[:, :a]) * w[op["scale"]] + w[op["bias"]]  # both heads' deterministic action
    return np.clip(x, low, high)
