"""Sampler: act with the newest actor (random during warm-up), send batches of transitions.

Warm-up is the run's, not this process's: replay grants random env steps in its acks
(`warmup`, cumulative per session), and the sampler acts uniformly at random exactly while
it holds unused ones, env by env; otherwise it acts with the actor, or waits for one. So
that the first grant comes at once, each session opens with an empty batch (n = 0).

Loop: take replay's acks; re-send unacknowledged batches if replay restarted; take the
newest actor weights if any arrived; if the ack window has credit, step E envs
`steps_per_push` times writing rows into a fresh matrix and send it, else wait for an
ack (back-pressure, nothing dropped: see outbox.py); publish metrics about once a second.
On shutdown it waits (briefly) until replay has stored what was sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
import zmq

from spreeze.common.envs import EnvBatch
from spreeze.common.errors import ConfigError
from spreeze.common.numpy_policy import NumpyActor
from spreeze.common.service import Service
from spreeze.common.transport import Channel
from spreeze.common.weights import WeightsFollower, to_state
from spreeze.proto.messages import Experience, ExperienceAck, Weights
from spreeze.services.sampler.outbox import Outbox

log = logging.getLogger(__name__)

METRICS_EVERY = 1.0  # seconds between metrics messages
ACK_WAIT_MS = 50  # poll granularity while out of credit
FLUSH_TIMEOUT = 5.0  # seconds to wait on shutdown for replay to store the last batches


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
        self.envs = EnvBatch(self.cfg.env_source, sc.envs_per_sampler, int(seq.generate_state(1)[0] % (1 << 30)))
        self.layout = self.envs.layout
        self.actor: NumpyActor | None = None
        self.policy: dict[str, Any] = {}  # the acting-policy description self.actor runs
        self.actor_version = -1
        self.random_steps = 0  # env steps of this session acted at random (replay granted outbox.warmup)
        self.left_unstored = 0  # env steps left unstored at exit (in the last heartbeat, for the ledger)
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.pushed = 0
        self.steps_per_push = sc.steps_per_push
        self.outbox = Outbox(sc.ack_window, sc.ack_timeout)
        self.said_dropped = False  # kept_batches_dropped is said once
        self.push: Channel | None = None

    def counters(self) -> dict[str, Any]:
        return {"env_steps": self.envs.steps, "actor_version": self.actor_version, "random_steps": self.random_steps,
                "left_unstored": self.left_unstored}

    def set_param(self, key: str, value: Any) -> None:
        if key not in ("steps_per_push", "envs_per_sampler") or type(value) is not int or value <= 0:
            raise ConfigError(f"sampler: cannot set {key}={value!r} "
                              "(settable: steps_per_push > 0, envs_per_sampler > 0)")
        if key == "steps_per_push":
            self.steps_per_push = value
        elif value != len(self.envs):
            self.resize(value)

    def resize(self, n: int) -> None:
        """Step n envs from now on: a new batch of fresh episodes (the old ones' unfinished
        episodes end unreported); the step count goes on."""
        steps = self.envs.steps
        self.envs.close()
        self.envs = EnvBatch(self.cfg.env_source, n, int(self.rng.integers(1 << 30)))
        self.envs.steps = steps

    async def serve(self) -> None:
        push = self.push = self.channel("experience", binding=False)
        push.watch_connects()
        follower = WeightsFollower(self.channel("weights", binding=False, name="actor_weights"))
        last_metrics, last_steps = time.monotonic(), 0
        push.send_nowait(self.outbox.add(self.opening()))  # its ack brings the first warm-up grant
        while self.running:
            self.take_acks(push)
            if self.paused:
                await asyncio.sleep(0.05)
                continue
            newest = follower.poll().get("actor")
            if newest is not None:
                self.take_weights(newest)
            resend = self.outbox.next_resend() if self.outbox.has_credit() else None
            if resend is not None:
                push.send_nowait(resend)  # a full queue (replay gone): sent again after the reconnect
            elif self.outbox.has_credit() and self.can_act():
                push.send_nowait(self.outbox.add(self.collect()))
                if self.outbox.dropped_rows and not self.said_dropped:
                    self.said_dropped = True
                    self.notify("kept_batches_dropped", f"{self.service_id}: replay's snapshots have not advanced "
                                f"for {self.outbox.max_kept_bytes / 2**20:.0f} MiB of experience; the oldest stored "
                                f"batches are no longer kept for a re-send (a replay crash before its next snapshot "
                                f"would lose them; the ledger then says so)")
            else:  # out of credit, or no actor and no warm-up grant left: wait for an ack or weights
                await push.sock.poll(ACK_WAIT_MS, zmq.POLLIN)
            await asyncio.sleep(0)  # a send that does not block never yields: let heartbeats and control run
            now = time.monotonic()
            if now - last_metrics >= METRICS_EVERY:
                self.report(now - last_metrics, self.envs.steps - last_steps)
                last_metrics, last_steps = now, self.envs.steps

    def take_acks(self, push: Channel) -> None:
        """Read every queued ack; start a re-send when replay restarted or acks stopped moving
        (the outbox starts one itself when replay reports a gap)."""
        restarted = push.reconnected()
        while True:
            try:
                got = push.recv_nowait()
            except zmq.Again:
                break
            if got is not None and isinstance(got[1], ExperienceAck):
                self.outbox.on_ack(got[1])
        if restarted or self.outbox.timed_out(time.monotonic()):
            self.outbox.resend()
            log.info("re-sending from batch %d (%d kept, %d not yet stored)%s", self.outbox.resend_from,
                     len(self.outbox.kept), self.outbox.unstored, ": replay restarted" if restarted else "")

    def take_weights(self, msg: Weights) -> None:
        state = to_state(msg)
        if self.actor is None or msg.policy != self.policy:  # the description, not the algorithm, says how to act
            self.actor = NumpyActor(msg.policy, state, self.envs.low, self.envs.high)
            self.policy = msg.policy
        else:
            self.actor.load(state)
        self.actor_version = msg.version

    @property
    def unused_random(self) -> int:
        """Random env steps replay granted this session and it has not taken yet."""
        return max(self.outbox.warmup - self.random_steps, 0)

    def can_act(self) -> bool:
        """One step of every env is possible: with the actor, or at random within the grant;
        and this sampler alone has not made the run's whole budget (total_steps) yet."""
        within = self.envs.steps < self.cfg.total_steps  # the run stops there; replay caps all samplers together
        return within and (self.actor is not None or self.unused_random >= len(self.envs))

    def opening(self) -> Experience:
        """The empty batch a session starts with (its ack carries the first warm-up grant)."""
        rows = np.empty((0, self.layout.width), np.float32)
        return Experience(rows, self.layout.obs_dim, self.layout.act_dim, self.envs.steps, random_steps=0)

    def collect(self) -> Experience:
        """Step all envs up to steps_per_push times into a new matrix (the last one may still be in
        flight): env i at random while warm-up steps are granted, else with the actor; stops
        early when there is neither."""
        n_env = len(self.envs)
        rows = np.empty((self.steps_per_push * n_env, self.layout.width), np.float32)
        returns, lengths = [], []
        taken = random = 0
        while taken < self.steps_per_push and self.can_act():
            k = min(self.unused_random, n_env)  # this many envs act at random
            if k == n_env:
                actions = self.envs.random_actions(self.rng)
            else:
                actions = self.actor.act(self.envs.obs, self.rng, explore=True)  # type: ignore[union-attr]
                if k:
                    actions[:k] = self.envs.random_actions(self.rng)[:k]
            self.random_steps += k
            random += k
            for ret, length in self.envs.step(actions, rows[taken * n_env:(taken + 1) * n_env]):
                returns.append(ret)
                lengths.append(length)
            taken += 1
        self.returns += returns
        self.lengths += lengths
        self.pushed += 1
        n = taken * n_env
        version = self.actor_version if random < n else -1
        return Experience(rows[:n], self.layout.obs_dim, self.layout.act_dim, self.envs.steps, version,
                          returns, lengths, random_steps=random)

    def report(self, dt: float, steps: int) -> None:
        box = self.outbox
        values: dict[str, Any] = {"env_steps": self.envs.steps, "sampling_hz": steps / dt,
                                  "actor_version": self.actor_version, "envs": len(self.envs), "batches_sent": box.sent,
                                  "batches_stored": box.stored, "batches_kept": len(box.kept),
                                  "kept_bytes": box.kept_bytes, "kept_dropped_rows": box.dropped_rows,
                                  "resent": box.resends, "random_steps": self.random_steps,
                                  "warmup_granted": box.warmup}
        if self.returns:
            values["episode_return"] = float(np.mean(self.returns))
            values["episode_length"] = float(np.mean(self.lengths))
            values["episodes"] = len(self.returns)
            self.returns, self.lengths = [], []
        self.publish(values)

    async def close(self) -> None:
        """Wait (bounded) until replay stored every batch sent, then report the final counts."""
        deadline = time.monotonic() + FLUSH_TIMEOUT
        while self.push is not None and self.outbox.unstored and time.monotonic() < deadline:
            self.take_acks(self.push)
            while self.outbox.has_credit() and (msg := self.outbox.next_resend()) is not None:
                self.push.send_nowait(msg)
            await self.push.sock.poll(ACK_WAIT_MS, zmq.POLLIN)
        # env steps this sampler leaves unstored: sent and not acknowledged (the run's rate limiter held
        # them: replay never accepted them), or never sent. Its last heartbeat says so, for the ledger.
        self.left_unstored = self.outbox.unstored_rows() + self.envs.steps - self.outbox.sent_env_steps
        if self.left_unstored:
            log.warning("leaving %d env steps unstored (%d batches sent were not acknowledged as stored)",
                        self.left_unstored, self.outbox.unstored)
        self.report(1.0, 0)
        self.envs.close()
