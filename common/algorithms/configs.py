"""The algorithms' hyperparameters and descriptors, without torch.

Every service reads the run config, which holds these dataclasses; only the learners build
parts (common/algorithms/td3.py, sac.py), so only they import torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spreeze.common.algorithms.descriptor import Algorithm


def check(ok: bool, field: str, value: object, requirement: str) -> None:
    """Raise ``ValueError("field=value requirement")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{field}={value!r} {requirement}")


def check_hidden(field: str, hidden: object) -> None:
    """Hidden sizes must be a non-empty sequence of positive ints."""
    ok = isinstance(hidden, (tuple, list)) and len(hidden) > 0 and all(
        isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in hidden)
    check(ok, field, hidden, "must be a non-empty sequence of positive ints")


@dataclass(frozen=True)
class TD3Config:
    """TD3 hyperparameters (defaults: the TD3 paper / DS-TD3 paper)."""

    hidden: tuple[int, ...] = (64, 64)  # MLP hidden sizes, actor and critics (paper: 256, 256; 64-64 learns HalfCheetah as fast per step at ~1/5 the CPU)
    actor_lr: float = 1e-3  # Adam learning rate of the actor
    critic_lr: float = 1e-3  # Adam learning rate of the twin critics
    weight_decay: float = 0.0  # Adam (L2) weight decay; the DS-TD3 paper used 2e-4
    gamma: float = 0.99  # discount factor
    tau: float = 0.005  # Polyak rate of the target networks
    policy_noise: float = 0.2  # std of target policy smoothing noise, in half action ranges
    noise_clip: float = 0.5  # clip of that noise, in half action ranges
    policy_delay: int = 2  # critic updates per actor update (and per target update)
    exploration_noise: float = 0.1  # std of the acting policy's Gaussian noise, in half action ranges

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        check_hidden("td3.hidden", self.hidden)
        for name in ("actor_lr", "critic_lr"):
            value = getattr(self, name)
            check(value > 0, f"td3.{name}", value, "must be > 0")
        for name in ("weight_decay", "policy_noise", "noise_clip", "exploration_noise"):
            value = getattr(self, name)
            check(value >= 0, f"td3.{name}", value, "must be >= 0")
        check(0 <= self.gamma <= 1, "td3.gamma", self.gamma, "must be in [0, 1]")
        check(0 < self.tau <= 1, "td3.tau", self.tau, "must be in (0, 1]")
        check(isinstance(self.policy_delay, int) and self.policy_delay >= 1,
              "td3.policy_delay", self.policy_delay, "must be an int >= 1")


@dataclass(frozen=True)
class SACConfig:
    """SAC hyperparameters (defaults: SAC v2 / softlearning, CleanRL)."""

    hidden: tuple[int, ...] = (64, 64)  # MLP hidden sizes, actor and critics (papers: 256, 256; 64-64 learns HalfCheetah to ~4,800 in 100k steps at ~1/5 the CPU)
    actor_lr: float = 3e-4  # Adam learning rate of the actor
    critic_lr: float = 3e-4  # Adam learning rate of the twin critics
    alpha_lr: float = 3e-4  # Adam learning rate of log(alpha) when autotune
    gamma: float = 0.99  # discount factor
    tau: float = 0.005  # Polyak rate of the critic targets
    init_alpha: float = 1.0  # initial temperature, as softlearning/CleanRL/SB3; ~0.2 if no autotune
    autotune: bool = True  # learn alpha to hold the policy entropy at target_entropy
    target_entropy: float | None = None  # None means -act_dim
    log_std_min: float = -5.0  # lower bound of the pre-squash log std
    log_std_max: float = 2.0  # upper bound of the pre-squash log std

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        check_hidden("sac.hidden", self.hidden)
        for name in ("actor_lr", "critic_lr", "alpha_lr", "init_alpha"):
            value = getattr(self, name)
            check(value > 0, f"sac.{name}", value, "must be > 0")
        check(0 <= self.gamma <= 1, "sac.gamma", self.gamma, "must be in [0, 1]")
        check(0 < self.tau <= 1, "sac.tau", self.tau, "must be in (0, 1]")
        check(self.target_entropy is None or math.isfinite(self.target_entropy),
              "sac.target_entropy", self.target_entropy, "must be a finite float or None")
        check(self.log_std_min < self.log_std_max, "sac.log_std_min", self.log_std_min,
              f"must be < sac.log_std_max={self.log_std_max}")


TD3 = Algorithm(name="td3", config=TD3Config, parts="spreeze.common.algorithms.td3",
                policy_delay=lambda cfg: cfg.policy_delay,
                exploration_noise=lambda cfg: cfg.exploration_noise,
                actor_nets=("actor", "actor_target"))  # TD targets use the target actor


SAC = Algorithm(name="sac", config=SACConfig, parts="spreeze.common.algorithms.sac",
                policy_delay=lambda cfg: 1,
                exploration_noise=lambda cfg: 0.0,  # explores by sampling its own Gaussian
                actor_nets=("actor",))  # TD targets use the online actor (and the temperature in extras)
