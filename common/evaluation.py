"""Deterministic evaluation episodes, shared by the evaluator service and `spreeze eval`."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np

from spreeze.common.errors import ConfigError

from spreeze.common.numpy_policy import NumpyActor


def run_episodes(env: gym.Env, actor: NumpyActor, episodes: int,
                 max_steps: int = 100_000) -> tuple[list[float], list[int]]:
    """(returns, lengths) of `episodes` deterministic episodes (no exploration noise)."""
    rng = np.random.default_rng(0)  # unused by deterministic acting, required by the API
    returns, lengths = [], []
    for _ in range(episodes):
        obs, _ = env.reset()
        total, steps, done = 0.0, 0, False
        while not done and steps < max_steps:
            action = actor.act(np.asarray(obs, np.float32)[None], rng, explore=False)[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            steps += 1
            done = terminated or truncated
        returns.append(total)
        lengths.append(steps)
    return returns, lengths


def checkpoint_path(run_dir: Path, which: str) -> Path:
    """RUN_DIR/checkpoints/<which>.pt; a ConfigError saying what is missing when it is not there."""
    if not run_dir.exists():
        raise ConfigError(f"{str(run_dir)!r} does not exist")
    if not run_dir.is_dir():
        raise ConfigError(f"{str(run_dir)!r} is not a run directory (a file)")
    path = run_dir / "checkpoints" / f"{which}.pt"
    if not path.is_file():
        raise ConfigError(f"no {which} checkpoint in {str(run_dir)!r} (checkpoints/{path.name}): the evaluator "
                          "writes it after an evaluation; has the run evaluated at least once?")
    return path


def evaluate_checkpoint(run_dir: Path, episodes: int, which: str = "best", seed: int = 12_345) -> list[float]:
    """Returns of `episodes` deterministic episodes of a run's best (or latest) checkpoint."""
    path = checkpoint_path(Path(run_dir), which)
    if episodes < 1:
        raise ConfigError(f"episodes={episodes}: evaluate at least 1 episode")
    import torch

    from spreeze.common.config import from_dict
    from spreeze.common.envs import make_env

    payload = torch.load(path, weights_only=False)
    cfg = from_dict(payload["config"])
    env = make_env(cfg.env, seed=seed)
    env.reset(seed=seed)
    state = {k: v.numpy() for k, v in payload["actor"].items()}
    actor = NumpyActor(state, cfg.algo, env.action_space.low, env.action_space.high)
    returns, _ = run_episodes(env, actor, episodes)
    env.close()
    return returns
