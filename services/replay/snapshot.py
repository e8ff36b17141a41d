"""Incremental replay snapshots in RUN_DIR/replay/, written beside a running replay.

On disk:
  seg-<first>-<end>.npy   global rows [first, end) of the ring: a float32 [n, width] .npy
                          array followed by a uint16 [n] .npy array (each row's owner)
  snap-<k>.json           metadata of snapshot k: rows, size, counters, rate limiter, RNG,
                          ledger and dedup table, and the segments it needs
  snap-<k>.done           completion marker, written last
Every file is written under a temporary name, flushed to disk and renamed; a snapshot
whose marker is missing (killed mid-write) is ignored, and the previous one restored.

Snapshot k only writes the rows inserted since snapshot k-1 (one new segment); older
segments stay while any of their rows is still in the ring. The rows are copied out of
the ring in chunks of CHUNK_ROWS between two polls of the replay loop (a bounded stall
per chunk), and a background thread writes them; rows an insert is about to overwrite
are copied first (`before_insert`), so a snapshot is exactly the ring as it was when it
began, however long the writing takes. The metadata is taken when it begins.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from spreeze.proto.errors import SpreezeError
from spreeze.common.disk import DiskWrites, is_full, log_say, write_atomically
from spreeze.common.replay_buffer import ReplayBuffer

log = logging.getLogger(__name__)

FORMAT = 1  # snapshot format version (metadata key "format")
CHUNK_ROWS = 16_384  # rows copied per loop turn: 2.7 MB for HalfCheetah, about a millisecond
MAX_QUEUED = 4  # chunks waiting for the writer thread before copying pauses (memory bound)
KEEP = 2  # complete snapshots kept: the newest, and one to fall back on
_DONE = re.compile(r"snap-(\d{6})\.done$")


class SnapshotError(SpreezeError):
    """A snapshot on disk is incomplete or does not fit this replay."""


@dataclass
class Pending:
    """A snapshot being written: rows [first, end) still to copy from `copied` on."""

    k: int
    meta: dict[str, Any]
    first: int
    end: int
    copied: int
    owners: list[np.ndarray] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    started: float = field(default_factory=time.perf_counter)


class SnapshotWriter:
    """Owns RUN_DIR/replay: starts, feeds and completes snapshots; one at a time."""

    def __init__(self, directory: Path, disk: DiskWrites | None = None) -> None:
        self.dir = directory
        self.disk = disk or DiskWrites(log_say)  # a snapshot refused by a full disk is said once
        self.dir.mkdir(parents=True, exist_ok=True)
        for tmp in self.dir.glob(".*.tmp"):  # leftovers of a snapshot killed mid-write
            tmp.unlink(missing_ok=True)
        self.pending: Pending | None = None
        self.last: dict[str, Any] | None = None  # metadata of the newest complete snapshot
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.thread = threading.Thread(target=self._work, name="snapshot-writer", daemon=True)
        self.thread.start()
        self.took_s = 0.0  # seconds from begin to complete, newest snapshot

    # ------------------------------------------------------------ event-loop side
    def begin(self, buffer: ReplayBuffer, meta: dict[str, Any]) -> None:
        """Start snapshot k+1 of the ring as it is now, with `meta` (counters etc.)."""
        end = buffer.inserted
        prev = self.last["rows"] if self.last else 0
        first = max(prev, end - buffer.size)
        k = (self.last["k"] + 1) if self.last else 1
        segments = [s for s in (self.last["segments"] if self.last else []) if s[1] > end - buffer.size]
        if end > first:
            segments.append([first, end, f"seg-{first:012d}-{end:012d}.npy"])
        meta = {**meta, "format": FORMAT, "k": k, "rows": end, "size": buffer.size, "segments": segments,
                "capacity": buffer.capacity, "obs_dim": buffer.obs_dim, "act_dim": buffer.act_dim}
        self.pending = Pending(k, meta, first, end, first)
        self.queue.put(("open", (self.pending, buffer.width)))
        if first == end:  # no new rows: only the metadata (counters, RNG, dedup table) moved
            self.queue.put(("close", self.pending))

    def step(self, buffer: ReplayBuffer, owner: np.ndarray, rows: int = CHUNK_ROWS) -> None:
        """Copy the next chunk of the pending snapshot (if the writer keeps up)."""
        p = self.pending
        if p is not None and p.copied < p.end and self.queue.qsize() < MAX_QUEUED:
            self._copy(buffer, owner, min(p.end, p.copied + rows))

    def before_insert(self, buffer: ReplayBuffer, owner: np.ndarray, n: int) -> None:
        """Copy the pending rows that an insert of n rows is about to overwrite."""
        p = self.pending
        if p is not None and p.copied < p.end:
            at_risk = buffer.inserted + n - buffer.capacity  # rows below this get overwritten
            if at_risk > p.copied:
                self._copy(buffer, owner, min(p.end, at_risk))

    def _copy(self, buffer: ReplayBuffer, owner: np.ndarray, upto: int) -> None:
        p = self.pending
        assert p is not None
        chunk = np.concatenate(buffer.row_views(p.copied, upto))  # copies: the ring moves on
        cap = buffer.capacity
        lo, hi = p.copied % cap, (upto - 1) % cap + 1
        p.owners.append(owner[lo:hi].copy() if lo < hi else np.concatenate([owner[lo:], owner[:hi]]))
        p.copied = upto
        self.queue.put(("rows", chunk))
        if upto == p.end:
            self.queue.put(("close", p))

    def finished(self) -> dict[str, Any] | None:
        """The metadata of the pending snapshot once it is complete on disk (once), else None."""
        p = self.pending
        if p is None or not p.done.is_set():
            return None
        self.pending = None
        self.took_s = time.perf_counter() - p.started
        if p.error is not None:  # the next snapshot holds its rows too (`last` stays as it was)
            if isinstance(p.error, OSError) and is_full(p.error):
                self.disk.refused(f"replay snapshot {p.k}", p.error)
            else:
                log.error("replay snapshot %d failed: %s", p.k, p.error)
            return None
        self.disk.wrote(f"replay snapshot {p.k}")
        self.last = p.meta
        return p.meta

    def write_all(self, buffer: ReplayBuffer, owner: np.ndarray, timeout: float = 300.0) -> dict[str, Any] | None:
        """Finish the pending snapshot now (shutdown): copy everything, wait for the thread."""
        p = self.pending
        if p is None:
            return None
        if p.copied < p.end:
            self._copy(buffer, owner, p.end)
        if not p.done.wait(timeout):
            raise SnapshotError(f"replay snapshot {p.k} was not written within {timeout:.0f}s")
        return self.finished()

    # ------------------------------------------------------------ writer thread
    def _work(self) -> None:
        f = None
        p: Pending | None = None
        while True:
            kind, item = self.queue.get()
            try:
                if kind == "open":
                    p, width = item
                    f = self._open_segment(p, width)
                elif kind == "rows" and f is not None:
                    f.write(memoryview(item).cast("B"))
                elif kind == "close" and p is not None:
                    self._complete(p, f)
                    f = None
            except BaseException as exc:  # disk full...: this snapshot fails, the replay goes on
                if f is not None:  # its partial segment would only hold space the next one needs
                    with contextlib.suppress(OSError):
                        f.close()
                    Path(f.name).unlink(missing_ok=True)
                if p is not None:
                    p.error = exc
                    p.done.set()
                f, p = None, None  # what is still queued of this snapshot is dropped (no `close` completes it)

    def _open_segment(self, p: Pending, width: int) -> Any:
        if p.end == p.first:
            return None
        f = open(self.dir / f".seg-{p.first:012d}.tmp", "wb")
        header = {"descr": "<f4", "fortran_order": False, "shape": (p.end - p.first, width)}
        np.lib.format.write_array_header_1_0(f, header)
        return f

    def _complete(self, p: Pending, f: Any) -> None:
        if f is not None:
            np.save(f, np.concatenate(p.owners), allow_pickle=False)
            _close_durably(f)
            os.replace(f.name, self.dir / p.meta["segments"][-1][2])
        write_atomically(self.dir / f"snap-{p.k:06d}.json", json.dumps(p.meta).encode())
        write_atomically(self.dir / f"snap-{p.k:06d}.done", b"ok\n")
        _sync_dir(self.dir)
        self._collect(p.meta)
        p.done.set()

    def _collect(self, meta: dict[str, Any]) -> None:
        """Delete snapshots older than the KEEP newest, and segments none of those needs."""
        done = sorted(complete_snapshots(self.dir), reverse=True)
        keep = done[:KEEP]
        needed = {meta["segments"][i][2] for i in range(len(meta["segments"]))}
        for k in keep[1:]:
            try:
                needed |= {s[2] for s in _read_meta(self.dir, k)["segments"]}
            except (OSError, ValueError):
                pass
        for k in done[KEEP:]:
            (self.dir / f"snap-{k:06d}.done").unlink(missing_ok=True)
            (self.dir / f"snap-{k:06d}.json").unlink(missing_ok=True)
        for seg in self.dir.glob("seg-*.npy"):
            if seg.name not in needed:
                seg.unlink(missing_ok=True)


# ---------------------------------------------------------------- reading

def complete_snapshots(directory: Path) -> list[int]:
    """Numbers of the snapshots that have their completion marker."""
    return [int(m.group(1)) for p in directory.glob("snap-*.done") if (m := _DONE.match(p.name))]


def _read_meta(directory: Path, k: int) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((directory / f"snap-{k:06d}.json").read_text())
    return meta


def load_latest(directory: Path, buffer: ReplayBuffer, owner: np.ndarray) -> dict[str, Any] | None:
    """Restore the newest complete snapshot that reads back whole; its metadata, or None."""
    if not directory.is_dir():
        return None
    for k in sorted(complete_snapshots(directory), reverse=True):
        try:
            meta = _read_meta(directory, k)
            _restore(directory, meta, buffer, owner)
            return meta
        except (OSError, ValueError, KeyError, SnapshotError) as exc:
            log.warning("replay snapshot %d in %s is unusable (%s); trying an older one", k, directory, exc)
    return None


def _restore(directory: Path, meta: dict[str, Any], buffer: ReplayBuffer, owner: np.ndarray) -> None:
    if meta.get("format") != FORMAT:
        raise SnapshotError(f"snapshot format {meta.get('format')!r}, expected {FORMAT}")
    for key in ("capacity", "obs_dim", "act_dim"):
        if meta[key] != getattr(buffer, key):
            raise SnapshotError(f"snapshot has {key}={meta[key]}, this replay has {getattr(buffer, key)}")
    rows, size, cap = int(meta["rows"]), int(meta["size"]), buffer.capacity
    lo = rows - size
    for first, end, name in meta["segments"]:
        with open(directory / name, "rb") as f:
            data, owners = np.load(f, allow_pickle=False), np.load(f, allow_pickle=False)
        if data.shape != (end - first, buffer.width) or owners.shape != (end - first,):
            raise SnapshotError(f"segment {name} holds {data.shape}, expected {(end - first, buffer.width)}")
        skip = max(0, lo - first)  # rows of an old segment that were overwritten since
        buffer.put_rows(first + skip, data[skip:])  # a segment never holds more than capacity rows
        at, part = (first + skip) % cap, owners[skip:]
        head = min(len(part), cap - at)
        owner[at:at + head] = part[:head]
        owner[:len(part) - head] = part[head:]
    covered = sum(end - max(first, lo) for first, end, _ in meta["segments"])
    if covered != size:
        raise SnapshotError(f"segments cover {covered} rows, the snapshot holds {size}")
    c = meta["buffer"]
    buffer.set_counters(rows, size, int(c["evicted"]), int(c["sampled"]), meta["rng"])


# ---------------------------------------------------------------- durable files

def _close_durably(f: Any) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
