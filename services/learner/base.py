"""The parts every learner service shares: model parts, batches, publishing, checkpoints."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import torch
# torch.optim imports torch._dynamo on the first optimizer: seconds on a small, busy machine.
# Import it here, before the service registers, not inside the event loop where it would
# silence the heartbeats long enough for the supervisor to declare the learner dead.
import torch._dynamo  # noqa: F401

from common.algorithms import ActorPart, CriticPart, make_parts
from common.envs import env_spec
from common.learner_io import BatchStream, atomic_save, checkpoint_dir, device_of
from common.service import Service
from common.weights import WeightsPublisher, weights_message

METRICS_EVERY = 1.0  # seconds between metrics messages
LOSS_EVERY = 50  # updates between loss read-outs (each forces a device sync)


class LearnerBase(Service):
    """Subclasses call `setup(device, shared)` and run their own update loop."""

    def setup(self, device_name: str, shared: bool) -> tuple[ActorPart, CriticPart]:
        torch.set_num_threads(self.cfg.learner.threads)
        self.device = device_of(device_name)
        self.layout, low, high = env_spec(self.cfg.env)
        actor, critic = make_parts(self.cfg.algo, self.layout.obs_dim, self.layout.act_dim, low, high,
                                   self.cfg.algo_config, self.device, shared, self.cfg.seed,
                                   sparse=self.cfg.sparse, total_updates=self.cfg.total_updates)
        lc = self.cfg.learner
        self.batches = BatchStream(self.channel("sample", binding=False), self.layout, lc.batch_size,
                                   lc.prefetch, self.device)
        self.last_metrics = self.last_checkpoint = time.monotonic()
        self.metrics_updates = 0
        self.losses: dict[str, float] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        return actor, critic

    def publisher(self, endpoint_name: str) -> WeightsPublisher:
        pub = WeightsPublisher(self.channel("weights", binding=True, name=endpoint_name))
        self.tasks.append(asyncio.create_task(pub.serve_joins()))
        return pub

    def publish_actor(self, pub: WeightsPublisher, actor: ActorPart, net: str = "actor") -> None:
        """Version = actor updates; `updates` in critic updates (the run's update count).

        Sparse networks send their masked weights as (index, value) pairs where that is smaller.
        """
        extras = {**actor.extras(), "env_steps": float(self.batches.inserted)}
        state = actor.actor_state() if net == "actor" else actor.target_actor_state()
        assert state is not None
        sparse = actor.sparse.names if actor.sparse is not None else None
        pub.publish(weights_message(net, actor.updates, actor.updates * actor.policy_delay, state,
                                    sparse, extras))

    def tick(self, updates: int, extra: dict[str, Any]) -> None:
        """Metrics about once a second; learner checkpoints every checkpoint_every_s."""
        now = time.monotonic()
        dt = now - self.last_metrics
        if dt >= METRICS_EVERY:
            rate = (updates - self.metrics_updates) / dt
            self.publish({"updates": updates, "update_hz": rate,
                          "update_frame_rate": rate * self.cfg.learner.batch_size,
                          "batch_wait_s": self.batches.wait_s, "env_steps": self.batches.inserted,
                          **self.losses, **extra})
            self.last_metrics, self.metrics_updates = now, updates
        if now - self.last_checkpoint >= self.cfg.learner.checkpoint_every_s:
            self.checkpoint()
            self.last_checkpoint = now

    def checkpoint(self) -> None:
        atomic_save(self.state(), checkpoint_dir(self.cfg.run_dir) / f"{self.ROLE}.pt")

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if hasattr(self, "batches"):
            self.checkpoint()
