"""The parts every learner service shares: model parts, batches, publishing, checkpoints.

A learner checkpoints its full state (networks, optimizers, temperature, noise RNGs,
update counters, weight versions) into checkpoints/<role>.pt every checkpoint_every_s
and on shutdown (SIGTERM included), and restores it at start when it exists: after a
crash the supervisor's restart continues from there, and so does `spreeze train --resume`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import torch
# torch.optim imports torch._dynamo on the first optimizer: seconds on a small, busy machine.
# Import it here, before the service registers, not inside the event loop where it would
# silence the heartbeats long enough for the supervisor to declare the learner dead.
import torch._dynamo  # noqa: F401

from common.algorithms import ActorPart, CriticPart, make_parts
from common.config import with_batch_size
from common.errors import ConfigError
from common.envs import env_spec
from common.learner_io import BatchStream, atomic_save, checkpoint_dir, device_of
from common.service import Service
from common.weights import WeightsPublisher, weights_message

log = logging.getLogger(__name__)

METRICS_EVERY = 1.0  # seconds between metrics messages
LOSS_EVERY = 50  # updates between loss read-outs (each forces a device sync)


class LearnerBase(Service):
    """Subclasses build their parts in `__init__` with `parts(shared)`, restore their
    checkpoint at the start of `serve()`, set `ready`, and run their own update loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        lc = self.cfg.learner
        torch.set_num_threads(lc.threads)
        self.layout, self.action_low, self.action_high = env_spec(self.cfg.env)
        self.device = device_of(self.device_name())
        self.batches = BatchStream(self.channel("sample", binding=False), self.layout, lc.batch_size,
                                   lc.prefetch, self.device, lc.batches_per_request)
        self.last_metrics = self.last_checkpoint = time.monotonic()
        self.metrics_updates = 0
        self.losses: dict[str, float] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        self.ready = False  # restored from the run's checkpoint (if any): only then may close() checkpoint

    def device_name(self) -> str:
        """This learner's torch device (the fused learner and the actor-learner: the actor's)."""
        return self.cfg.learner.actor_device

    def parts(self, shared: bool) -> tuple[ActorPart, CriticPart]:
        """Freshly built actor and critic parts on this learner's device."""
        return make_parts(self.cfg.algo, self.layout.obs_dim, self.layout.act_dim, self.action_low,
                          self.action_high, self.cfg.algo_config, self.device, shared, self.cfg.seed,
                          sparse=self.cfg.sparse, total_updates=self.cfg.total_updates)

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

    def set_param(self, key: str, value: Any) -> None:
        """`batch_size`: requests sent from now on ask for this many transitions."""
        if key != "batch_size":
            raise ConfigError(f"{self.ROLE}: cannot set {key}={value!r} (settable: batch_size)")
        self.cfg = with_batch_size(self.cfg, value, self.ROLE)
        self.batches.batch_size = value

    def tick(self, updates: int, extra: dict[str, Any]) -> None:
        """Metrics about once a second; learner checkpoints every checkpoint_every_s."""
        now = time.monotonic()
        dt = now - self.last_metrics
        if dt >= METRICS_EVERY:
            rate = (updates - self.metrics_updates) / dt
            self.publish({"updates": updates, "update_hz": rate,
                          "update_frame_rate": rate * self.batches.batch_size,
                          "batch_size": self.batches.batch_size,
                          "batch_wait_s": self.batches.wait_s, "env_steps": self.batches.inserted,
                          **self.losses, **extra})
            self.last_metrics, self.metrics_updates = now, updates
        if now - self.last_checkpoint >= self.cfg.learner.checkpoint_every_s:
            self.checkpoint()
            self.last_checkpoint = now

    @property
    def checkpoint_path(self) -> Path:
        return checkpoint_dir(self.cfg.run_dir) / f"{self.ROLE}.pt"

    def checkpoint(self) -> None:
        atomic_save({**self.state(), "torch_rng": torch.get_rng_state()}, self.checkpoint_path)

    def restored(self) -> dict[str, Any] | None:
        """This learner's own checkpoint, if the run has one (restart after a crash, resume)."""
        path = self.checkpoint_path
        if not path.is_file():
            return None
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
        torch.set_rng_state(state["torch_rng"])
        log.info("restoring %s: %d updates, versions %s", path, state["updates"], state.get("versions"))
        return state

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.ready:
            self.checkpoint()
