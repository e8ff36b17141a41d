"""Sampler: act with the newest actor (random during warm-up), push batches of transitions.

Loop: take the newest actor weights if any arrived; step E envs `steps_per_push` times
writing rows into a fresh matrix; push it (blocks at the replay's high-water mark:
back-pressure, nothing dropped); publish metrics about once a second.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from common.envs import EnvBatch
from common.errors import ConfigError
from common.numpy_policy import NumpyActor
from common.service import Service
from common.weights import WeightsFollower, to_state
from proto.messages import Experience, Weights

METRICS_EVERY = 1.0  # seconds between metrics messages


def service_seed(base: int, service_id: str, session: str) -> np.random.SeedSequence:
    """Distinct streams per sampler and per incarnation (a restart must not replay its past)."""
    return np.random.SeedSequence([base, *service_id.encode(), int(session, 16) % (1 << 32)])


class Sampler(Service):
    ROLE = "sampler"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        sc = self.cfg.sampler
        seq = service_seed(self.cfg.seed, self.service_id, self.encoder.session)
        self.rng = np.random.default_rng(seq)
        self.envs = EnvBatch(self.cfg.env, sc.envs_per_sampler, int(seq.generate_state(1)[0] % (1 << 30)))
        self.layout = self.envs.layout
        self.warmup = sc.warmup_steps // max(sc.num_samplers, 1)  # remote-only runs: 0 local samplers
        self.actor: NumpyActor | None = None
        self.actor_version = -1
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.pushed = 0
        self.steps_per_push = sc.steps_per_push

    def counters(self) -> dict[str, Any]:
        return {"env_steps": self.envs.steps, "actor_version": self.actor_version}

    def set_param(self, key: str, value: Any) -> None:
        if key != "steps_per_push" or type(value) is not int or value <= 0:
            raise ConfigError(f"sampler: cannot set {key}={value!r} (settable: steps_per_push > 0)")
        self.steps_per_push = value

    async def serve(self) -> None:
        push = self.channel("experience", binding=False)
        follower = WeightsFollower(self.channel("weights", binding=False, name="actor_weights"))
        last_metrics, last_steps = time.monotonic(), 0
        while self.running:
            if self.paused:
                await asyncio.sleep(0.05)
                continue
            newest = follower.poll().get("actor")
            if newest is not None:
                self.take_weights(newest)
            await push.send(self.collect())
            await asyncio.sleep(0)  # a send that does not block never yields: let heartbeats and control run
            now = time.monotonic()
            if now - last_metrics >= METRICS_EVERY:
                self.report(now - last_metrics, self.envs.steps - last_steps)
                last_metrics, last_steps = now, self.envs.steps

    def take_weights(self, msg: Weights) -> None:
        state = to_state(msg)
        if self.actor is None:
            self.actor = NumpyActor(state, self.cfg.algo, self.envs.low, self.envs.high,
                                    getattr(self.cfg.algo_config, "exploration_noise", 0.0))
        else:
            self.actor.load(state)
        self.actor_version = msg.version

    def collect(self) -> Experience:
        """Step all envs steps_per_push times into a new matrix (the last one may still be in flight)."""
        n_env = len(self.envs)
        steps = self.steps_per_push
        rows = np.empty((steps * n_env, self.layout.width), np.float32)
        returns, lengths = [], []
        for t in range(steps):
            explore = self.actor is not None and self.envs.steps >= self.warmup
            actions = (self.actor.act(self.envs.obs, self.rng, explore=True) if explore  # type: ignore[union-attr]
                       else self.envs.random_actions(self.rng))
            for ret, length in self.envs.step(actions, rows[t * n_env:(t + 1) * n_env]):
                returns.append(ret)
                lengths.append(length)
        self.returns += returns
        self.lengths += lengths
        self.pushed += 1
        version = self.actor_version if self.envs.steps > self.warmup else -1
        return Experience(rows, self.layout.obs_dim, self.layout.act_dim, self.envs.steps, version,
                          returns, lengths)

    def report(self, dt: float, steps: int) -> None:
        values: dict[str, Any] = {"env_steps": self.envs.steps, "sampling_hz": steps / dt,
                                  "actor_version": self.actor_version}
        if self.returns:
            values["episode_return"] = float(np.mean(self.returns))
            values["episode_length"] = float(np.mean(self.lengths))
            values["episodes"] = len(self.returns)
            self.returns, self.lengths = [], []
        self.publish(values)

    async def close(self) -> None:
        self.envs.close()
