"""Fused learner: actor and critics in one process sharing modules (standard TD3/SAC).

The swap for hosts with one device, and the correctness reference for the split pair.
"""

from __future__ import annotations

import math
import time
from typing import Any

from spreeze.common.algorithms.base import fused_step
from spreeze.common.config import to_dict
from spreeze.services.learner.base import LOSS_EVERY, LearnerBase


class Learner(LearnerBase):
    ROLE = "learner"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor, self.critic = self.parts(shared=True)
        self.updates = 0

    def counters(self) -> dict[str, Any]:
        return {"updates": self.updates}

    async def serve(self) -> None:
        pub = self.publisher("actor_weights")
        if (saved := self.restored()) is not None:
            self.actor.load(saved["actor"])
            self.critic.load(saved["critic"])
            self.updates = int(saved["updates"])
        self.ready = True
        self.publish_actor(pub, self.actor)
        self.start_compile()
        last_publish = time.monotonic()
        interval = self.cfg.learner.publish_interval
        while self.running:
            self.swap_compiled()  # before the batch: it has the size the steps are compiled for
            batch = await self.batches.next(self.stopping)
            if batch is None:
                break
            want = self.read_out_due()
            metrics = fused_step(self.actor, self.critic, batch, want_metrics=want)
            self.updates += 1
            if want:
                self.losses = metrics
            if time.monotonic() - last_publish >= interval:
                self.publish_actor(pub, self.actor)
                last_publish = time.monotonic()
            self.tick(self.updates, {"policy_lag": 0})
        self.publish_actor(pub, self.actor)

    def read_out_due(self) -> bool:
        """Losses on the first update, then every LOSS_EVERY or so on an update that also
        trains the actor (TD3: every policy_delay), so actor losses and sparsity are reported."""
        n = self.critic.updates + 1  # number of the coming critic update
        return n == 1 or n % math.lcm(LOSS_EVERY, self.actor.policy_delay) == 0

    def state(self) -> dict[str, Any]:
        return {"actor": self.actor.save(), "critic": self.critic.save(), "updates": self.updates,
                "versions": {"actor": self.actor.updates}, "env_steps": self.batches.inserted,
                "config": to_dict(self.cfg)}
