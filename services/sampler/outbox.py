"""The sampler's side of acknowledged experience (proto/SPEC.md §6, "Acknowledged experience").

Each batch gets the next batch number of this session and is kept until replay reports
it durable (inside a complete snapshot). Credit: at most `window` batches may be sent
and not yet stored; replay stops acking while its rate limiter refuses inserts, so the
sampler waits instead of queueing stale data. Re-send everything kept when replay
restarted (the socket reconnected), when replay reports a gap, or when acks made no
progress for `timeout` seconds; replay drops what it already has (duplicates).
"""

from __future__ import annotations

import time
from collections import deque

from proto.messages import Experience, ExperienceAck


class Outbox:
    def __init__(self, window: int, timeout: float) -> None:
        self.window, self.timeout = window, timeout
        self.sent = 0  # batch number of the newest batch sent (batches are numbered from 1)
        self.stored = 0  # replay's newest report: batches <= stored are stored
        self.durable = 0  # batches <= durable are in a snapshot: forgotten here
        self.kept: deque[Experience] = deque()  # sent and not yet durable, oldest first
        self.progress_at = time.monotonic()  # last time acks advanced (or a re-send started)
        self.resent_upto = 0  # a gap report about a batch <= this predates our last re-send
        self.resends = 0  # batches sent again

    def has_credit(self) -> bool:
        return self.sent - self.stored < self.window

    @property
    def unstored(self) -> int:
        return self.sent - self.stored

    def add(self, msg: Experience) -> Experience:
        """Number a new batch and keep it; the caller sends it."""
        self.sent += 1
        msg.batch = self.sent
        self.kept.append(msg)
        if self.sent - self.stored == 1:
            self.progress_at = time.monotonic()  # the ack clock starts with the first unacked batch
        return msg

    def on_ack(self, ack: ExperienceAck) -> bool:
        """Take an ack; True when everything kept should be re-sent now (replay saw a gap)."""
        if ack.stored != self.stored:  # a restarted replay may report less than its predecessor
            self.progress_at = time.monotonic()
        self.stored = ack.stored
        if ack.durable > self.durable:
            self.durable = ack.durable
            while self.kept and self.kept[0].batch <= self.durable:
                self.kept.popleft()
        return ack.status == "gap" and ack.batch > self.resent_upto

    def timed_out(self, now: float) -> bool:
        return self.unstored > 0 and now - self.progress_at > self.timeout

    def resend(self) -> list[Experience]:
        """Everything kept, oldest first: replay stores what it lacks and drops the rest."""
        self.resent_upto = self.sent
        self.progress_at = time.monotonic()
        self.resends += len(self.kept)
        return list(self.kept)
