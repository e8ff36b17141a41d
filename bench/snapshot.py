"""`spreeze bench snapshot`: writing a replay snapshot beside a busy replay loop.

The replay's own code paths in one process: a ReplayBuffer of `--capacity` HalfCheetah
transitions (obs 17, act 6: 164 bytes each), filled with random rows, and the
SnapshotWriter of services/replay/snapshot.py. A loop stands in for the replay's: each
turn inserts one sampler batch (`--insert` rows, with `before_insert` first) and samples
one learner batch (`--sample` rows), then lets the writer copy its next chunk (`step`),
exactly what Replay.serve does between two polls.

Measured, in one run:
  full      a snapshot of the whole full ring (the first one of a run): seconds from
            begin to complete on disk (fsync included), bytes on disk;
  increment the next snapshot: the rows inserted since the first began, `--new` included
            (what a periodic snapshot writes; this loop inserts far faster than samplers do);
  stall     the longest, p99 and median loop turn while a snapshot is being written, next
            to the same loop without one (measured just before), and the longest single call
            into the writer (copy of a chunk, or of rows an insert is about to overwrite):
            the delay a snapshot adds to an insert or a sample;
  restore   seconds to load the newest snapshot into an empty buffer.

    spreeze bench snapshot [--capacity 1000000] [--dir D] [--json F]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from spreeze.common.replay_buffer import ReplayBuffer
from spreeze.services.replay.snapshot import SnapshotWriter, load_latest

OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah-v5
FILL_CHUNK = 65_536  # rows per add while filling
PLAIN_TURNS = 5_000  # reference loop turns without a snapshot


def meta_of(b: ReplayBuffer) -> dict[str, Any]:
    return {"buffer": b.counters(), "rng": b.rng_state(), "limiter": {}, "ledger": {}, "rejected": 0}


def turn(b: ReplayBuffer, w: SnapshotWriter | None, owner: np.ndarray, rows: np.ndarray,
         sample: int, calls: list[float]) -> float:
    """One replay loop turn: insert, sample, writer step; its duration."""
    t0 = time.perf_counter()
    if w is not None:
        c = time.perf_counter()
        w.before_insert(b, owner, len(rows))
        calls.append(time.perf_counter() - c)
    b.add_rows(rows)
    b.sample_packed(sample)
    if w is not None:
        c = time.perf_counter()
        w.step(b, owner)
        calls.append(time.perf_counter() - c)
        w.finished()
    return time.perf_counter() - t0


def snapshot_under_load(b: ReplayBuffer, w: SnapshotWriter, owner: np.ndarray, rows: np.ndarray,
                        sample: int, plain_turns: int) -> dict[str, float]:
    """Plain loop turns (the reference), then one snapshot written while the loop runs."""
    calls: list[float] = []
    idle = [turn(b, None, owner, rows, sample, calls) for _ in range(plain_turns)]
    busy: list[float] = []
    t0 = time.perf_counter()
    w.begin(b, meta_of(b))
    assert w.pending is not None
    written = w.pending.end - w.pending.first
    while w.pending is not None:
        busy.append(turn(b, w, owner, rows, sample, calls))
    seconds = time.perf_counter() - t0

    def ms(x: list[float], q: float) -> float:
        return 1e3 * float(np.quantile(x, q))
    return {"seconds": seconds, "rows_written": written, "turns": len(busy),
            "max_turn_ms": ms(busy, 1), "p99_turn_ms": ms(busy, 0.99), "median_turn_ms": ms(busy, 0.5),
            "max_call_ms": 1e3 * max(calls),
            "plain_max_turn_ms": ms(idle, 1), "plain_p99_turn_ms": ms(idle, 0.99),
            "plain_median_turn_ms": ms(idle, 0.5)}


def disk_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


def run(capacity: int, insert: int, sample: int, new: int, directory: str | None,
        plain_turns: int = PLAIN_TURNS) -> dict[str, Any]:
    root = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="spz-snap-"))
    d = root / "replay"
    shutil.rmtree(d, ignore_errors=True)
    rng = np.random.default_rng(0)
    b = ReplayBuffer(capacity, OBS_DIM, ACT_DIM, seed=0)
    owner = np.ones(capacity, np.uint16)
    for start in range(0, capacity, FILL_CHUNK):
        b.add_rows(rng.standard_normal((min(FILL_CHUNK, capacity - start), b.width), dtype=np.float32))
    rows = rng.standard_normal((insert, b.width), dtype=np.float32)
    w = SnapshotWriter(d)
    try:
        full = snapshot_under_load(b, w, owner, rows, sample, plain_turns)
        full["bytes"] = disk_bytes(d)
        for start in range(0, new, FILL_CHUNK):
            b.add_rows(rng.standard_normal((min(FILL_CHUNK, new - start), b.width), dtype=np.float32))
        before = disk_bytes(d)
        inc = snapshot_under_load(b, w, owner, rows, sample, plain_turns)
        inc["bytes_added"] = disk_bytes(d) - before
        fresh = ReplayBuffer(capacity, OBS_DIM, ACT_DIM, seed=1)
        t0 = time.perf_counter()
        meta = load_latest(d, fresh, np.zeros(capacity, np.uint16))
        restore_s = time.perf_counter() - t0
        assert meta is not None and fresh.size == b.size
        return {"capacity": capacity, "row_bytes": 4 * b.width, "insert": insert, "sample": sample,
                "plain_turns": plain_turns, "full": full, "increment": inc, "restore_s": restore_s}
    finally:
        if directory is None:
            shutil.rmtree(root, ignore_errors=True)


def report(r: dict[str, Any]) -> str:
    f, i = r["full"], r["increment"]
    lines = [f"replay of {r['capacity']:,} transitions x {r['row_bytes']} B; loop turn = insert {r['insert']} + "
             f"sample {r['sample']} + writer step"]
    for name, s in (("full", f), ("increment", i)):
        size = s.get("bytes", s.get("bytes_added", 0))
        lines.append(f"  {name:>9}: {s['rows_written']:,} rows written in {s['seconds']:.2f} s, "
                     f"{size / 1e6:.1f} MB on disk; {s['turns']} loop turns meanwhile: longest "
                     f"{s['max_turn_ms']:.2f} ms, p99 {s['p99_turn_ms']:.3f}, median {s['median_turn_ms']:.3f}; "
                     f"longest writer call {s['max_call_ms']:.2f} ms")
    lines.append(f"  without a snapshot ({r['plain_turns']} turns): longest {f['plain_max_turn_ms']:.2f} ms, "
                 f"p99 {f['plain_p99_turn_ms']:.3f}, median {f['plain_median_turn_ms']:.3f}")
    lines.append(f"  restore of the newest snapshot: {r['restore_s']:.2f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spreeze bench snapshot", description=__doc__.splitlines()[0])
    p.add_argument("--capacity", type=int, default=1_000_000, help="transitions in the (full) ring")
    p.add_argument("--insert", type=int, default=64, help="rows per insert (one sampler batch)")
    p.add_argument("--sample", type=int, default=256, help="rows per sample (one learner batch)")
    p.add_argument("--new", type=int, default=30_000, help="rows inserted between the two snapshots")
    p.add_argument("--plain-turns", type=int, default=PLAIN_TURNS, help="reference loop turns without a snapshot")
    p.add_argument("--dir", default=None, help="write under this directory (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = p.parse_args(argv)
    if min(args.capacity, args.insert, args.sample, args.new, args.plain_turns) <= 0:
        p.error("--capacity, --insert, --sample, --new and --plain-turns must be positive")
    result = run(args.capacity, args.insert, args.sample, args.new, args.dir, args.plain_turns)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
