"""Baseline for time-to-score: Stable-Baselines3 TD3 or SAC with the RL-Zoo settings for MuJoCo.

Standalone on purpose (it imports nothing of Spreeze): run it with any Python that has
`stable-baselines3` and `gymnasium[mujoco]`, e.g. a separate virtual environment, so the
project never depends on SB3:

    python -m venv /tmp/sb3 && /tmp/sb3/bin/pip install torch==2.13.0 "gymnasium[mujoco]" stable-baselines3
    /tmp/sb3/bin/python bench/sb3_baseline.py --env HalfCheetah-v5 --steps 60000 --threshold 3000 --seed 0
    /tmp/sb3/bin/python bench/sb3_baseline.py --algo sac --env Hopper-v5 --threshold 1000 --stop-at-threshold

RL-Zoo's td3.yml for the MuJoCo tasks: learning_starts 10000, Gaussian action noise 0.1,
train_freq 1, gradient_steps 1, learning_rate 1e-3, batch_size 256, net_arch [400, 300].
Its sac.yml: learning_starts 10000 and SB3's SAC defaults otherwise (learning_rate 3e-4,
batch_size 256, net_arch [256, 256], one gradient step per env step, entropy coefficient
tuned to the target -act_dim). Every `--eval-every` env steps it runs `--episodes`
deterministic episodes; the clock that is reported counts training only (evaluation
excluded), which favours SB3. Prints one JSON line: env steps and training seconds at the
first evaluation >= threshold (null if none), and every evaluation; `--stop-at-threshold`
ends the run there.
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.noise import NormalActionNoise


class Clocked(BaseCallback):
    """Evaluates every `every` steps with the training clock stopped."""

    def __init__(self, env_id: str, every: int, episodes: int, threshold: float, seed: int, stop: bool) -> None:
        super().__init__()
        self.eval_env = gym.make(env_id)
        self.every, self.episodes, self.threshold, self.seed, self.stop = every, episodes, threshold, seed, stop
        self.train_s, self.since = 0.0, time.perf_counter()
        self.evals: list[dict[str, float]] = []
        self.hit: dict[str, float] | None = None

    def _on_step(self) -> bool:
        if self.num_timesteps % self.every:
            return True
        self.train_s += time.perf_counter() - self.since
        returns = []
        for i in range(self.episodes):
            obs, _ = self.eval_env.reset(seed=self.seed + 1000 + i)
            done, total = False, 0.0
            while not done:
                action, _ = self.model.predict(obs, deterministic=True)
                obs, reward, terminated, truncated, _ = self.eval_env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        row = {"env_steps": self.num_timesteps, "train_s": round(self.train_s, 1),
               "return_mean": round(float(np.mean(returns)), 1)}
        self.evals.append(row)
        print(json.dumps(row), flush=True)
        if self.hit is None and row["return_mean"] >= self.threshold:
            self.hit = row
        self.since = time.perf_counter()
        return not (self.stop and self.hit is not None)


def model(algo: str, env: gym.Env, seed: int) -> BaseAlgorithm:
    """SB3's TD3 or SAC with RL-Zoo's MuJoCo settings."""
    if algo == "sac":
        return SAC("MlpPolicy", env, learning_starts=10_000, seed=seed, verbose=0)
    shape = env.action_space.shape
    assert shape is not None, "the env has no continuous action space"
    n = shape[0]
    return TD3("MlpPolicy", env, learning_starts=10_000, train_freq=1, gradient_steps=1, learning_rate=1e-3,
               batch_size=256, policy_kwargs={"net_arch": [400, 300]}, seed=seed, verbose=0,
               action_noise=NormalActionNoise(np.zeros(n), 0.1 * np.ones(n)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", choices=("td3", "sac"), default="td3")
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--threshold", type=float, default=3000.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=5000)
    p.add_argument("--episodes", type=int, default=5)
    p.add_argument("--stop-at-threshold", action="store_true", help="end at the first evaluation >= threshold")
    p.add_argument("--threads", type=int, default=1, help="torch threads (Spreeze's learner uses 1)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    clock = Clocked(args.env, args.eval_every, args.episodes, args.threshold, args.seed, args.stop_at_threshold)
    model(args.algo, gym.make(args.env), args.seed).learn(total_timesteps=args.steps, callback=clock)
    print(json.dumps({"algo": args.algo, "env": args.env, "seed": args.seed, "threshold": args.threshold,
                      "hit": clock.hit, "evals": clock.evals}))


if __name__ == "__main__":
    main()
