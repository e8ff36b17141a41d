"""Deterministic evaluation episodes, shared by the evaluator service and `spreeze eval`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from spreeze.common.checkpoint_files import readable
from spreeze.common.errors import ConfigError
from spreeze.common.numpy_policy import NumpyActor

if TYPE_CHECKING:
    from spreeze.common.config import Config


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
    """RUN_DIR/checkpoints/<which>.pt (or the one before it, where that is damaged); a ConfigError
    saying what is missing when there is none, a CheckpointError naming both when both are damaged."""
    if not run_dir.exists():
        raise ConfigError(f"{str(run_dir)!r} does not exist")
    if not run_dir.is_dir():
        raise ConfigError(f"{str(run_dir)!r} is not a run directory (a file)")
    path = run_dir / "checkpoints" / f"{which}.pt"
    found = readable(path)  # (the one kept before it where `path` is damaged)
    if found is None:
        raise ConfigError(f"no {which} checkpoint in {str(run_dir)!r} (checkpoints/{path.name}): the evaluator "
                          "writes it after an evaluation; has the run evaluated at least once?")
    return found


def rebuilt_policy(cfg: Any, obs_dim: int, low: np.ndarray, high: np.ndarray) -> dict[str, Any]:
    """The acting-policy description of a checkpoint written before checkpoints carried one: the
    run config's actor, built as its learner built it and described the same way."""
    import torch

    from spreeze.common.algorithms.build import make_parts
    from spreeze.common.policy_export import describe_actor

    actor, _ = make_parts(cfg.algo, obs_dim, len(low), low, high, cfg.algo_config, torch.device("cpu"), True)
    return describe_actor(actor.actor)


def checkpoint_policy(run_dir: Path, which: str = "best"
                      ) -> tuple[Config, dict[str, Any], dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A run's config and its best (or latest) checkpoint's acting policy: the description,
    the actor's weights and the action bounds."""
    path = checkpoint_path(Path(run_dir), which)
    import torch

    from spreeze.common.config import from_dict
    from spreeze.common.envs import env_spec

    payload = torch.load(path, weights_only=False)
    cfg = from_dict(payload["config"])
    layout, low, high = env_spec(cfg.env_source)
    state = {k: v.numpy() for k, v in payload["actor"].items()}
    policy = payload.get("policy") or rebuilt_policy(cfg, layout.obs_dim, low, high)
    return cfg, policy, state, low, high


def checkpoint_actor(run_dir: Path, which: str = "best") -> tuple[Config, NumpyActor]:
    """A run's config and the numpy actor of its best (or latest) checkpoint."""
    cfg, policy, state, low, high = checkpoint_policy(run_dir, which)
    return cfg, NumpyActor(policy, state, low, high)


def evaluate_checkpoint(run_dir: Path, episodes: int, which: str = "best", seed: int = 12_345) -> list[float]:
    """Returns of `episodes` deterministic episodes of a run's best (or latest) checkpoint."""
    if episodes < 1:
        raise ConfigError(f"episodes={episodes}: evaluate at least 1 episode")
    cfg, actor = checkpoint_actor(Path(run_dir), which)
    from spreeze.common.envs import make_env

    env = make_env(cfg.env_source, seed=seed)
    env.reset(seed=seed)
    returns, _ = run_episodes(env, actor, episodes)
    env.close()
    return returns
