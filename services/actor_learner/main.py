"""Actor-learner: policy (and temperature) updates against the newest critic copy.

Pacing: the actor does update number a+1 only once the critic-learner reports at least
(a+1) x policy_delay critic updates, which is TD3's delayed policy update across
processes (SAC: delay 1). Every `sync_every` actor updates it sends the actor (and TD3's
target actor) to the critic-learner; every `publish_interval` seconds to samplers.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from spreeze.common.config import to_dict
from spreeze.common.weights import WeightsFollower, WeightsPublisher, to_state
from spreeze.services.learner.base import LOSS_EVERY, LearnerBase

WAIT_MS = 20  # poll granularity while waiting for critic weights


class ActorLearner(LearnerBase):
    ROLE = "actor_learner"
    PARTS = ("actor",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor, _ = self.parts(shared=False)
        self.critic_updates = 0  # critic updates of the newest critic copy

    def counters(self) -> dict[str, Any]:
        return {"updates": self.actor.updates}

    async def serve(self) -> None:
        lc = self.cfg.learner
        if (saved := self.restored()) is not None:
            self.actor.load(saved["actor"])
        self.ready = True
        to_samplers, to_critic = self.publisher("actor_weights"), self.publisher("actor_sync")
        critics = WeightsFollower(self.channel("weights", binding=False, name="critic_sync"))
        self.send_sync(to_critic)
        self.publish_actor(to_samplers, self.actor)
        self.start_compile()
        last_publish = time.monotonic()
        while self.running:
            newest = critics.poll().get("critic")
            if newest is not None:
                self.actor.load_critic(to_state(newest))
                self.critic_updates = newest.updates
            if self.critic_updates < (self.actor.updates + 1) * self.actor.policy_delay:
                await critics.channel.sock.poll(WAIT_MS, zmq.POLLIN)
                continue
            self.swap_compiled()  # before the batch: it has the size the steps are compiled for
            batch = await self.batches.next(self.stopping)
            if batch is None:
                break
            want = self.actor.updates % LOSS_EVERY == 0
            metrics = self.actor.update(batch, want_metrics=want)
            if want:
                self.losses = metrics
            if self.actor.updates % lc.sync_every == 0:
                self.send_sync(to_critic)
            if time.monotonic() - last_publish >= lc.publish_interval:
                self.publish_actor(to_samplers, self.actor)
                last_publish = time.monotonic()
            lag = self.actor.updates * self.actor.policy_delay - self.critic_updates
            self.tick(self.actor.updates, {"critic_lag": lag, "critic_updates_seen": self.critic_updates})
        self.publish_actor(to_samplers, self.actor)

    def send_sync(self, pub: WeightsPublisher) -> None:
        """The actor networks the critic part needs (TD3: the actor and its target)."""
        for net in self.cfg.algorithm.actor_nets:
            self.publish_actor(pub, self.actor, net)

    def state(self) -> dict[str, Any]:
        return {"actor": self.actor.save(), "updates": self.actor.updates,
                "versions": {"actor": self.actor.updates, "critic_seen": self.critic_updates},
                "env_steps": self.batches.inserted, "config": to_dict(self.cfg)}
