"""Tests for common/policy_export.py: actors become descriptions by module type; anything else
is refused naming the module's path and type."""

from __future__ import annotations

import numpy as np
import pytest
from torch import nn

from spreeze.common.errors import PolicyExportError
from spreeze.common.networks import DeterministicActor, GaussianActor, Residual
from spreeze.common.policy_export import describe_actor
from spreeze.common.policy_program import parse

LOW, HIGH = -np.ones(2, np.float32), np.ones(2, np.float32)


def test_td3_and_sac_actors_are_described_by_their_state_names() -> None:
    td3 = describe_actor(DeterministicActor(5, 2, (8, 8), LOW, HIGH), 0.3)
    assert [op["op"] for op in td3["ops"]] == ["linear", "relu", "linear", "relu", "linear", "squash"]
    assert td3["ops"][4] == {"op": "linear", "weight": "net.4.weight", "bias": "net.4.bias"}
    assert td3["ops"][-1]["exploration_noise"] == 0.3
    sac = describe_actor(GaussianActor(5, 2, (8,), LOW, HIGH, -4.0, 1.0))
    assert sac["ops"][-2:] == [{"op": "linear", "weight": "head.weight", "bias": "head.bias"},
                               {"op": "tanh_gaussian", "scale": "scale", "bias": "bias",
                                "log_std_min": -4.0, "log_std_max": 1.0}]
    assert parse(sac).to_dict() == sac
    state = GaussianActor(5, 2, (8,), LOW, HIGH).state_dict()
    assert set(parse(sac).params) <= set(state)


def test_residual_slots_are_named_by_path() -> None:
    net = nn.Sequential(nn.Linear(2, 4), Residual(nn.Sequential(nn.Linear(4, 4), nn.ReLU())))
    ops = describe_actor(nn.Sequential(net, DeterministicActor(4, 2, (4,), LOW, HIGH)))["ops"]
    assert ops[1:5] == [{"op": "save", "slot": "0.1"}, {"op": "linear", "weight": "0.1.block.0.weight",
                                                         "bias": "0.1.block.0.bias"},
                        {"op": "relu"}, {"op": "add", "slot": "0.1"}]


def test_unsupported_modules_are_named_with_path_and_type() -> None:
    actor = DeterministicActor(5, 2, (8,), LOW, HIGH)
    actor.net[1] = nn.GELU()
    with pytest.raises(PolicyExportError, match=r"module 'net.1' of type GELU"):
        describe_actor(actor)
    with pytest.raises(PolicyExportError, match="LayerNorm"):
        describe_actor(nn.Sequential(nn.LayerNorm((2, 3)), DeterministicActor(3, 2, (4,), LOW, HIGH)))
    with pytest.raises(PolicyExportError, match="describes no valid acting policy"):
        describe_actor(nn.Sequential(nn.Linear(3, 2)))  # no output head
    with pytest.raises(PolicyExportError, match="needs a squash head"):
        describe_actor(GaussianActor(5, 2, (8,), LOW, HIGH), 0.1)
