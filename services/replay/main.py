"""Replay: insert Experience, answer SampleRequests, hold the update-to-data ratio, persist.

One loop polls the experience ROUTER socket (only while the rate limiter admits inserts:
otherwise samplers run out of credit, since acks stop) and the sample ROUTER socket.
Every Experience batch is answered with an ExperienceAck once stored (or rejected, or
recognised as a re-sent duplicate: see ledger.py). Requests that the limiter refuses
wait in a queue and are answered, oldest first, as soon as inserts allow; each learner
keeps several requests in flight, which is the prefetch.

Bad experience: a batch whose body is refused (SPEC §5 step 9: a row width that disagrees
with obs_dim/act_dim, a `done` other than 0/1) or that does not fit this replay (another
env's dimensions, NaN/inf) gets an `error` naming why and, when its batch number can be
read, a `rejected` ack that uses the number up, so the sampler moves on.

The budget: experience is read only while fewer than `total_steps` transitions were
inserted, so a run stops within the batches its samplers have in flight (their ack
window) of its budget; the count is published the moment it is reached.

End of a run: the supervisor sends `set drain true` right after it stops the samplers; from
then on every batch is stored, rate limiter and budget notwithstanding (no learner samples any more), and
close() takes whatever is still queued before the final snapshot. Warm-up steps are
granted to sampler sessions in the acks (ledger.py), so the run takes exactly
`sampler.warmup_steps` random steps in all.

Persistence (snapshot.py): at start the newest complete snapshot in RUN_DIR/replay is
restored; every replay.snapshot_every_s a new one is written in chunks between polls,
and a last one on shutdown. After each snapshot the samplers hear which of their
batches are durable, and may forget them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from spreeze.common.envs import env_spec
from spreeze.common.config import RUNTIME_LEARNER_KEYS, Config, with_learner_setting
from spreeze.common.errors import ConfigError
from spreeze.common.rate_limiter import RateLimiter, RateLimiterConfig
from spreeze.common.replay_buffer import ReplayBuffer, ReplayInputError
from spreeze.common.running_stats import RunningStats
from spreeze.common.service import Service
from spreeze.common.transport import Channel
from spreeze.proto.codec import Envelope
from spreeze.proto.errors import ProtocolError
from spreeze.proto.messages import Error, Experience, ExperienceAck, SampledBatch, SampleRequest
from spreeze.services.replay.ledger import WARMUP_LEASE, Ledger, Session
from spreeze.services.replay.snapshot import SnapshotWriter, load_latest

log = logging.getLogger(__name__)

METRICS_EVERY = 0.5  # seconds; the supervisor's budget check reads `inserted` from here
POLL_MS = 50  # poll timeout, so shutdown and metrics are never late by more than this
DRAIN_MAX = 64  # messages taken per socket per wake-up


def limiter_config(cfg: Config) -> RateLimiterConfig:
    """Update-to-data ratio (critic updates per env step) -> sampled transitions per insert."""
    rc = cfg.replay
    spi = rc.update_to_data * cfg.learner.batch_size * cfg.algorithm.samples_per_update(
        cfg.algo_config, fused=cfg.learner.mode == "fused")
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
        self.layout, _, _ = env_spec(self.cfg.env_source)
        self.buffer = ReplayBuffer(self.cfg.replay.capacity, self.layout.obs_dim, self.layout.act_dim,
                                   seed=self.cfg.seed + 17,
                                   reject_non_finite=self.cfg.replay.reject_non_finite)
        self.limiter = RateLimiter(limiter_config(self.cfg))
        self.ledger = Ledger(self.cfg.replay.capacity)
        self.obs_stats = RunningStats(self.layout.obs_dim)  # of every observation stored (learner.obs_norm)
        self.pending: deque[tuple[bytes, str, int, SampleRequest]] = deque()  # (peer, sender, header seq, request)
        self.rejected = 0
        self.stall_s = {"insert": 0.0, "sample": 0.0}
        self.snapshot_dir = Path(self.cfg.run_dir) / "replay"
        self.snapshots: SnapshotWriter | None = None
        self.snap_stats = {"snapshots": 0, "snapshot_s": 0.0, "snapshot_copy_max_s": 0.0, "restored_rows": 0}
        self.exp: Channel | None = None
        self.ready = False  # restored (or found nothing to restore) and serving
        self.draining = False  # the run is ending: store every batch, rate limiter notwithstanding
        self.last_snapshot = time.monotonic()

    def counters(self) -> dict[str, Any]:
        return {"size": self.buffer.size, "inserted": self.limiter.inserts}

    def set_param(self, key: str, value: Any) -> None:
        """`batch_size`, `batches_per_request`: the learners' new values; the rate limiter's samples
        per insert and its slack follow.
        `drain` (true): the run is ending; store every batch from now on, limiter notwithstanding."""
        if key == "drain":
            if value is not True:
                raise ConfigError(f"replay: drain={value!r} must be true")
            self.draining = True
            log.info("draining: every experience batch is stored from now on, rate limiter notwithstanding")
            return
        if key not in RUNTIME_LEARNER_KEYS:
            settable = ", ".join(RUNTIME_LEARNER_KEYS)
            raise ConfigError(f"replay: cannot set {key}={value!r} (settable: {settable}, drain)")
        self.cfg = with_learner_setting(self.cfg, key, value, self.ROLE)
        self.limiter.reconfigure(limiter_config(self.cfg))


    # ------------------------------------------------------------ persistence
    def restore(self) -> bool:
        """Load the newest complete snapshot of RUN_DIR/replay, if any (exact: rows, counters, RNG)."""
        meta = load_latest(self.snapshot_dir, self.buffer, self.ledger.owner)
        if meta is None:
            return False
        self.limiter.load_state_dict(meta["limiter"])
        self.ledger.load(meta["ledger"])
        for session in self.ledger.sessions.values():
            session.durable = session.stored  # all of it is in the snapshot just read
        self.rejected = int(meta["rejected"])
        if "obs_stats" in meta:
            self.obs_stats.load(meta["obs_stats"])
        else:  # a snapshot written before replay kept them: the rows it holds
            for view in self.buffer.row_views(self.buffer.inserted - self.buffer.size, self.buffer.inserted):
                self.obs_stats.add(view[:, :self.layout.obs_dim])
        self.snap_stats["restored_rows"] = self.buffer.size
        if self.snapshots is not None:
            self.snapshots.last = meta
        log.info("restored replay snapshot %d: %d transitions, %d inserted", meta["k"], self.buffer.size,
                 self.limiter.inserts)
        return True

    def snapshot_meta(self) -> dict[str, Any]:
        return {"buffer": self.buffer.counters(), "rng": self.buffer.rng_state(),
                "limiter": self.limiter.state_dict(), "ledger": self.ledger.state(), "rejected": self.rejected,
                "obs_stats": self.obs_stats.state()}

    def snapshot_work(self, now: float) -> None:
        """Between polls: start a snapshot when due, copy one chunk, announce a finished one."""
        snaps = self.snapshots
        if snaps is None:
            return
        t0 = time.perf_counter()
        if snaps.pending is None and now - self.last_snapshot >= self.cfg.replay.snapshot_every_s:
            snaps.begin(self.buffer, self.snapshot_meta())
            self.last_snapshot = now
        snaps.step(self.buffer, self.ledger.owner)
        self._copy_time(time.perf_counter() - t0)
        meta = snaps.finished()
        if meta is not None:
            self.snapshot_done(meta)

    def _copy_time(self, seconds: float) -> None:
        self.snap_stats["snapshot_copy_max_s"] = max(self.snap_stats["snapshot_copy_max_s"], seconds)

    def snapshot_done(self, meta: dict[str, Any]) -> None:
        """Tell every sampler session which of its batches are now durable."""
        assert self.snapshots is not None
        self.snap_stats["snapshots"] += 1
        self.snap_stats["snapshot_s"] = self.snapshots.took_s
        for sender, sess, stored, *_ in meta["ledger"]["sessions"]:
            session = self.ledger.sessions.get((sender, sess))
            if session is not None and stored > session.durable:
                session.durable = stored
                self.ack(session, 0, "snapshot")

    async def close(self) -> None:
        """Store what is still queued, then the final snapshot (samplers were stopped first, so it
        holds everything they made), then the final metrics with the ledger."""
        if self.exp is not None:
            self.draining = True
            for _ in range(1000):  # bounded: a peer that keeps sending must not keep replay alive
                if self.take_experience(self.exp) < DRAIN_MAX:
                    break
        await self.final_snapshot()
        self.report()

    async def final_snapshot(self) -> None:
        snaps = self.snapshots
        if snaps is None or not self.ready:  # stopped while restoring: the ring is not whole yet
            return
        if snaps.pending is None:
            snaps.begin(self.buffer, self.snapshot_meta())
        meta = await asyncio.to_thread(snaps.write_all, self.buffer, self.ledger.owner)
        if meta is not None and snaps.pending is None and meta["rows"] < self.buffer.inserted:
            snaps.begin(self.buffer, self.snapshot_meta())  # the one that was running was older
            meta = await asyncio.to_thread(snaps.write_all, self.buffer, self.ledger.owner)
        if meta is not None:
            self.snapshot_done(meta)
            log.info("final replay snapshot %d: %d transitions", meta["k"], meta["size"])

    # ------------------------------------------------------------ main loop
    async def serve(self) -> None:
        if self.cfg.replay.snapshot_every_s > 0:
            self.snapshots = SnapshotWriter(self.snapshot_dir, self.disk)
        await asyncio.to_thread(self.restore)  # heartbeats go on while a large ring loads
        self.ready = True
        self.last_snapshot = time.monotonic()
        exp = self.exp = self.channel("experience", binding=True)
        exp.on_refused = self.refused
        smp = self.channel("sample", binding=True)
        poller = zmq.asyncio.Poller()
        poller.register(smp.sock, zmq.POLLIN)
        last_metrics = time.monotonic()
        while self.running:
            accepting = self.admits() and not self.paused
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
            self.snapshot_work(time.monotonic())
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
                self.pending.append((got[0], smp.last_sender, smp.last_seq, got[1]))  # type: ignore[arg-type]

    def admits(self) -> bool:
        """Whether experience is read now: while draining always; else while the rate limiter
        admits and the run's budget (total_steps) is not used up. Held back, samplers run
        out of credit and stop stepping; at the end, drain stores what they already sent."""
        return self.draining or (self.limiter.can_insert(1) and self.limiter.inserts < self.cfg.total_steps)

    def take_experience(self, exp: Channel) -> int:
        """Read up to DRAIN_MAX queued messages (while `admits()`); how many."""
        for taken in range(DRAIN_MAX):
            if not self.admits():
                return taken
            try:
                got = exp.recv_nowait()
            except zmq.Again:
                return taken
            if got is not None and isinstance(got[1], Experience):
                self.receive(got[1], exp.last_sender, exp.last_session, got[0], exp.last_seq)  # type: ignore[arg-type]
        return DRAIN_MAX

    def receive(self, msg: Experience, sender: str, session: str, peer: bytes, seq: int = -1) -> str:
        """Store a batch unless it is a re-sent duplicate or out of order; ack it either way."""
        s = self.ledger.session(sender, session, peer)
        status = self.order(s, sender, msg.batch, len(msg.transitions))
        if status == "next":
            why = self.insert(msg, sender)
            status = "stored" if why is None else "rejected"
            if why is not None and self.exp is not None and peer:
                self.exp.count_error("rejected", sender, why)
                self.exp.reply_error(peer, Error("rejected", why[:500], Experience.TYPE, seq))
            s.stored, s.env_steps = msg.batch or s.stored, msg.env_steps
            self.ledger.took_random(sender, s, msg.random_rows)
        self.ack(s, msg.batch, status, len(msg.transitions))
        return status

    def order(self, s: Session, sender: str, batch: int, rows: int) -> str:
        """`duplicate`, `gap`, or `next` (this batch is the one to store) for a batch of a session."""
        if batch and batch <= s.stored:
            self.ledger.duplicate(sender, rows)
            return "duplicate"  # a re-send after a restart or a timeout: stored already
        if batch > s.stored + 1:
            return "gap"  # an earlier batch was lost with a dead connection: the sampler goes back
        return "next"

    def refused(self, peer: bytes | None, env: Envelope, exc: ProtocolError) -> None:
        """An experience batch whose body was refused (the `error` reply is sent): a `rejected`
        ack uses its number up, so that the sampler moves on (SPEC §4.1a, §5)."""
        batch = env.body.get("batch", 0)
        if env.type != Experience.TYPE or not peer or type(batch) is not int or batch < 0:
            return  # no batch number to answer: the error reply is all
        arr = env.arrays.get("transitions")
        rows = int(arr.shape[0]) if arr is not None and arr.ndim else 0
        s = self.ledger.session(env.sender, env.session, peer)
        status = self.order(s, env.sender, batch, rows)
        if status == "next":
            status = "rejected"
            self.rejected += rows
            self.ledger.rejected(env.sender, rows)
            s.stored = batch or s.stored
            if type(env.body.get("env_steps")) is int:
                s.env_steps = env.body["env_steps"]
        self.ack(s, batch, status)

    def ack(self, s: Session, batch: int, status: str, rows: int = 0) -> None:
        if self.exp is None or not s.peer:
            return
        durable = s.durable if self.snapshots is not None else s.stored  # no snapshots: nothing more to wait for
        lease = max(WARMUP_LEASE, (self.cfg.sampler.ack_window + 1) * rows)  # a window of this sampler's batches
        warmup = s.granted if status == "snapshot" else self.ledger.grant(s, self.cfg.sampler.warmup_steps, lease)
        self.exp.send_nowait(ExperienceAck(batch, status, s.stored, durable, warmup), to=s.peer)  # gone peer: dropped

    def insert(self, msg: Experience, sender: str) -> str | None:
        """Store a batch's rows (None), or reject the whole batch (why, in words naming the value)."""
        n = len(msg.transitions)
        if (msg.obs_dim, msg.act_dim) != (self.layout.obs_dim, self.layout.act_dim):
            return self.reject(msg, sender, f"obs_dim={msg.obs_dim}, act_dim={msg.act_dim} but replay holds "
                                    f"{self.layout.obs_dim}, {self.layout.act_dim} ({self.cfg.env})")
        if self.snapshots is not None:
            t0 = time.perf_counter()
            self.snapshots.before_insert(self.buffer, self.ledger.owner, n)
            self._copy_time(time.perf_counter() - t0)
        first, size = self.buffer.inserted, self.buffer.size
        try:
            self.buffer.add_rows(msg.transitions)
        except ReplayInputError as exc:
            return self.reject(msg, sender, str(exc))
        self.obs_stats.add(msg.transitions[:, :self.layout.obs_dim])
        self.ledger.stored(sender, first, n, size)
        if n:
            before = self.limiter.inserts
            (self.limiter.force_insert if self.draining else self.limiter.insert)(n)
            if before < self.cfg.total_steps <= self.limiter.inserts:
                self.report()  # the supervisor stops the run on this count: tell it now, not in METRICS_EVERY
        return None

    def reject(self, msg: Experience, sender: str, why: str) -> str:
        self.rejected += len(msg.transitions)
        self.ledger.rejected(sender, len(msg.transitions))
        if self.exp is None:  # no socket to count it on (direct calls)
            log.warning("rejected %d transitions from %s: %s", len(msg.transitions), sender, why)
        return why

    async def answer(self, smp: Channel) -> None:
        while self.pending:
            peer, sender, seq, req = self.pending[0]
            if req.batch_size <= 0 or req.batch_size > self.cfg.replay.capacity:
                self.pending.popleft()
                why = f"batch_size={req.batch_size} is out of range 1..{self.cfg.replay.capacity}"
                smp.count_error("bad_request", sender, why)
                await smp.send(Error("bad_request", why, req.TYPE, seq), to=peer)
                continue
            if not self.limiter.can_sample(req.batch_size) or self.buffer.size == 0:
                return
            self.pending.popleft()
            # a fresh matrix per answer: zero-copy sends may still read the previous one
            rows = self.buffer.sample_packed(req.batch_size, out=np.empty((req.batch_size, self.layout.width),
                                                                          np.float32))
            self.limiter.sample(req.batch_size)
            answer = SampledBatch(req.request_id, rows, self.layout.obs_dim, self.layout.act_dim,
                                  self.buffer.size, self.limiter.inserts)
            if req.obs_stats:
                stats = self.obs_stats
                answer.obs_count = stats.count
                answer.obs_stats = {"mean": stats.mean.astype(np.float32), "var": stats.var.astype(np.float32)}
            await smp.send(answer, to=peer)

    def report(self) -> None:
        self.publish({
            "replay_size": self.buffer.size, "inserted": self.limiter.inserts,
            "sampled": self.limiter.samples, "evicted": self.buffer.evicted,
            "rejected": self.rejected, "insert_stall_s": self.stall_s["insert"],
            "sample_stall_s": self.stall_s["sample"], "pending_requests": len(self.pending),
            "duplicates": sum(b["duplicates"] for b in self.ledger.books.values()),
            "random_steps": sum(b["random"] for b in self.ledger.books.values()),
            "warmup_granted": self.ledger.warmup_granted, "draining": int(self.draining),
            **self.snap_stats, **self.ledger.metrics(),
        })

