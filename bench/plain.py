"""The plain loop `bench update` compares against: textbook eager PyTorch TD3 and SAC updates.

Written the way a single-file implementation (CleanRL's) writes them, on the networks
``make_parts`` builds: module calls, ``F.mse_loss`` per critic, ``torch.optim.Adam`` with
its defaults, one ``backward()`` per loss, a Polyak ``lerp_`` per tensor. It shares no
update code with Spreeze, so it stays a fixed reference while Spreeze's steps change.
Another registered algorithm has no textbook loop here: its plain side is its own eager
update (`plain_loop` says which).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from spreeze.common.algorithms import algorithm

Batch = dict[str, torch.Tensor]
Update = Callable[[Batch, bool], float | None]


def _polyak(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    with torch.no_grad():
        for t, p in zip(target.parameters(), online.parameters()):
            t.lerp_(p, tau)


def td3(actor_part: Any, critic_part: Any) -> Update:
    """TD3 (Fujimoto et al. 2018): critic every update, actor and targets every d-th."""
    cfg = critic_part.cfg
    actor, actor_t = actor_part.actor, actor_part.actor_target
    critic, critic_t = critic_part.critic, critic_part.critic_target
    scale, low, high = critic_part.scale, critic_part.low, critic_part.high
    q_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    a_opt = torch.optim.Adam(actor.parameters(), lr=cfg.actor_lr)
    count = [0]

    def update(b: Batch, read: bool) -> float | None:
        with torch.no_grad():
            noise = (torch.randn_like(b["action"]) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            next_a = torch.max(torch.min(actor_t(b["next_obs"]) + noise * scale, high), low)
            q1_t, q2_t = critic_t(b["next_obs"], next_a)
            y = b["reward"] + (1.0 - b["done"]) * cfg.gamma * torch.min(q1_t, q2_t)
        q1, q2 = critic(b["obs"], b["action"])
        q_loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()
        count[0] += 1
        if count[0] % cfg.policy_delay == 0:
            a_loss = -critic.q1(b["obs"], actor(b["obs"])).mean()
            a_opt.zero_grad()
            a_loss.backward()
            a_opt.step()
            _polyak(actor_t, actor, cfg.tau)
            _polyak(critic_t, critic, cfg.tau)
        return q_loss.item() if read else None

    return update


def sac(actor_part: Any, critic_part: Any) -> Update:
    """SAC with a learned temperature (Haarnoja et al. 2018, v2): every update all steps."""
    cfg = critic_part.cfg
    actor, critic, critic_t = actor_part.actor, critic_part.critic, critic_part.critic_target
    log_alpha = torch.zeros((), requires_grad=True, device=actor_part.log_alpha.device)
    target_entropy = actor_part.target_entropy
    q_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    a_opt = torch.optim.Adam(actor.parameters(), lr=cfg.actor_lr)
    alpha_opt = torch.optim.Adam([log_alpha], lr=cfg.alpha_lr)

    def update(b: Batch, read: bool) -> float | None:
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_a, next_logp = actor(b["next_obs"])
            q1_t, q2_t = critic_t(b["next_obs"], next_a)
            y = b["reward"] + (1.0 - b["done"]) * cfg.gamma * (torch.min(q1_t, q2_t) - alpha * next_logp)
        q1, q2 = critic(b["obs"], b["action"])
        q_loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()
        a, logp = actor(b["obs"])
        q1_pi, q2_pi = critic(b["obs"], a)
        a_loss = (alpha * logp - torch.min(q1_pi, q2_pi)).mean()
        a_opt.zero_grad()
        a_loss.backward()
        a_opt.step()
        alpha_loss = -(log_alpha * (logp.detach() + target_entropy)).mean()
        alpha_opt.zero_grad()
        alpha_loss.backward()
        alpha_opt.step()
        _polyak(critic_t, critic, cfg.tau)
        return q_loss.item() if read else None

    return update


LOOPS: dict[str, Callable[[Any, Any], Update]] = {"td3": td3, "sac": sac}


def plain_loop(algo: str) -> Callable[[Any, Any], Update] | None:
    """The textbook loop of ``algo`` (a name or module path); None: it has none (TD3 and SAC do)."""
    return LOOPS.get(algorithm(algo).name)

