"""Replay's books: which sender owns each ring row, per-sender counts, and the dedup table.

Definitions, per sender (all in transitions):
  inserted   rows of every batch seen for the first time (stored or rejected)
  rejected   rows of batches refused (wrong dimensions, NaN/inf)
  evicted    rows of this sender overwritten in the ring (or cut from an oversized batch)
  stored     rows of this sender in the ring now
  duplicates rows of batches seen before (re-sends), dropped without storing
  env_steps  sum over the sender's sessions of the env_steps field of its newest batch
  random     rows of first-seen batches whose actions were uniformly random (warm-up)
so that inserted = stored + evicted + rejected holds exactly; `counted_stored` counts
`stored` independently from the owner column, to check it. For a sampler (one row per
env step, env_steps counted per session) inserted = env_steps means nothing was lost
and nothing stored twice.

Dedup: batches of one (sender, session) arrive in order, so the table keeps only the
highest batch number stored per session (`stored`), and the highest one inside a
complete snapshot (`durable`), which the sampler needs to forget batches.

Warm-up: replay hands out the run's `sampler.warmup_steps` random env steps as grants
(`granted`, cumulative per session, sent in every ack as `warmup`), at most
max(WARMUP_LEASE, (ack_window + 1) x its latest batch's rows) unused at a time per session
(so that a sampler with large batches keeps its window full), so the run as a whole takes exactly that many random
steps whatever mix of samplers it has. When a sender starts a new session (a restart),
what its older sessions were granted and did not use goes back to the pool.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_SENDERS = 65_535  # owner ids are uint16; 0 is "nobody"
LEDGER_KEYS = ("inserted", "stored", "evicted", "rejected", "duplicates", "random")
WARMUP_LEASE = 1024  # least random env steps a session may hold unused: a few batches, small next to a warm-up


@dataclass
class Session:
    """One sampler incarnation: its watermarks and where to send its acks."""

    peer: bytes  # ROUTER routing id of its socket (changes when it reconnects)
    stored: int = 0  # highest batch stored or rejected; all lower ones too
    durable: int = 0  # highest batch inside a complete snapshot
    env_steps: int = 0  # the sender's env_steps in its newest batch stored or rejected
    granted: int = 0  # random (warm-up) env steps this session may take in all
    random: int = 0  # random env steps in its batches seen so far


class Ledger:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.owner = np.zeros(capacity, np.uint16)  # sender index + 1 of each ring row
        self.senders: list[str] = []
        self.index: dict[str, int] = {}
        self.books: dict[str, Counter[str]] = {}
        self.sessions: dict[tuple[str, str], Session] = {}
        self.warmup_granted = 0  # random env steps granted to all sessions, net of those given back

    def _sender(self, sender: str) -> int:
        idx = self.index.get(sender)
        if idx is None:
            if len(self.senders) >= MAX_SENDERS:
                raise OverflowError(f"more than {MAX_SENDERS} senders: cannot account for {sender!r}")
            self.senders.append(sender)
            idx = self.index[sender] = len(self.senders)
            self.books[sender] = Counter({k: 0 for k in LEDGER_KEYS})
        return idx

    # ---------------------------------------------------------------- dedup
    def session(self, sender: str, session: str, peer: bytes) -> Session:
        s = self.sessions.get((sender, session))
        if s is None:
            for (who, _), old in self.sessions.items():  # the sender restarted: its old grants are free
                if who == sender and old.granted > old.random:
                    self.warmup_granted -= old.granted - old.random
                    old.granted = old.random
            s = self.sessions[(sender, session)] = Session(peer)
        s.peer = peer
        return s

    def grant(self, s: Session, warmup_steps: int, lease: int = WARMUP_LEASE) -> int:
        """Top the session's unused random steps up to `lease` from what is left of the run's
        warm-up; its cumulative grant (the ack's `warmup`)."""
        unused = max(s.granted - s.random, 0)
        left = warmup_steps - self.warmup_granted
        if left > 0 and unused < lease // 2:
            more = min(lease - unused, left)
            s.granted += more
            self.warmup_granted += more
        return s.granted

    def took_random(self, sender: str, s: Session, rows: int) -> None:
        self._sender(sender)
        s.random += rows
        self.books[sender]["random"] += rows

    def duplicate(self, sender: str, rows: int) -> None:
        self._sender(sender)
        self.books[sender]["duplicates"] += rows

    # ---------------------------------------------------------------- rows
    def stored(self, sender: str, first_row: int, n: int, size_before: int) -> None:
        """n rows of `sender` were written as global rows first_row.. (ring row = row % capacity)."""
        who = self._sender(sender)
        book = self.books[sender]
        keep = min(n, self.capacity)
        book["inserted"] += n
        book["evicted"] += n - keep  # cut from an oversized batch
        start = (first_row + n - keep) % self.capacity
        for lo, hi in _spans(start, keep, self.capacity):
            self._evict(self.owner[lo:hi], lo, size_before)
            self.owner[lo:hi] = who
        book["stored"] += keep

    def _evict(self, owners: np.ndarray, lo: int, size_before: int) -> None:
        filled = owners if size_before >= self.capacity else owners[:max(0, size_before - lo)]
        if not filled.size:
            return
        counts = np.bincount(filled, minlength=len(self.senders) + 1)
        for idx in np.flatnonzero(counts[1:]):
            book = self.books[self.senders[idx]]
            book["evicted"] += int(counts[idx + 1])
            book["stored"] -= int(counts[idx + 1])

    def rejected(self, sender: str, rows: int) -> None:
        self._sender(sender)
        self.books[sender]["inserted"] += rows
        self.books[sender]["rejected"] += rows

    def counted_stored(self, size: int) -> dict[str, int]:
        """Rows per sender in the first `size` ring rows, counted from the owner column."""
        counts = np.bincount(self.owner[:size], minlength=len(self.senders) + 1)
        return {name: int(counts[i + 1]) for i, name in enumerate(self.senders)}

    def metrics(self) -> dict[str, int]:
        out = {f"ledger/{name}/{k}": int(v) for name, book in self.books.items() for k, v in book.items()}
        for (sender, _), s in self.sessions.items():
            key = f"ledger/{sender}/env_steps"
            out[key] = out.get(key, 0) + s.env_steps
        return out

    # ---------------------------------------------------------------- snapshots
    def state(self) -> dict[str, Any]:
        """Everything but the owner column (saved with the rows): plain msgpack-able data."""
        return {"senders": list(self.senders), "books": {k: dict(v) for k, v in self.books.items()},
                "sessions": [[sender, sess, s.stored, s.durable, s.env_steps, s.granted, s.random]
                             for (sender, sess), s in self.sessions.items()],
                "warmup_granted": self.warmup_granted}

    def load(self, state: dict[str, Any]) -> None:
        self.senders = list(state["senders"])
        self.index = {name: i + 1 for i, name in enumerate(self.senders)}
        self.books = {k: Counter(v) for k, v in state["books"].items()}
        self.sessions = {(row[0], row[1]): Session(b"", *row[2:]) for row in state["sessions"]}
        self.warmup_granted = int(state.get("warmup_granted", 0))


def _spans(start: int, n: int, capacity: int) -> list[tuple[int, int]]:
    """Ring index ranges [lo, hi) of n rows written from `start` (two when they wrap)."""
    first = min(n, capacity - start)
    return [(start, start + first)] + ([(0, n - first)] if first < n else [])
