"""Replay: insert Experience, answer SampleRequests, hold the update-to-data ratio.

One loop polls the experience PULL socket (only while the rate limiter admits inserts:
otherwise samplers feel back-pressure at their high-water mark) and the sample ROUTER
socket. Requests that the limiter refuses wait in a queue and are answered, oldest
first, as soon as inserts allow; each learner keeps several requests in flight, which
is the prefetch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from common.envs import env_spec
from common.config import Config
from common.errors import ConfigError
from common.rate_limiter import RateLimiter, RateLimiterConfig
from common.replay_buffer import ReplayBuffer, ReplayInputError
from common.service import Service
from common.transport import Channel
from proto.messages import Error, Experience, SampledBatch, SampleRequest

log = logging.getLogger(__name__)

METRICS_EVERY = 0.5  # seconds; the supervisor's budget check reads `inserted` from here
POLL_MS = 50  # poll timeout, so shutdown and metrics are never late by more than this
DRAIN_MAX = 64  # messages taken per socket per wake-up


def samples_per_update(cfg: Config) -> float:
    """Batches sampled per critic update: the fused learner reuses one batch for both
    parts; split learners sample separately, the TD3 actor once per policy_delay."""
    if cfg.learner.mode == "fused":
        return 1.0
    return 1.0 + (1.0 / cfg.td3.policy_delay if cfg.algo == "td3" else 1.0)


def limiter_config(cfg: Config) -> RateLimiterConfig:
    """Update-to-data ratio (critic updates per env step) -> sampled transitions per insert."""
    rc = cfg.replay
    spi = rc.update_to_data * cfg.learner.batch_size * samples_per_update(cfg)
    # slack in sampled transitions: a fraction of the warm-up's worth of updates, and never
    # less than every learner's in-flight requests, so neither side can deadlock
    lc = cfg.learner
    floor = 4 * lc.batch_size * lc.batches_per_request * (lc.prefetch + 1)
    error_buffer = max(rc.tolerance * rc.min_size * spi, floor, spi * 2)
    return RateLimiterConfig(samples_per_insert=spi, min_size_to_sample=max(rc.min_size, 1),
                             error_buffer=error_buffer)


class Replay(Service):
    ROLE = "replay"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layout, _, _ = env_spec(self.cfg.env)
        self.buffer = ReplayBuffer(self.cfg.replay.capacity, self.layout.obs_dim, self.layout.act_dim,
                                   seed=self.cfg.seed + 17,
                                   reject_non_finite=self.cfg.replay.reject_non_finite)
        self.limiter = RateLimiter(limiter_config(self.cfg))
        self.pending: deque[tuple[bytes, SampleRequest]] = deque()
        self.rejected = 0
        self.stall_s = {"insert": 0.0, "sample": 0.0}

    def counters(self) -> dict[str, Any]:
        return {"size": self.buffer.size, "inserted": self.limiter.inserts}

    def set_param(self, key: str, value: Any) -> None:
        """`batch_size`: the learners' new batch size; the rate limiter's samples per insert follow."""
        if key != "batch_size" or type(value) is not int or not 0 < value <= self.cfg.replay.capacity:
            raise ConfigError(f"replay: cannot set {key}={value!r} "
                              f"(settable: batch_size in 1..{self.cfg.replay.capacity})")
        self.cfg = dataclasses.replace(self.cfg, learner=dataclasses.replace(self.cfg.learner, batch_size=value))
        self.limiter.reconfigure(limiter_config(self.cfg))

    async def serve(self) -> None:
        exp = self.channel("experience", binding=True)
        smp = self.channel("sample", binding=True)
        poller = zmq.asyncio.Poller()
        poller.register(smp.sock, zmq.POLLIN)
        last_metrics = time.monotonic()
        while self.running:
            accepting = self.limiter.can_insert(1) and not self.paused
            if accepting:
                poller.register(exp.sock, zmq.POLLIN)
            t0 = time.monotonic()
            events = dict(await poller.poll(POLL_MS))
            self._account_stalls(time.monotonic() - t0, accepting)
            if accepting:
                poller.unregister(exp.sock)
            if smp.sock in events:
                self.take_requests(smp)
            if exp.sock in events:
                self.take_experience(exp)
            await self.answer(smp)
            await asyncio.sleep(0)  # ready sockets never yield: let heartbeats and control run
            if time.monotonic() - last_metrics >= METRICS_EVERY:
                self.report()
                last_metrics = time.monotonic()

    def _account_stalls(self, waited: float, accepting: bool) -> None:
        if not accepting:
            self.stall_s["insert"] += waited
        if self.pending:
            self.stall_s["sample"] += waited

    def take_requests(self, smp: Channel) -> None:
        for _ in range(DRAIN_MAX):
            try:
                got = smp.recv_nowait()
            except zmq.Again:
                return
            if got is not None and isinstance(got[1], SampleRequest):
                self.pending.append((got[0], got[1]))  # type: ignore[arg-type]

    def take_experience(self, exp: Channel) -> None:
        for _ in range(DRAIN_MAX):
            if not self.limiter.can_insert(1):
                return
            try:
                got = exp.recv_nowait()
            except zmq.Again:
                return
            if got is not None and isinstance(got[1], Experience):
                self.insert(got[1], exp.last_sender)

    def insert(self, msg: Experience, sender: str) -> None:
        if (msg.obs_dim, msg.act_dim) != (self.layout.obs_dim, self.layout.act_dim):
            self.reject(msg, sender, f"obs_dim={msg.obs_dim}, act_dim={msg.act_dim} but replay holds "
                             f"{self.layout.obs_dim}, {self.layout.act_dim} ({self.cfg.env})")
            return
        try:
            self.buffer.add_rows(msg.transitions)
        except ReplayInputError as exc:
            self.reject(msg, sender, str(exc))
            return
        self.limiter.insert(len(msg.transitions))

    def reject(self, msg: Experience, sender: str, why: str) -> None:
        self.rejected += len(msg.transitions)
        log.warning("rejected %d transitions from %s: %s", len(msg.transitions), sender, why)

    async def answer(self, smp: Channel) -> None:
        while self.pending:
            peer, req = self.pending[0]
            if req.batch_size <= 0 or req.batch_size > self.cfg.replay.capacity:
                self.pending.popleft()
                await smp.send(Error("bad_request", f"batch_size={req.batch_size} is out of range",
                                     req.TYPE, req.request_id), to=peer)
                continue
            if not self.limiter.can_sample(req.batch_size) or self.buffer.size == 0:
                return
            self.pending.popleft()
            # a fresh matrix per answer: zero-copy sends may still read the previous one
            rows = self.buffer.sample_packed(req.batch_size, out=np.empty((req.batch_size, self.layout.width),
                                                                          np.float32))
            self.limiter.sample(req.batch_size)
            await smp.send(SampledBatch(req.request_id, rows, self.layout.obs_dim, self.layout.act_dim,
                                        self.buffer.size, self.limiter.inserts), to=peer)

    def report(self) -> None:
        self.publish({
            "replay_size": self.buffer.size, "inserted": self.limiter.inserts,
            "sampled": self.limiter.samples, "evicted": self.buffer.evicted,
            "rejected": self.rejected, "insert_stall_s": self.stall_s["insert"],
            "sample_stall_s": self.stall_s["sample"], "pending_requests": len(self.pending),
        })

