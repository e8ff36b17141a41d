"""A user's own environment package, as `env_imports` imports it in every process: importing
it registers `SpreezeTests/Drift-v0`, a point that the action pushes toward a target."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class Drift(gym.Env[np.ndarray, np.ndarray]):
    """obs [position, target], action [-1, 1] moves the point by 0.1 x action; reward
    -|position - target|; an episode lasts `horizon` steps (a keyword argument)."""

    def __init__(self, horizon: int = 50, target: float = 0.5) -> None:
        self.horizon, self.target = int(horizon), float(target)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.position, self.t = 0.0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.position, self.target], np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position, self.t = float(self.np_random.uniform(-1.0, 1.0)), 0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.position += 0.1 * float(np.clip(action[0], -1.0, 1.0))
        self.t += 1
        return self._obs(), -abs(self.position - self.target), False, self.t >= self.horizon, {}


gym.register("SpreezeTests/Drift-v0", entry_point=Drift)


class Truncate(gym.Wrapper[np.ndarray, np.ndarray, np.ndarray, np.ndarray]):
    """A user's wrapper, as `env_wrappers` names it (`tests.custom_envs:Truncate`): episodes end
    (truncated) after `steps` steps."""

    def __init__(self, env: gym.Env, steps: int) -> None:
        super().__init__(env)
        self.steps, self.t = int(steps), 0

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        self.t = 0
        return self.env.reset(**kwargs)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return obs, float(reward), terminated, truncated or self.t >= self.steps, info


class Split(gym.ObservationWrapper[dict, np.ndarray, np.ndarray]):
    """A user's wrapper whose observation is a Dict, as dm_control's are: {"position", "target"}
    of Drift's [position, target]."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        box = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.observation_space = gym.spaces.Dict({"position": box, "target": box})

    def observation(self, observation: np.ndarray) -> dict:
        return {"position": observation[:1], "target": observation[1:]}
