"""Writes that a full disk refuses, and what a service does then: say so once, go on training.

A run writes checkpoints, replay snapshots, metrics.jsonl, evaluation records and TensorBoard
files into its run directory. When that disk fills (ENOSPC, or EDQUOT for a quota) none of
those writes is worth stopping training for: each is tried, the first refusal is said once
(an event the console and the dashboard show), later ones are counted, and the first write
that succeeds again says that writes have resumed. Any other OSError (a permission, a path
that vanished) is still raised: it is a mistake to fix, not a state to wait out.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

FULL = (errno.ENOSPC, errno.EDQUOT)
Say = Callable[[str, str], None]  # (event kind, reason)
QUIET_S = 10.0  # writes have resumed once none was refused for this long


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL


class DiskWrites:
    """One process's writes into the run directory, tried through `attempt`."""

    def __init__(self, say: Say, quiet_s: float = QUIET_S) -> None:
        self.say, self.quiet_s = say, quiet_s
        self.full = False
        self.last_refusal = 0.0  # monotonic time
        self.refused_now = 0  # writes refused since the disk filled (all of them: `refused_total`)
        self.refused_total = 0

    def attempt(self, what: str, write: Callable[[], object]) -> bool:
        """Call `write()`: True when it wrote, False where the disk was full (said the first time)."""
        try:
            write()
        except OSError as exc:
            if not is_full(exc):
                raise
            self.refused(what, exc)
            return False
        self.wrote(what)
        return True

    def refused(self, what: str, exc: OSError) -> None:
        """A write of `what` failed for want of space (said the first time)."""
        self.refused_now += 1
        self.refused_total += 1
        self.last_refusal = time.monotonic()
        if not self.full:
            self.full = True
            where = f" ({exc.filename})" if exc.filename else ""
            self.say("disk_full", f"{what} not written: {exc.strerror}{where}; training and evaluation go "
                                  "on, and writes resume when space is freed")

    def wrote(self, what: str) -> None:
        """A write of `what` succeeded (said once none was refused for `quiet_s`: replacing a file
        frees the old one's space, so one write may pass on a disk that is still full)."""
        if self.full and time.monotonic() - self.last_refusal >= self.quiet_s:
            self.full = False
            n = self.refused_now
            self.say("disk_writes_resumed", f"{what} written again ({n} write{'s' if n != 1 else ''} refused "
                                            "while the disk was full)")
            self.refused_now = 0


def write_atomically(path: Path, data: bytes) -> None:
    """`data` in a temporary file beside `path`, flushed to disk, then renamed over it: a reader
    sees the old file or the new one, never a part (also after a SIGKILL mid-write). A failed
    write (a full disk) removes its temporary file and leaves `path` as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def log_say(kind: str, reason: str) -> None:
    """A `Say` for code without an event channel: the log only."""
    log.warning("%s: %s", kind, reason)


PENDING_MAX = 200_000  # lines an AppendOnly file holds back while the disk is full (then newer ones are dropped)


class AppendOnly:
    """A file of lines appended in order (metrics.jsonl) that a full disk holds back instead of
    breaking: every line waits in memory until it is written whole, byte for byte (a short write
    keeps its rest), so once space is freed the file goes on exactly where it stopped."""

    def __init__(self, path: Path, disk: DiskWrites) -> None:
        self.path, self.disk = path, disk
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        drop_partial_line(self.fd, path)
        self.pending: deque[bytes] = deque()
        self.dropped = 0  # lines not kept because PENDING_MAX were waiting

    def write(self, line: str) -> None:
        if len(self.pending) >= PENDING_MAX:
            self.dropped += 1
        else:
            self.pending.append(line.encode())
        self.flush()

    def flush(self) -> bool:
        """Write what waits; False while the disk refuses it."""
        return not self.pending or self.disk.attempt(self.path.name, self._write_pending)

    def _write_pending(self) -> None:
        while self.pending:
            data = self.pending[0]
            written = os.write(self.fd, data)
            self.pending[0] = data[written:]
            if written == len(data):
                self.pending.popleft()

    def close(self) -> None:
        self.flush()
        if self.pending or self.dropped:
            log.warning("%s: %d lines could not be written (disk full), %d dropped", self.path,
                        len(self.pending), self.dropped)
        os.close(self.fd)


def drop_partial_line(fd: int, path: Path) -> None:
    """Cut a last line without its newline (a run that ended on a full disk) so that the lines
    appended next start on a line of their own."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    tail = os.pread(fd, min(size, 1 << 20), max(0, size - (1 << 20)))
    keep = size - len(tail) + tail.rfind(b"\n") + 1 if b"\n" in tail else max(0, size - len(tail))
    os.ftruncate(fd, keep)
    log.warning("%s ended in a partial line (%d bytes): cut", path, size - keep)
