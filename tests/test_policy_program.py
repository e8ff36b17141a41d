"""Tests for common/policy_program.py and the interpreter's checks: a malformed description, or
weights that do not fit it, is refused with a typed error naming the op and field."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from spreeze.common.errors import PolicyError, PolicyFormatError, PolicyParamError, PolicyShapeError
from spreeze.common.numpy_policy import NumpyActor
from spreeze.common.policy_program import FORMAT, parse

LOW, HIGH = -np.ones(2, np.float32), np.ones(2, np.float32)


def desc(*ops: dict[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "ops": list(ops)}


LINEAR = {"op": "linear", "weight": "l.weight", "bias": "l.bias"}
SQUASH = {"op": "squash", "scale": "scale", "bias": "bias", "exploration_noise": 0.1}
STATE = {"l.weight": np.ones((2, 4), np.float32), "l.bias": np.zeros(2, np.float32),
         "scale": np.ones(2, np.float32), "bias": np.zeros(2, np.float32)}


def test_a_valid_description_round_trips() -> None:
    d = desc(LINEAR, {"op": "relu"}, SQUASH)
    program = parse(d)
    assert program.to_dict() == d and program.params == ["l.weight", "l.bias", "scale", "bias"]
    a = NumpyActor(d, STATE, LOW, HIGH)
    assert (a.obs_dim, a.act_dim, a.stochastic) == (4, 2, False)


@pytest.mark.parametrize("bad, match", [
    ([], "not a map"),
    ({}, "policy is missing"),
    ({"format": 2, "ops": [SQUASH]}, "format=2"),
    ({"format": FORMAT, "ops": []}, "non-empty list"),
    (desc({"op": "conv2d"}, SQUASH), r"policy op 0 \('conv2d'\): unknown op"),
    (desc({"op": "linear", "bias": "l.bias"}, SQUASH), r"op 0 \('linear'\): field 'weight' is missing"),
    (desc({**LINEAR, "weight": 3}, SQUASH), "field 'weight'=3 must be a non-empty string"),
    (desc({"op": "layer_norm", "eps": -1.0}, SQUASH), "field 'eps'=-1.0 is not a valid number"),
    (desc({"op": "obs_norm", "mean": "m", "var": "v", "eps": 1e-8, "clip": 0}, SQUASH), "'clip'=0"),
    (desc({"op": "elu", "alpha": True}, SQUASH), "'alpha'=True"),
    (desc({**SQUASH, "exploration_noise": float("nan")}), "'exploration_noise'=nan"),
    (desc({"op": "tanh_gaussian", "scale": "s", "bias": "b", "log_std_min": 2, "log_std_max": -5}),
     "log_std_min=2.0 must be < log_std_max=-5.0"),
    (desc({"op": "add", "slot": "r"}, SQUASH), "slot 'r' is added before it is saved"),
    (desc(LINEAR), r"op 0 \('linear'\): the last op must be an output head"),
    (desc(SQUASH, SQUASH), "an output head must be the last op"),
    (desc("relu", SQUASH), "policy op 0='relu' is not a map"),
])
def test_malformed_descriptions_are_refused_by_name(bad: Any, match: str) -> None:
    with pytest.raises(PolicyFormatError, match=match):
        parse(bad)
    with pytest.raises(PolicyError):  # and so is an actor built from one
        NumpyActor(bad, STATE, LOW, HIGH)


def test_a_missing_param_is_named() -> None:
    state = {k: v for k, v in STATE.items() if k != "l.bias"}
    with pytest.raises(PolicyParamError, match=r"op 0 \('linear'\): field 'bias' names 'l.bias'"):
        NumpyActor(desc(LINEAR, SQUASH), state, LOW, HIGH)


@pytest.mark.parametrize("ops, state, match", [
    ([LINEAR, SQUASH], {**STATE, "l.bias": np.zeros(3, np.float32)}, r"bias 'l.bias' has shape \[3\], expected \[2\]"),
    ([LINEAR, SQUASH], {**STATE, "l.weight": np.ones(4, np.float32)}, r"weight 'l.weight' has shape \[4\], expected 2"),
    ([LINEAR, LINEAR, SQUASH], STATE, r"op 1 \('linear'\): takes 4 features, gets 2"),
    ([LINEAR, {"op": "tanh_gaussian", "scale": "scale", "bias": "bias", "log_std_min": -5, "log_std_max": 2}],
     STATE, r"op 1 \('tanh_gaussian'\): takes 4 features, gets 2"),
    ([{"op": "save", "slot": "r"}, LINEAR, {"op": "add", "slot": "r"}, SQUASH], STATE,
     "slot 'r' holds 4 features, the current array 2"),
    ([LINEAR, {"op": "layer_norm", "weight": "l.weight", "eps": 1e-5}, SQUASH], STATE,
     r"op 1 \('layer_norm'\): weight 'l.weight' has shape \[2, 4\], expected 1 dims"),
])
def test_weights_that_do_not_fit_are_refused_by_op(ops: list[dict[str, Any]], state: dict[str, np.ndarray],
                                                   match: str) -> None:
    with pytest.raises(PolicyShapeError, match=match):
        NumpyActor(desc(*ops), state, LOW, HIGH)
