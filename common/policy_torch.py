"""The acting policy of a description (proto/SPEC.md §4.4) as a torch module, for export.

`PolicyModule(policy, state, low, high)` computes what the samplers' numpy actor computes
deterministically (common/numpy_policy.py `NumpyActor.act(..., explore=False)`): observations
[N, obs_dim] float32 in, actions [N, act_dim] within the bounds out, with observation
normalisation inside when the description has it. `export_policy` writes it as TorchScript
(runs with plain torch) or ONNX (runs with onnxruntime; needs the `onnx` package), so a
trained policy leaves the library for deployment without Spreeze.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from spreeze.common.errors import ConfigError
from spreeze.common.numpy_policy import NumpyActor

FORMATS = ("torchscript", "onnx")


def _buffer_name(param: str) -> str:
    return "p_" + param.replace(".", "__")


class PolicyModule(nn.Module):
    """The description's deterministic action as a torch module (its parameters as buffers)."""

    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, policy: Mapping[str, Any], state: Mapping[str, np.ndarray], low: np.ndarray,
                 high: np.ndarray) -> None:
        super().__init__()
        checked = NumpyActor(policy, state, low, high)  # the same checks as a sampler's (typed errors)
        self.program = checked.program
        self.obs_dim, self.act_dim = checked.obs_dim, checked.act_dim
        for name in self.program.params:
            self.register_buffer(_buffer_name(name), torch.as_tensor(np.array(state[name], np.float32)))
        width, self.widths = self.obs_dim, []  # each body op's input width (layer norm's shape: a constant)
        for op in self.program.body:
            self.widths.append(width)
            if op["op"] == "linear":
                width = int(np.shape(state[op["weight"]])[0])
        self.register_buffer("low", torch.as_tensor(np.asarray(low, np.float32)))
        self.register_buffer("high", torch.as_tensor(np.asarray(high, np.float32)))

    def _p(self, op: Mapping[str, Any], field: str) -> torch.Tensor | None:
        name = op.get(field)
        return None if name is None else getattr(self, _buffer_name(name))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # a fixed op list: traced straight through
        x, slots = obs, {}
        for op, width in zip(self.program.body, self.widths):
            kind = op["op"]
            if kind == "obs_norm":
                mean, var = self._p(op, "mean"), self._p(op, "var")
                assert mean is not None and var is not None
                x = torch.clamp((x - mean) / torch.sqrt(var + op["eps"]), -op["clip"], op["clip"])
            elif kind == "linear":
                weight = self._p(op, "weight")
                assert weight is not None
                x = nn.functional.linear(x, weight, self._p(op, "bias"))
            elif kind == "layer_norm":
                x = nn.functional.layer_norm(x, (width,), self._p(op, "weight"), self._p(op, "bias"), op["eps"])
            elif kind == "relu":
                x = torch.relu(x)
            elif kind == "tanh":
                x = torch.tanh(x)
            elif kind == "elu":
                x = nn.functional.elu(x, op["alpha"])
            elif kind == "silu":
                x = nn.functional.silu(x)
            elif kind == "save":
                slots[op["slot"]] = x
            elif kind == "add":
                x = x + slots[op["slot"]]
        head = self.program.head
        scale, bias = self._p(head, "scale"), self._p(head, "bias")
        assert scale is not None and bias is not None
        action = torch.tanh(x[:, : self.act_dim]) * scale + bias  # both heads: tanh of the (mean) input
        return torch.minimum(torch.maximum(action, self.low), self.high)


def export_policy(module: PolicyModule, path: Path, fmt: str) -> Path:
    """Write `module` to `path` as TorchScript or ONNX (input ``obs`` [N, obs_dim] float32,
    output ``action`` [N, act_dim]); the path written."""
    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt!r} must be one of {', '.join(FORMATS)}")
    module.eval()
    example = torch.zeros(2, module.obs_dim)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "torchscript":
        with torch.no_grad():
            traced = torch.jit.trace(module, example)
        torch.jit.save(traced, str(path))
        return path
    try:
        import onnx  # noqa: F401  (torch's exporter needs it)
    except ImportError:
        raise ConfigError("format='onnx' needs the onnx package: pip install onnx (or spreeze[export])") from None
    import warnings
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript-based exporter: no onnxscript needed
        torch.onnx.export(module, (example,), str(path), input_names=["obs"], output_names=["action"],
                          dynamic_axes={"obs": {0: "n"}, "action": {0: "n"}}, dynamo=False)
    return path
