"""Numpy interpreter of the acting-policy description, for samplers and the evaluator (no torch).

Built from (description, weights, action bounds): the description (common/policy_program.py,
proto/SPEC.md §4.4) says which named parameters each op reads, so nothing here knows an
algorithm. The ops are compiled once into a list of steps over pre-transposed contiguous
float32 copies of the weights, which ``load`` refreshes in place; for the small batches
samplers use (1-64 envs) plain ``x @ W.T + b`` this way beats torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from spreeze.common.errors import PolicyParamError, PolicyShapeError
from spreeze.common.policy_program import Op, PolicyProgram, parse, where

Slots = dict[str, np.ndarray]
Step = Callable[[np.ndarray, Slots], np.ndarray]


def _linear_relu(wt: np.ndarray, b: np.ndarray) -> Step:
    def step(x: np.ndarray, _: Slots) -> np.ndarray:
        y = x @ wt
        y += b
        return np.maximum(y, np.float32(0.0), out=y)
    return step


class _Builder:
    """Compiles a program's body op by op, tracking the feature width and whether the current
    array is the step's own (fresh: may be overwritten in place) or shared (input, a slot)."""

    def __init__(self, state: Mapping[str, np.ndarray]) -> None:
        self.state = state
        self.bound: list[tuple[str, np.ndarray, bool]] = []  # (param, our copy, stored transposed)
        self.derive: list[Callable[[], object]] = []  # recompute derived arrays after a load
        self.steps: list[Step] = []
        self.width: int | None = None  # features of the current array (None: not known yet)
        self.obs_dim: int | None = None
        self.fresh = False
        self.slot_width: dict[str, int | None] = {}
        self.last_linear: tuple[np.ndarray, np.ndarray] | None = None  # the previous step, a biased linear

    def param(self, i: int, op: Op, field: str, ndim: int, transposed: bool = False) -> np.ndarray:
        name = op[field]
        if name not in self.state:
            raise PolicyParamError(f"{where(i, op)}: field {field!r} names {name!r}, which the weights lack")
        arr = np.asarray(self.state[name], np.float32)
        if arr.ndim != ndim:
            raise PolicyShapeError(f"{where(i, op)}: {field} {name!r} has shape {list(arr.shape)}, "
                                   f"expected {ndim} dims")
        own = np.array(arr.T if transposed else arr, np.float32, order="C")  # our copy: loads write into it
        self.bound.append((name, own, transposed))
        return own

    def fits(self, i: int, op: Op, field: str, arr: np.ndarray, width: int) -> None:
        if arr.shape != (width,):
            raise PolicyShapeError(f"{where(i, op)}: {field} {op[field]!r} has shape {list(arr.shape)}, "
                                   f"expected [{width}]")

    def need(self, i: int, op: Op, width: int) -> None:
        """The current width must be `width` (or becomes it, at the input)."""
        if self.width is None:
            self.width = self.obs_dim = width
        elif self.width != width:
            raise PolicyShapeError(f"{where(i, op)}: takes {width} features, gets {self.width}")

    def compile_op(self, op: Op, i: int) -> None:
        linear = self.last_linear
        self.last_linear = None
        if op["op"] == "relu" and linear is not None:  # one step instead of two: the sampler's hot path
            self.steps[-1] = _linear_relu(*linear)
            return
        getattr(self, "op_" + op["op"])(i, op)

    def op_linear(self, i: int, op: Op) -> None:
        wt = self.param(i, op, "weight", 2, transposed=True)
        self.need(i, op, wt.shape[0])
        self.width = wt.shape[1]
        if "bias" in op:
            b = self.param(i, op, "bias", 1)
            self.fits(i, op, "bias", b, self.width)

            def step(x: np.ndarray, _: Slots) -> np.ndarray:
                y = x @ wt
                y += b
                return y
            self.last_linear = (wt, b)
        else:
            def step(x: np.ndarray, _: Slots) -> np.ndarray:
                return x @ wt
        self.steps.append(step)
        self.fresh = True

    def op_obs_norm(self, i: int, op: Op) -> None:
        mean, var = self.param(i, op, "mean", 1), self.param(i, op, "var", 1)
        self.need(i, op, mean.shape[0])
        self.fits(i, op, "var", var, mean.shape[0])
        eps, clip = np.float32(op["eps"]), np.float32(op["clip"])
        inv_std = np.empty_like(var)
        self.derive.append(lambda: np.divide(np.float32(1.0), np.sqrt(var + eps), out=inv_std))
        self.derive[-1]()

        def step(x: np.ndarray, _: Slots) -> np.ndarray:
            y = x - mean
            y *= inv_std
            return np.clip(y, -clip, clip, out=y)
        self.steps.append(step)
        self.fresh = True

    def op_layer_norm(self, i: int, op: Op) -> None:
        w = self.param(i, op, "weight", 1) if "weight" in op else None
        b = self.param(i, op, "bias", 1) if "bias" in op else None
        if self.width is None and w is not None:
            self.need(i, op, w.shape[0])
        if self.width is None:
            raise PolicyShapeError(f"{where(i, op)}: its width is not known (no earlier op sets it)")
        for field, arr in (("weight", w), ("bias", b)):
            if arr is not None:
                self.fits(i, op, field, arr, self.width)
        eps = np.float32(op["eps"])

        def step(x: np.ndarray, _: Slots) -> np.ndarray:
            y = x - x.mean(-1, keepdims=True)
            y /= np.sqrt(np.square(y).mean(-1, keepdims=True) + eps)
            if w is not None:
                y *= w
            if b is not None:
                y += b
            return y
        self.steps.append(step)
        self.fresh = True

    def elementwise(self, in_place: Callable[..., np.ndarray]) -> None:
        if self.fresh:
            self.steps.append(lambda x, _: in_place(x, out=x))
        else:
            self.steps.append(lambda x, _: in_place(x))
        self.fresh = True

    def op_relu(self, i: int, op: Op) -> None:
        self.elementwise(lambda x, out=None: np.maximum(x, np.float32(0.0), out=out))

    def op_tanh(self, i: int, op: Op) -> None:
        self.elementwise(np.tanh)

    def op_elu(self, i: int, op: Op) -> None:
        alpha = np.float32(op["alpha"])
        self.steps.append(lambda x, _: np.where(x > 0, x, alpha * np.expm1(x)))
        self.fresh = True

    def op_silu(self, i: int, op: Op) -> None:
        one = np.float32(1.0)
        self.steps.append(lambda x, _: x / (one + np.exp(-x)))
        self.fresh = True

    def op_save(self, i: int, op: Op) -> None:
        slot = op["slot"]
        self.slot_width[slot] = self.width

        def step(x: np.ndarray, slots: Slots) -> np.ndarray:
            slots[slot] = x
            return x
        self.steps.append(step)
        self.fresh = False  # shared with the slot from now on

    def op_add(self, i: int, op: Op) -> None:
        slot = op["slot"]
        saved = self.slot_width[slot]
        saved = self.obs_dim if saved is None else saved  # saved at the input: the observation's width
        if saved != self.width:
            raise PolicyShapeError(f"{where(i, op)}: slot {slot!r} holds {saved} features, "
                                   f"the current array {self.width}")
        if self.fresh:
            self.steps.append(lambda x, slots: np.add(x, slots[slot], out=x))
        else:
            self.steps.append(lambda x, slots: x + slots[slot])
        self.fresh = True


class NumpyActor:
    """The acting policy of a description, float32, over the weights it names.

    ``act(obs, rng, explore)``: a ``squash`` head adds Gaussian noise (std its
    ``exploration_noise`` half action ranges) when exploring; a ``tanh_gaussian`` head samples
    when exploring and returns ``tanh(mean)`` (rescaled) otherwise; both clip to the bounds.
    """

    def __init__(self, policy: Mapping[str, Any] | PolicyProgram, state: Mapping[str, np.ndarray],
                 action_low: np.ndarray, action_high: np.ndarray) -> None:
        self.program = policy if isinstance(policy, PolicyProgram) else parse(policy)
        b = _Builder(state)
        for i, op in enumerate(self.program.body):
            b.compile_op(op, i)
        head, n = self.program.head, len(self.program.body)
        self.stochastic = head["op"] == "tanh_gaussian"
        self._scale, self._bias = b.param(n, head, "scale", 1), b.param(n, head, "bias", 1)
        self.act_dim = self._scale.shape[0]
        b.fits(n, head, "bias", self._bias, self.act_dim)
        b.need(n, head, (2 if self.stochastic else 1) * self.act_dim)
        assert b.obs_dim is not None
        self.obs_dim = b.obs_dim
        self._steps, self._bound, self._derive = b.steps, b.bound, b.derive
        self.low = np.asarray(action_low, np.float32)
        self.high = np.asarray(action_high, np.float32)
        if self.low.shape != (self.act_dim,) or self.high.shape != (self.act_dim,):
            raise PolicyShapeError(f"action bounds of shape {list(self.low.shape)}, {list(self.high.shape)} "
                                   f"do not fit the policy's act_dim={self.act_dim}")
        self._noise = np.float32(head.get("exploration_noise", 0.0))
        self._noise_std = np.empty_like(self._scale)
        lo, hi = head.get("log_std_min", 0.0), head.get("log_std_max", 0.0)
        self._log_std_lo, self._log_std_half = np.float32(lo), np.float32(0.5 * (hi - lo))
        self._derive.append(lambda: np.multiply(self._noise, np.abs(self._scale), out=self._noise_std))
        self._derive[-1]()

    def load(self, state: Mapping[str, np.ndarray]) -> None:
        """Copy new weights in place; every named parameter must be there with its current shape."""
        for name, own, transposed in self._bound:
            if name not in state:
                raise PolicyParamError(f"weights lack {name!r}, which the policy reads")
            shape = own.shape[::-1] if transposed else own.shape
            if np.shape(state[name]) != shape:
                raise PolicyShapeError(f"state[{name!r}] shape {list(np.shape(state[name]))} does not match "
                                       f"{list(shape)}")
        for name, own, transposed in self._bound:
            np.copyto(own, np.asarray(state[name]).T if transposed else state[name])
        for derive in self._derive:
            derive()

    def _features(self, obs: np.ndarray) -> np.ndarray:
        """The body's output for observations [E, obs_dim]."""
        x = np.asarray(obs, np.float32)
        slots: Slots = {}
        for step in self._steps:
            x = step(x, slots)
        return x

    def _squash(self, u: np.ndarray) -> np.ndarray:
        a = np.tanh(u)
        a *= self._scale
        a += self._bias
        return a

    def mean_action(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic action [E, act_dim]: ``tanh(x) * scale + bias`` of the head's (mean) input."""
        return self._squash(self._features(obs)[:, : self.act_dim])

    def act(self, obs: np.ndarray, rng: np.random.Generator, explore: bool) -> np.ndarray:
        """Actions [E, act_dim] float32 within [low, high] for observations [E, obs_dim]."""
        if not explore or not self.stochastic:
            a = self.mean_action(obs)
            if explore and self._noise > 0:
                a += rng.standard_normal(a.shape, dtype=np.float32) * self._noise_std
        else:
            y = self._features(obs)
            mean, raw = y[:, : self.act_dim], y[:, self.act_dim:]
            log_std = self._log_std_lo + self._log_std_half * (np.tanh(raw) + np.float32(1.0))
            u = mean + np.exp(log_std) * rng.standard_normal(mean.shape, dtype=np.float32)
            a = self._squash(u)
        return np.clip(a, self.low, self.high, out=a)
