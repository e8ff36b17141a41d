"""Tests for common/numpy_policy.py: agreement with the torch actors, noise, in-place load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spreeze.common.algorithms.base import module_state
from spreeze.common.networks import DeterministicActor, GaussianActor
from spreeze.common.numpy_policy import NumpyActor

torch.set_num_threads(1)
LOW = np.array([-1.0, -2.0, 0.0], dtype=np.float32)
HIGH = np.array([1.0, 3.0, 0.5], dtype=np.float32)
OBS = 6


def torch_actor(algo: str, hidden: tuple[int, ...] = (32, 16), seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    if algo == "td3":
        return DeterministicActor(OBS, 3, hidden, LOW, HIGH)
    return GaussianActor(OBS, 3, hidden, LOW, HIGH, -5.0, 2.0)


def torch_mean_action(actor: torch.nn.Module, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        x = torch.from_numpy(obs)
        out = actor(x) if isinstance(actor, DeterministicActor) else actor(x, True)[0]
    return out.numpy()


@pytest.mark.parametrize("algo", ["td3", "sac"])
@pytest.mark.parametrize("hidden", [(32, 16), (64,), (8, 8, 8)])
@pytest.mark.parametrize("envs", [1, 7, 64])
def test_deterministic_matches_torch(algo: str, hidden: tuple[int, ...], envs: int) -> None:
    actor = torch_actor(algo, hidden)
    np_actor = NumpyActor(module_state(actor), algo, LOW, HIGH)
    obs = np.random.default_rng(envs).standard_normal((envs, OBS)).astype(np.float32)
    a = np_actor.act(obs, np.random.default_rng(0), explore=False)
    assert a.shape == (envs, 3) and a.dtype == np.float32
    np.testing.assert_allclose(a, torch_mean_action(actor, obs), atol=1e-5, rtol=0)


def test_td3_exploration_noise_scale_and_clip() -> None:
    np_actor = NumpyActor(module_state(torch_actor("td3")), "td3", LOW, HIGH, 0.1)
    obs = np.zeros((20000, OBS), np.float32)
    det = np_actor.act(obs, np.random.default_rng(0), explore=False)
    a = np_actor.act(obs, np.random.default_rng(1), explore=True)
    assert np.all(a >= LOW) and np.all(a <= HIGH)
    inside = (a > LOW) & (a < HIGH)
    expected_std = 0.1 * (HIGH - LOW) / 2
    noise_std = np.array([(a - det)[inside[:, j], j].std() for j in range(3)])
    np.testing.assert_allclose(noise_std, expected_std, rtol=0.1)
    big = NumpyActor(module_state(torch_actor("td3")), "td3", LOW, HIGH, 10.0)
    b = big.act(obs[:2000], np.random.default_rng(2), explore=True)
    assert np.all(b >= LOW) and np.all(b <= HIGH) and np.any(b == HIGH) and np.any(b == LOW)


def test_sac_sampling_matches_torch_distribution() -> None:
    actor = torch_actor("sac")
    np_actor = NumpyActor(module_state(actor), "sac", LOW, HIGH)
    obs = np.tile(np.random.default_rng(0).standard_normal((1, OBS)).astype(np.float32),
                  (20000, 1))
    a = np_actor.act(obs, np.random.default_rng(1), explore=True)
    with torch.no_grad():
        ref = actor(torch.from_numpy(obs), generator=torch.Generator().manual_seed(1))[0].numpy()
    assert np.all(a >= LOW) and np.all(a <= HIGH)
    np.testing.assert_allclose(a.mean(0), ref.mean(0), atol=0.03)
    np.testing.assert_allclose(a.std(0), ref.std(0), rtol=0.05, atol=0.01)
    det = np_actor.act(obs[:1], np.random.default_rng(1), explore=False)
    assert np.abs(a.std(0)).min() > 0.01 and not np.allclose(a[:1], det)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_load_updates_in_place(algo: str) -> None:
    np_actor = NumpyActor(module_state(torch_actor(algo, seed=0)), algo, LOW, HIGH)
    weights = list(np_actor._wt)
    other = torch_actor(algo, seed=1)
    np_actor.load(module_state(other))
    assert all(a is b for a, b in zip(np_actor._wt, weights))
    obs = np.random.default_rng(3).standard_normal((5, OBS)).astype(np.float32)
    np.testing.assert_allclose(np_actor.act(obs, np.random.default_rng(0), False),
                               torch_mean_action(other, obs), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="shape"):
        np_actor.load(module_state(torch_actor(algo, hidden=(32, 17))))


def test_rejects_wrong_state() -> None:
    with pytest.raises(ValueError, match="not a sac actor"):
        NumpyActor(module_state(torch_actor("td3")), "sac", LOW, HIGH)
    with pytest.raises(ValueError, match="act_dim"):
        NumpyActor(module_state(torch_actor("td3")), "td3", LOW[:2], HIGH[:2])
    with pytest.raises(ValueError, match="algo"):
        NumpyActor(module_state(torch_actor("td3")), "ppo", LOW, HIGH)
