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
from dataclasses import dataclass
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


SPARSE_MIN_ZEROS = 2 / 3  # a matrix is stored as its non-zeros (value + int64 index: 3x a dense entry) above this


@dataclass(frozen=True)
class Exported:
    """What `export_policy` wrote: the file, its size, the size of the same policy with every
    matrix stored dense, the share of the weight matrices' entries that are zero, and how many
    matrices the file stores as their non-zeros (ONNX sparse initializers)."""

    path: Path
    bytes: int
    dense_bytes: int
    zeros: float
    sparse_matrices: int
    seconds_per_action: float | None = None  # `timed`: one observation through the file, median
    dense_seconds_per_action: float | None = None  # the same through the policy stored dense

    def describe(self) -> str:
        """One line for the console: the size, and for a policy with zeros, against dense."""
        line = f"{self.path} ({self.bytes:,} bytes"
        if self.zeros > 0:
            line += (f"; {self.zeros:.0%} of the weights are zero, {self.sparse_matrices} matrices stored as "
                     f"their non-zeros: {self.bytes / self.dense_bytes:.2f}x the dense file's "
                     f"{self.dense_bytes:,} bytes")
        line += ")"
        if self.seconds_per_action is not None and self.dense_seconds_per_action is not None:
            line += (f"; one action (batch 1, this CPU): {self.seconds_per_action * 1e6:.1f} us, stored dense "
                     f"{self.dense_seconds_per_action * 1e6:.1f} us (runtimes compute dense: zeros cost as much)")
        return line


def zero_share(module: PolicyModule) -> float:
    """The share of zero entries over the policy's weight matrices (a sparse run's masked weights)."""
    matrices = [b for b in module.buffers() if b.dim() == 2]
    total = sum(m.numel() for m in matrices)
    return sum(int((m == 0).sum()) for m in matrices) / total if total else 0.0


def export_policy(module: PolicyModule, path: Path, fmt: str, sparse: bool = True) -> Exported:
    """Write `module` to `path` as TorchScript or ONNX (input ``obs`` [N, obs_dim] float32,
    output ``action`` [N, act_dim]). ONNX stores a matrix that is mostly zeros (a sparse run's)
    as its non-zeros unless ``sparse=False``; TorchScript stores every matrix dense."""
    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt!r} must be one of {', '.join(FORMATS)}")
    module.eval()
    example = torch.zeros(2, module.obs_dim)
    path.parent.mkdir(parents=True, exist_ok=True)
    zeros = zero_share(module)
    if fmt == "torchscript":
        with torch.no_grad():
            traced = torch.jit.trace(module, example)
        torch.jit.save(traced, str(path))
        size = path.stat().st_size
        return Exported(path, size, size, zeros, 0)
    try:
        import onnx
    except ImportError:
        raise ConfigError("format='onnx' needs the onnx package: pip install onnx (or spreeze[export])") from None
    import warnings
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript-based exporter: no onnxscript needed
        torch.onnx.export(module, (example,), str(path), input_names=["obs"], output_names=["action"],
                          dynamic_axes={"obs": {0: "n"}, "action": {0: "n"}}, dynamo=False)
    dense_bytes = path.stat().st_size
    model = onnx.load(str(path))
    converted = store_non_zeros(model) if sparse else 0
    if converted:
        onnx.checker.check_model(model)
        onnx.save(model, str(path))
    return Exported(path, path.stat().st_size, dense_bytes, zeros, converted)


def store_non_zeros(model: Any) -> int:
    """Move each ONNX initializer matrix with more than SPARSE_MIN_ZEROS zeros to the graph's
    sparse initializers (its non-zero values and their flat int64 indices, the ONNX
    SparseTensorProto); the number moved. Runtimes make them dense when they load the model."""
    from onnx import helper, numpy_helper

    graph, dense, moved = model.graph, [], 0
    for init in graph.initializer:
        array = numpy_helper.to_array(init)
        flat = np.flatnonzero(array)
        if array.ndim == 2 and array.size and 1 - flat.size / array.size > SPARSE_MIN_ZEROS:
            values = numpy_helper.from_array(array.reshape(-1)[flat], init.name)
            indices = numpy_helper.from_array(flat.astype(np.int64), init.name + "_indices")
            graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, list(array.shape)))
            moved += 1
        else:
            dense.append(init)
    if moved:
        del graph.initializer[:]
        graph.initializer.extend(dense)
    return moved


def seconds_per_action(path: Path, fmt: str, obs_dim: int, calls: int = 300) -> float | None:
    """Median seconds of one single-observation call of an exported file, in the runtime a user
    runs it with (plain torch, onnxruntime); None where onnxruntime is not installed."""
    import time

    obs = np.zeros((1, obs_dim), np.float32)
    if fmt == "torchscript":
        loaded = torch.jit.load(str(path))
        tensor = torch.from_numpy(obs)

        def call() -> object:
            with torch.no_grad():
                return loaded(tensor)
    else:
        try:
            import onnxruntime
        except ImportError:
            return None
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

        def call() -> object:
            return session.run(["action"], {"obs": obs})
    for _ in range(20):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def timed(module: PolicyModule, exported: Exported, fmt: str) -> Exported:
    """`exported` with its cost per action, and that of the same policy written dense beside it."""
    import dataclasses
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        dense = export_policy(module, Path(tmp) / f"dense.{fmt}", fmt, sparse=False)
        dense_time = seconds_per_action(dense.path, fmt, module.obs_dim)
    return dataclasses.replace(exported, seconds_per_action=seconds_per_action(exported.path, fmt, module.obs_dim),
                               dense_seconds_per_action=dense_time)
