"""The sampler's side of acknowledged experience (proto/SPEC.md §6, "Acknowledged experience").

Each batch gets the next batch number of this session and is kept until replay reports
it durable (inside a complete snapshot). Credit: at most `window` batches may be in
flight beyond replay's `stored` watermark; replay stops acking while its rate limiter
refuses inserts, so the sampler waits instead of queueing stale data. When replay
restarted (the socket reconnected), reports a gap, or acks made no progress for
`timeout` seconds, the kept batches go out again, oldest first, through the same
window, skipping whatever replay's acks say it already stored; replay drops any
duplicate that still arrives.

Kept batches are bounded: beyond `max_kept_bytes` (replay's snapshots not advancing, e.g.
on a full disk) the oldest batches that replay has stored are let go. They stay in replay's
memory; only a replay crash before its next snapshot would lose them (`dropped_rows` says
how many rows that concerns). Batches replay has not stored are never let go.
"""

from __future__ import annotations

import time
from collections import deque

from spreeze.proto.messages import Experience, ExperienceAck

MAX_KEPT_BYTES = 64 * 2**20  # transitions kept for a re-send; minutes of experience at usual rates


class Outbox:
    def __init__(self, window: int, timeout: float, max_kept_bytes: int = MAX_KEPT_BYTES) -> None:
        self.window, self.timeout, self.max_kept_bytes = window, timeout, max_kept_bytes
        self.sent = 0  # batch number of the newest batch (batches are numbered from 1)
        self.sent_env_steps = 0  # the env_steps count the newest batch carried
        self.stored = 0  # replay's newest report: batches <= stored are stored
        self.durable = 0  # batches <= durable are in a snapshot: forgotten here
        self.kept: deque[Experience] = deque()  # numbered and not yet durable, oldest first
        self.kept_bytes = 0  # of their transitions
        self.dropped_rows = 0  # stored but not durable rows let go over max_kept_bytes
        self.resend_from = 0  # next kept batch to send again (0: no re-send in progress)
        self.resent_upto = 0  # a gap report about a batch <= this predates our last re-send
        self.progress_at = time.monotonic()  # last time acks advanced (or a re-send started)
        self.resends = 0  # batches sent again
        self.warmup = 0  # random env steps replay granted this session in all (acks' `warmup`)

    @property
    def front(self) -> int:
        """The newest batch handed out in the current pass (new batches or a re-send)."""
        return self.resend_from - 1 if self.resend_from else self.sent

    @property
    def unstored(self) -> int:
        return self.sent - self.stored

    def unstored_rows(self) -> int:
        """Rows (env steps) of the batches sent that replay has not reported stored."""
        return sum(len(m.transitions) for m in self.kept if m.batch > self.stored)

    def has_credit(self) -> bool:
        return self.front - self.stored < self.window

    def add(self, msg: Experience) -> Experience:
        """Number a new batch and keep it; the caller sends it."""
        if self.sent == self.stored:
            self.progress_at = time.monotonic()  # the ack clock starts with the first unacked batch
        self.sent += 1
        self.sent_env_steps = msg.env_steps
        msg.batch = self.sent
        self.kept.append(msg)
        self.kept_bytes += msg.transitions.nbytes
        while self.kept_bytes > self.max_kept_bytes and self.kept[0].batch <= self.stored:
            self.dropped_rows += len(self.kept[0].transitions)
            self.forget_oldest()
        return msg

    def forget_oldest(self) -> None:
        self.kept_bytes -= self.kept.popleft().transitions.nbytes

    def next_resend(self) -> Experience | None:
        """The next kept batch of a re-send in progress, or None (then send new batches)."""
        if not self.resend_from or not self.kept:
            self.resend_from = 0
            return None
        i = max(0, self.resend_from - self.kept[0].batch)  # kept batches are numbered consecutively
        if i >= len(self.kept):
            self.resend_from = 0
            return None
        msg = self.kept[i]
        self.resend_from = msg.batch + 1
        self.resends += 1
        return msg

    def on_ack(self, ack: ExperienceAck) -> None:
        """Take an ack; a gap report starts a re-send from the first batch replay lacks."""
        if ack.stored != self.stored:  # a restarted replay may report less than its predecessor
            self.progress_at = time.monotonic()
        self.stored = ack.stored
        self.warmup = max(self.warmup, ack.warmup)
        if self.resend_from and ack.stored >= self.resend_from:
            self.resend_from = ack.stored + 1  # replay has these already: skip them
        if ack.durable > self.durable:
            self.durable = ack.durable
            while self.kept and self.kept[0].batch <= self.durable:
                self.forget_oldest()
        if ack.status == "gap" and ack.batch > self.resent_upto:
            self.resend(ack.stored + 1)

    def timed_out(self, now: float) -> bool:
        return self.unstored > 0 and now - self.progress_at > self.timeout

    def resend(self, start: int = 0) -> None:
        """Send the kept batches again from `start` (default: the oldest kept), oldest first."""
        if not self.kept:
            return
        self.resend_from = max(start, self.kept[0].batch)
        # until replay answers, assume it has nothing from here on: a window at a time goes out,
        # and the first acks tell how far to skip (a restarted replay has up to its snapshot)
        self.stored = min(self.stored, self.resend_from - 1)
        self.resent_upto = self.sent
        self.progress_at = time.monotonic()
