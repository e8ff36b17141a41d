"""An actor ``nn.Module`` as its acting-policy description (proto/SPEC.md §4.4), for samplers.

The walk goes by module type: ``nn.Sequential`` in order, the plain layers in ``LAYERS``, and
any module with a ``policy_ops(path, walk)`` method (the actors, ``Residual``, ``ObsNorm`` of
common/networks.py) describes itself. Anything else is refused with the module's path and
type, so an actor that samplers could not act with fails in the learner, at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from spreeze.common.errors import PolicyExportError, PolicyFormatError
from spreeze.common.networks import PolicyOps, join
from spreeze.common.policy_program import FORMAT, parse
from spreeze.common.running_stats import OBS_NORM_CLIP, OBS_NORM_EPS, OBS_NORM_KEYS


def _linear(m: nn.Module, path: str) -> PolicyOps:
    op = {"op": "linear", "weight": join(path, "weight")}
    return [op | {"bias": join(path, "bias")} if getattr(m, "bias", None) is not None else op]


def _layer_norm(m: nn.Module, path: str) -> PolicyOps:
    assert isinstance(m, nn.LayerNorm)
    if len(m.normalized_shape) != 1:
        raise PolicyExportError(f"module {path!r} (LayerNorm): normalizes over {list(m.normalized_shape)}, "
                                "only the last dimension can be described")
    op: dict[str, Any] = {"op": "layer_norm", "eps": float(m.eps)}
    for name in ("weight", "bias"):
        if getattr(m, name, None) is not None:
            op[name] = join(path, name)
    return [op]


LAYERS: dict[type, Callable[[nn.Module, str], PolicyOps]] = {
    nn.Linear: _linear,
    nn.LayerNorm: _layer_norm,
    nn.ReLU: lambda m, p: [{"op": "relu"}],
    nn.Tanh: lambda m, p: [{"op": "tanh"}],
    nn.ELU: lambda m, p: [{"op": "elu", "alpha": float(m.alpha)}],  # type: ignore[arg-type]
    nn.SiLU: lambda m, p: [{"op": "silu"}],
    nn.Identity: lambda m, p: [],
}


def walk(module: nn.Module, path: str) -> PolicyOps:
    """The ops computing `module`'s forward, reading its parameters under `path`."""
    describe = getattr(module, "policy_ops", None)
    if callable(describe):
        ops: PolicyOps = describe(path, walk)
        return ops
    if type(module) is nn.Sequential:
        return [op for name, child in module.named_children() for op in walk(child, join(path, name))]
    layer = LAYERS.get(type(module))
    if layer is None:
        raise PolicyExportError(f"module {path or '<actor>'!r} of type {type(module).__name__} has no acting-policy "
                                f"op (known: Sequential, {', '.join(t.__name__ for t in LAYERS)}, or a "
                                "policy_ops method)")
    return layer(module, path)


def describe_actor(actor: nn.Module, exploration_noise: float = 0.0) -> dict[str, Any]:
    """The checked description of `actor`; a ``squash`` head explores with Gaussian noise of std
    `exploration_noise` half action ranges (the learner's config value)."""
    ops = walk(actor, "")
    if ops and ops[-1].get("op") == "squash":
        ops[-1] = ops[-1] | {"exploration_noise": float(exploration_noise)}
    elif exploration_noise:
        raise PolicyExportError(f"{type(actor).__name__}: exploration_noise={exploration_noise} needs a squash "
                                "head (a tanh_gaussian head explores by sampling)")
    try:
        return parse({"format": FORMAT, "ops": ops}).to_dict()
    except PolicyFormatError as exc:
        raise PolicyExportError(f"{type(actor).__name__} describes no valid acting policy: {exc}") from exc


def with_obs_norm(policy: dict[str, Any]) -> dict[str, Any]:
    """`policy` acting on observations normalised first (``learner.obs_norm``): an ``obs_norm``
    op over the weights ``obs_norm.mean`` and ``obs_norm.var`` that the learner sends with it
    (common/running_stats.py)."""
    first = {"op": "obs_norm", "mean": OBS_NORM_KEYS[0], "var": OBS_NORM_KEYS[1], "eps": OBS_NORM_EPS,
             "clip": OBS_NORM_CLIP}
    return parse({"format": policy["format"], "ops": [first, *policy["ops"]]}).to_dict()
