"""Numpy inference of the actor for samplers and the evaluator (no torch on the hot path).

Built from an actor :data:`~common.algorithms.base.State` as the actor-learner publishes it;
layer sizes are inferred from the weight shapes. For the small batches samplers use
(1-64 envs) plain ``x @ W.T + b`` with pre-transposed contiguous weights beats torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from spreeze.common.algorithms import algorithm
from spreeze.common.algorithms.descriptor import NumpyLayout

_LAYER = re.compile(r"^(?P<mod>\w+)\.(?P<idx>\d+)\.weight$")


def _layer_names(state: Mapping[str, np.ndarray], algo: str, layout: NumpyLayout) -> list[str]:
    """Weight/bias name prefixes of the Linear layers in forward order."""
    found = [(int(m["idx"]), f"{m['mod']}.{m['idx']}") for m in map(_LAYER.match, state)
             if m is not None and m["mod"] == layout.trunk]
    names = [name for _, name in sorted(found)]
    if layout.head is not None:
        names.append(layout.head)
    if not names or any(f"{n}.weight" not in state or f"{n}.bias" not in state for n in names):
        raise ValueError(f"state is not a {algo} actor: keys {sorted(state)}")
    return names


class NumpyActor:
    """The actor's forward pass in numpy, float32.

    ``act(obs, rng, explore)``: a deterministic policy (TD3) adds Gaussian noise (std
    ``exploration_noise`` half action ranges) to its action and clips; a stochastic one (SAC)
    samples the tanh-Gaussian when exploring and returns ``tanh(mean)`` (rescaled) otherwise.
    """

    def __init__(self, state: Mapping[str, np.ndarray], algo: str, action_low: np.ndarray,
                 action_high: np.ndarray, exploration_noise: float = 0.1) -> None:
        layout = algorithm(algo).numpy_actor
        self.algo, self.stochastic = algo, layout.stochastic
        self._names = _layer_names(state, algo, layout)
        self._wt = [np.ascontiguousarray(np.asarray(state[f"{n}.weight"], np.float32).T)
                    for n in self._names]
        self._b = [np.array(state[f"{n}.bias"], np.float32) for n in self._names]
        self.low = np.asarray(action_low, np.float32)
        self.high = np.asarray(action_high, np.float32)
        self.act_dim = self.low.shape[0]
        self.obs_dim = self._wt[0].shape[0]
        self._scale = ((self.high - self.low) / 2.0).astype(np.float32)
        self._bias = ((self.high + self.low) / 2.0).astype(np.float32)
        self._noise_std = (exploration_noise * self._scale).astype(np.float32)
        lo, hi = (np.asarray(state["log_std_bounds"], np.float64).tolist()
                  if self.stochastic else (0.0, 0.0))
        self._log_std_lo, self._log_std_half = np.float32(lo), np.float32(0.5 * (hi - lo))
        out = self._wt[-1].shape[1]
        if out != (2 if self.stochastic else 1) * self.act_dim:
            raise ValueError(f"{algo} actor output size {out} does not fit act_dim={self.act_dim}")

    def load(self, state: Mapping[str, np.ndarray]) -> None:
        """Copy new weights in place; shapes must match the current ones."""
        for n, wt, b in zip(self._names, self._wt, self._b):
            w = np.asarray(state[f"{n}.weight"])
            if w.T.shape != wt.shape or np.shape(state[f"{n}.bias"]) != b.shape:
                raise ValueError(f"state[{n!r}] shape {w.shape} does not match {wt.T.shape}")
            np.copyto(wt, w.T)
            np.copyto(b, state[f"{n}.bias"])

    def _features(self, obs: np.ndarray) -> np.ndarray:
        """Output of the last Linear layer (ReLU between layers)."""
        x = np.asarray(obs, np.float32)
        last = len(self._wt) - 1
        for i, (wt, b) in enumerate(zip(self._wt, self._b)):
            x = x @ wt + b
            if i < last:
                np.maximum(x, 0.0, out=x)
        return x

    def mean_action(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic action [E, act_dim] (TD3: pi(s); SAC: tanh(mean) rescaled)."""
        y = self._features(obs)[:, : self.act_dim]
        return np.tanh(y) * self._scale + self._bias

    def act(self, obs: np.ndarray, rng: np.random.Generator, explore: bool) -> np.ndarray:
        """Actions [E, act_dim] float32 within [low, high] for observations [E, obs_dim]."""
        if not explore or not self.stochastic:
            a = self.mean_action(obs)
            if explore:
                a += rng.standard_normal(a.shape, dtype=np.float32) * self._noise_std
        else:
            y = self._features(obs)
            mean, raw = y[:, : self.act_dim], y[:, self.act_dim:]
            log_std = self._log_std_lo + self._log_std_half * (np.tanh(raw) + np.float32(1.0))
            u = mean + np.exp(log_std) * rng.standard_normal(mean.shape, dtype=np.float32)
            a = np.tanh(u) * self._scale + self._bias
        return np.clip(a, self.low, self.high, out=a)
