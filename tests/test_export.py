"""Policy export: the description's deterministic action as TorchScript and ONNX files that run
without Spreeze, equal to the samplers' numpy actor."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spreeze.common.algorithms.build import make_parts
from spreeze.common.config import load_config
from spreeze.common.errors import ConfigError, PolicyError
from spreeze.common.numpy_policy import NumpyActor
from spreeze.common.policy_export import describe_actor
from spreeze.common.policy_torch import PolicyModule, export_policy
from spreeze.proto.conformance.policy import rich_actor

OBS, ACT = 6, 3
LOW, HIGH = np.array([-1.0, -2.0, 0.0], np.float32), np.array([1.0, 2.0, 0.5], np.float32)
HAS_ONNX = importlib.util.find_spec("onnx") is not None and importlib.util.find_spec("onnxruntime") is not None


def described(kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(description, weights): the kit's rich actor (obs-norm, layer norm, residual, elu, silu)
    or an algorithm's actor as its learner describes it."""
    if kind == "rich":
        msg = rich_actor(1, OBS, ACT, 1.0)
        return msg.policy, {k: np.asarray(v) for k, v in msg.dense.items()}
    cfg = load_config(None, [f"algo={kind}", f"{kind}.hidden=[16,16]"]).algo_config
    actor, _ = make_parts(kind, OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), True, 2)
    return describe_actor(actor.actor, 0.0 if kind == "sac" else 0.1), actor.actor_state()  # SAC explores by sampling


def observations(n: int = 9) -> np.ndarray:
    return (3.0 * np.random.default_rng(4).standard_normal((n, OBS))).astype(np.float32)


@pytest.mark.parametrize("kind", ["rich", "td3", "sac"])
def test_the_torch_module_acts_as_the_numpy_actor(kind: str) -> None:
    policy, state = described(kind)
    low, high = (-np.ones(ACT, np.float32), np.ones(ACT, np.float32)) if kind == "rich" else (LOW, HIGH)
    module = PolicyModule(policy, state, low, high)
    want = NumpyActor(policy, state, low, high).act(observations(), np.random.default_rng(0), explore=False)
    with torch.no_grad():
        got = module(torch.from_numpy(observations())).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["rich", "sac"])
def test_torchscript_file_runs_with_plain_torch_and_matches(kind: str, tmp_path: Path) -> None:
    policy, state = described(kind)
    low, high = (-np.ones(ACT, np.float32), np.ones(ACT, np.float32)) if kind == "rich" else (LOW, HIGH)
    path = export_policy(PolicyModule(policy, state, low, high), tmp_path / "policy.pt", "torchscript").path
    np.save(tmp_path / "obs.npy", observations(5))
    code = ("import sys, numpy as np, torch\n"
            f"m = torch.jit.load({str(path)!r})\n"
            f"a = m(torch.from_numpy(np.load({str(tmp_path / 'obs.npy')!r}))).detach().numpy()\n"
            f"np.save({str(tmp_path / 'act.npy')!r}, a)\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'spreeze']\n")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=120)  # no Spreeze on the path
    want = NumpyActor(policy, state, low, high).act(observations(5), np.random.default_rng(0), explore=False)
    np.testing.assert_allclose(np.load(tmp_path / "act.npy"), want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_ONNX, reason="onnx and onnxruntime are not installed (pip install onnx onnxruntime)")
@pytest.mark.parametrize("kind", ["rich", "td3"])
def test_onnx_file_runs_in_onnxruntime_and_matches(kind: str, tmp_path: Path) -> None:
    import onnxruntime

    policy, state = described(kind)
    low, high = (-np.ones(ACT, np.float32), np.ones(ACT, np.float32)) if kind == "rich" else (LOW, HIGH)
    path = export_policy(PolicyModule(policy, state, low, high), tmp_path / "policy.onnx", "onnx").path
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for n in (1, 7):  # any batch size
        got = session.run(["action"], {"obs": observations(n)})[0]
        want = NumpyActor(policy, state, low, high).act(observations(n), np.random.default_rng(0), explore=False)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bad_export_requests_are_refused_by_name(tmp_path: Path) -> None:
    policy, state = described("td3")
    with pytest.raises(ConfigError, match="format='keras' must be one of torchscript, onnx"):
        export_policy(PolicyModule(policy, state, LOW, HIGH), tmp_path / "x", "keras")
    with pytest.raises(PolicyError):
        PolicyModule(policy, {k: v for k, v in state.items() if not k.endswith("bias")}, LOW, HIGH)


def sparse_td3(zeros: float = 0.9) -> tuple[dict, dict[str, np.ndarray]]:
    """A TD3 actor (64-64) whose matrices are `zeros` zero, as a sparse run's masks leave them."""
    cfg = load_config(None, ["td3.hidden=[64,64]"]).algo_config
    actor, _ = make_parts("td3", OBS, ACT, LOW, HIGH, cfg, torch.device("cpu"), True, 3)
    state = {k: v.copy() for k, v in actor.actor_state().items()}
    rng = np.random.default_rng(1)
    for v in state.values():
        if v.ndim == 2:
            v[rng.random(v.shape) < zeros] = 0.0
    return describe_actor(actor.actor, 0.1), state


@pytest.mark.skipif(not HAS_ONNX, reason="onnx and onnxruntime are not installed (pip install onnx onnxruntime)")
def test_a_sparse_policy_is_stored_as_its_non_zeros_in_onnx_and_acts_the_same(tmp_path: Path) -> None:
    import onnxruntime

    from spreeze.common.policy_torch import timed

    policy, state = sparse_td3()
    module = PolicyModule(policy, state, LOW, HIGH)
    exported = export_policy(module, tmp_path / "sparse.onnx", "onnx")
    assert exported.sparse_matrices == 3 and 0.85 < exported.zeros < 0.95
    assert exported.bytes < 0.5 * exported.dense_bytes  # value + int64 index per non-zero, 10% of them
    session = onnxruntime.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    want = NumpyActor(policy, state, LOW, HIGH).act(observations(), np.random.default_rng(0), explore=False)
    np.testing.assert_allclose(session.run(["action"], {"obs": observations()})[0], want, rtol=1e-5, atol=1e-5)
    costs = timed(module, exported, "onnx")
    assert costs.seconds_per_action is not None and costs.dense_seconds_per_action is not None
    assert "90% of the weights are zero, 3 matrices stored as their non-zeros" in costs.describe()
    dense = export_policy(PolicyModule(*described("td3"), LOW, HIGH), tmp_path / "dense.onnx", "onnx")
    assert dense.sparse_matrices == 0 and dense.zeros == 0 and dense.bytes == dense.dense_bytes


def test_torchscript_stores_a_sparse_policy_dense(tmp_path: Path) -> None:
    policy, state = sparse_td3()
    exported = export_policy(PolicyModule(policy, state, LOW, HIGH), tmp_path / "sparse.pt", "torchscript")
    assert exported.sparse_matrices == 0 and exported.bytes == exported.dense_bytes and exported.zeros > 0.85
