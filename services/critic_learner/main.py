"""Critic-learner: TD updates of the twin critics against the newest (target) actor copy.

It never runs more than `max_lag` critic updates ahead of the actor it uses (policy lag,
measured in critic updates and published); every `sync_every` updates it sends the
critics to the actor-learner.
"""

from __future__ import annotations

from typing import Any

import zmq

from spreeze.common.config import to_dict
from spreeze.common.weights import WeightsFollower, WeightsPublisher, to_state, weights_message
from spreeze.services.learner.base import LOSS_EVERY, LearnerBase
from spreeze.proto.messages import Weights

WAIT_MS = 20  # poll granularity while waiting for actor weights


class CriticLearner(LearnerBase):
    ROLE = "critic_learner"
    PARTS = ("critic",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _, self.critic = self.parts(shared=False)
        self.actor_seen = 0  # critic-update count at which the newest actor copy was made

    def device_name(self) -> str:
        return self.cfg.learner.critic_device

    def counters(self) -> dict[str, Any]:
        return {"updates": self.critic.updates}

    async def serve(self) -> None:
        lc = self.cfg.learner
        if (saved := self.restored()) is not None:
            self.critic.load(saved["critic"])  # with its (target) actor copy
            self.actor_seen = int(saved.get("versions", {}).get("actor_seen", 0))
        self.ready = True
        to_actor = self.publisher("critic_sync")
        actors = WeightsFollower(self.channel("weights", binding=False, name="actor_sync"))
        latest: dict[str, Weights] = {}
        self.send_sync(to_actor)
        self.start_compile()
        while self.running:
            newest = actors.poll()
            if newest:
                latest.update(newest)
                self.take_actor(latest)
            if self.critic.updates - self.actor_seen > lc.max_lag:
                await actors.channel.sock.poll(WAIT_MS, zmq.POLLIN)
                continue
            self.swap_compiled()  # before the batch: it has the size the steps are compiled for
            batch = await self.batches.next(self.stopping)
            if batch is None:
                break
            want = self.critic.updates % LOSS_EVERY == 0
            metrics = self.critic.update(batch, want_metrics=want)
            if want:
                self.losses = metrics
            if self.critic.updates % lc.sync_every == 0:
                self.send_sync(to_actor)
            lag = self.critic.updates - self.actor_seen
            self.tick(self.critic.updates, {"policy_lag": lag})

    def take_actor(self, latest: dict[str, Weights]) -> None:
        if any(net not in latest for net in self.cfg.algorithm.actor_nets):
            return  # a pair (TD3: actor and target actor) arrives as two messages: wait for both
        actor, target = latest["actor"], latest.get("actor_target")
        self.critic.load_actor(to_state(actor), to_state(target) if target else None, actor.extras)
        self.actor_seen = actor.updates

    def send_sync(self, pub: WeightsPublisher) -> None:
        """The critics to the actor-learner (masked weights sparse where that is smaller)."""
        sparse = self.critic.sparse.names if self.critic.sparse is not None else None
        pub.publish(weights_message("critic", self.critic.updates, self.critic.updates,
                                    self.critic.critic_state(), sparse))

    def state(self) -> dict[str, Any]:
        return {"critic": self.critic.save(), "updates": self.critic.updates,
                "versions": {"critic": self.critic.updates, "actor_seen": self.actor_seen},
                "env_steps": self.batches.inserted, "config": to_dict(self.cfg)}
