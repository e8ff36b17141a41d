"""The files a run writes and reads back: checkpoints written whole or not at all (also under
SIGKILL), damaged ones named or replaced by the one before, and a full disk (a real, small
tmpfs) that stops the writes with one clear message while training and evaluation go on."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from spreeze.common.checkpoint_files import check_checkpoints, damage, previous, readable, save_checkpoint
from spreeze.common.disk import AppendOnly, DiskWrites, write_atomically
from spreeze.common.errors import CheckpointError

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` mounted at `where` (root only: skipped elsewhere), unmounted after."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_up(disk: Path) -> Path:
    """Write a file until the disk refuses more; its path."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        block = b"\0" * (1 << 16)
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


class Said:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def __call__(self, kind: str, reason: str) -> None:
        self.events.append((kind, reason))


# ---------------------------------------------------------------- checkpoint files

def test_a_checkpoint_keeps_the_one_before_and_damage_is_found_without_torch(tmp_path: Path) -> None:
    path = tmp_path / "learner.pt"
    save_checkpoint({"updates": 1, "w": torch.ones(1000)}, path)
    save_checkpoint({"updates": 2, "w": torch.ones(1000)}, path)
    assert torch.load(path, weights_only=False)["updates"] == 2
    assert torch.load(previous(path), weights_only=False)["updates"] == 1
    assert damage(path) is None and readable(path) == path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in a tensor: torch.load would take it
    path.write_bytes(bytes(data))
    assert "checksum" in str(damage(path))
    assert readable(path) == previous(path)
    assert check_checkpoints(tmp_path) == [f"{path} is {damage(path)}; learner.prev.pt is used instead"]
    previous(path).write_bytes(previous(path).read_bytes()[:500])  # truncated
    assert "not a whole checkpoint" in str(damage(previous(path)))
    with pytest.raises(CheckpointError) as err:
        readable(path)
    assert str(path) in str(err.value) and str(previous(path)) in str(err.value)
    with pytest.raises(CheckpointError):
        check_checkpoints(tmp_path)
    assert readable(tmp_path / "none.pt") is None


def test_a_crash_between_the_two_renames_leaves_the_one_before(tmp_path: Path) -> None:
    path = tmp_path / "best.pt"
    save_checkpoint({"updates": 1}, path)
    os.replace(path, previous(path))  # as save_checkpoint does, then killed before the new file is in place
    assert readable(path) == previous(path)
    assert torch.load(readable(path), weights_only=False) == {"updates": 1}  # type: ignore[arg-type]


KILLED_SAVER = """
import sys, torch
from pathlib import Path
from spreeze.common.checkpoint_files import save_checkpoint
path, n = Path(sys.argv[1]), 0
print("saving", flush=True)
while True:  # checkpoint after checkpoint, each consistent in itself, until killed
    n += 1
    save_checkpoint({"n": n, "w": torch.full((2_000_000,), float(n))}, path)
"""


def test_sigkill_mid_write_always_leaves_a_whole_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "learner.pt"
    rng = np.random.default_rng(0)
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVER, str(path)], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "saving"
            time.sleep(float(rng.uniform(0.2, 0.8)))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        used = readable(path)
        assert used is not None
        state = torch.load(used, weights_only=False)
        assert state["n"] >= 1 and bool((state["w"] == float(state["n"])).all())


# ---------------------------------------------------------------- a full disk

def test_disk_writes_say_full_once_and_resumed_once_writes_pass_again(tmp_path: Path) -> None:
    said = Said()
    writes = DiskWrites(said, quiet_s=0.3)
    with small_disk(tmp_path / "disk", "1m") as disk:
        filler = fill_up(disk)
        for _ in range(3):
            assert not writes.attempt("evaluator.json", lambda: write_atomically(disk / "e.json", b"x" * 10_000))
        assert [k for k, _ in said.events] == ["disk_full"]
        assert "evaluator.json not written: No space left on device" in said.events[0][1]
        assert not list(disk.glob(".*.tmp"))  # a refused write leaves no partial file
        filler.unlink()
        assert writes.attempt("evaluator.json", lambda: write_atomically(disk / "e.json", b"x" * 10_000))
        assert [k for k, _ in said.events] == ["disk_full"]  # one write passed, but a refusal was just now
        time.sleep(0.35)
        assert writes.attempt("evaluator.json", lambda: write_atomically(disk / "e.json", b"x" * 10_000))
        assert [k for k, _ in said.events] == ["disk_full", "disk_writes_resumed"]  # 0.3 s without refusals
        assert "3 writes refused" in said.events[1][1] and writes.refused_total == 3
        with pytest.raises(PermissionError):  # any other OSError is a mistake, raised as it is
            writes.attempt("x", lambda: (_ for _ in ()).throw(PermissionError(errno.EACCES, "denied")))


def test_append_only_holds_lines_back_and_writes_each_whole_once_there_is_room(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "1m") as disk:
        said = Said()
        f = AppendOnly(disk / "metrics.jsonl", DiskWrites(said, quiet_s=0))
        f.write(json.dumps({"n": 0}) + "\n")
        filler = fill_up(disk)
        lines = [json.dumps({"n": i, "pad": "x" * 300}) + "\n" for i in range(1, 200)]
        for line in lines:
            f.write(line)
        assert said.events and said.events[0][0] == "disk_full" and f.pending
        filler.unlink()
        f.write(json.dumps({"n": 200}) + "\n")
        f.close()
        rows = [json.loads(line) for line in (disk / "metrics.jsonl").read_text().splitlines()]
        assert [r["n"] for r in rows] == list(range(201))
        assert said.events[-1][0] == "disk_writes_resumed"


def test_append_only_cuts_a_partial_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"n": 0}\n{"n": 1, "par')
    f = AppendOnly(path, DiskWrites(Said()))
    f.write('{"n": 2}\n')
    f.close()
    assert path.read_text() == '{"n": 0}\n{"n": 2}\n'


def test_a_full_disk_at_a_checkpoint_keeps_the_last_whole_one(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "4m") as disk:
        path = disk / "learner.pt"
        save_checkpoint({"updates": 1, "w": torch.ones(250_000)}, path)  # 1 MB
        filler = fill_up(disk)
        with pytest.raises(OSError) as err:
            save_checkpoint({"updates": 2, "w": torch.ones(250_000)}, path)
        assert err.value.errno == errno.ENOSPC
        assert torch.load(readable(path), weights_only=False)["updates"] == 1  # type: ignore[arg-type]
        assert not list(disk.glob(".*.tmp"))
        filler.unlink()


def test_a_replay_snapshot_refused_by_a_full_disk_is_said_and_the_next_one_holds_its_rows(tmp_path: Path) -> None:
    from spreeze.common.replay_buffer import ReplayBuffer
    from spreeze.services.replay.snapshot import SnapshotWriter, load_latest

    def snapshot(w: SnapshotWriter, b: ReplayBuffer, owner: np.ndarray) -> dict | None:
        w.begin(b, {"buffer": b.counters(), "rng": b.rng_state(), "limiter": {}, "ledger": {}, "rejected": 0})
        w.write_all(b, owner)
        return w.last

    with small_disk(tmp_path / "disk", "8m") as disk:
        said = Said()
        b = ReplayBuffer(100_000, 17, 6, seed=0)
        owner = np.zeros(b.capacity, np.uint16)
        w = SnapshotWriter(disk / "replay", DiskWrites(said, quiet_s=0))
        b.add_rows(np.ones((1000, b.width), np.float32))
        first = snapshot(w, b, owner)
        assert first is not None and first["rows"] == 1000
        filler = fill_up(disk)
        b.add_rows(np.full((20_000, b.width), 2.0, np.float32))
        assert snapshot(w, b, owner) is first  # refused: the newest complete one is still the first
        assert [k for k, _ in said.events] == ["disk_full"] and "replay snapshot 2" in said.events[0][1]
        assert not list((disk / "replay").glob(".*.tmp"))  # its partial segment is gone
        filler.unlink()
        third = snapshot(w, b, owner)
        assert third is not None and third["rows"] == 21_000 and said.events[-1][0] == "disk_writes_resumed"
        restored = ReplayBuffer(100_000, 17, 6, seed=0)
        assert load_latest(disk / "replay", restored, np.zeros(b.capacity, np.uint16))["rows"] == 21_000  # type: ignore[index]
        assert restored.size == 21_000


# ---------------------------------------------------------------- whole runs

def progress_updates(line: str) -> int | None:
    if "| updates " not in line:
        return None
    return int(line.split("| updates ")[1].split()[0].replace(",", ""))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_full_disk_stops_the_writes_while_training_and_evaluation_go_on(tmp_path: Path) -> None:
    from tests.test_integration import FAST, records, wait_for

    with small_disk(tmp_path / "disk", "64m") as disk:
        run_dir = disk / "run"
        cmd = [sys.executable, "-m", "spreeze.cli", "train", "--run-dir", str(run_dir), *FAST,
               "--total-steps", "10000000", "replay.snapshot_every_s=2", "learner.checkpoint_every_s=2"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()

        def updates_now() -> int:
            return max((u for line in list(out) if (u := progress_updates(line)) is not None), default=0)

        try:
            wait_for(lambda: True if len(records(run_dir, "eval")) >= 2 else None, 200)
            evals_before = len(records(run_dir, "eval"))
            filler = fill_up(disk)
            wait_for(lambda: True if any("disk_full" in line for line in list(out)) else None, 60)
            at_full = updates_now()
            lines_at_full = len(out)
            time.sleep(15)
            assert updates_now() > at_full + 1000, out[-5:]  # training goes on
            evals_while_full = {line.split("eval ")[1].split()[1] for line in out[lines_at_full:]
                                if "| eval " in line and "@" in line}
            assert len(evals_while_full) >= 2, out[-5:]  # evaluations go on (new "@Nk" on the console)
            filler.unlink()
            wait_for(lambda: True if any("disk_writes_resumed" in line for line in list(out)) else None, 60)
            wait_for(lambda: True if len(records(run_dir, "eval")) > evals_before + 3 else None, 60)
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
        reader.join(10)
        text = "".join(out)
        assert proc.returncode == 0, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        assert text.count("disk_full") <= 6, text  # said once per process (supervisor and 4 writing services)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in rows if r["kind"] == "eval"]
        assert [e["env_steps"] for e in evals] == sorted(e["env_steps"] for e in evals)
        assert len(evals) > evals_before + len(evals_while_full)  # those made while full were written later
        assert readable(run_dir / "checkpoints" / "learner.pt") is not None
        ev = subprocess.run([sys.executable, "-m", "spreeze.cli", "eval", str(run_dir), "--episodes", "1"],
                            capture_output=True, text=True, timeout=120)
        assert ev.returncode == 0, ev.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_resume_takes_the_checkpoint_before_a_damaged_one_and_names_both_when_both_are(tmp_path: Path) -> None:
    from tests.test_integration import FAST

    run_dir = tmp_path / "run"
    first = subprocess.run([sys.executable, "-m", "spreeze.cli", "train", "--run-dir", str(run_dir), *FAST,
                            "--total-steps", "4000", "learner.checkpoint_every_s=1"],
                           capture_output=True, text=True, timeout=200)
    assert first.returncode == 0, first.stdout + first.stderr
    ckpt = run_dir / "checkpoints" / "learner.pt"
    assert previous(ckpt).is_file()
    good, before = ckpt.read_bytes(), previous(ckpt).read_bytes()
    for path, data in ((ckpt, good), (previous(ckpt), before)):
        damaged = bytearray(data)
        damaged[len(damaged) // 2] ^= 0xFF
        path.write_bytes(bytes(damaged))
    refused = subprocess.run([sys.executable, "-m", "spreeze.cli", "train", "--resume", str(run_dir)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert str(ckpt) in refused.stderr and str(previous(ckpt)) in refused.stderr and "checksum" in refused.stderr
    previous(ckpt).write_bytes(before)
    resumed = subprocess.run([sys.executable, "-m", "spreeze.cli", "train", "--resume", str(run_dir),
                              "--total-steps", "6000"], capture_output=True, text=True, timeout=200)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "learner.prev.pt is used instead" in resumed.stdout
    assert "using the checkpoint before it" in (run_dir / "logs" / "learner.log").read_text()


def test_a_damaged_replay_snapshot_is_skipped_for_the_one_before(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    from spreeze.common.replay_buffer import ReplayBuffer
    from spreeze.services.replay.snapshot import SnapshotWriter, load_latest

    b = ReplayBuffer(10_000, 17, 6, seed=0)
    owner = np.zeros(b.capacity, np.uint16)
    w = SnapshotWriter(tmp_path / "replay")
    metas = []
    for fill in (1.0, 2.0):
        b.add_rows(np.full((1000, b.width), fill, np.float32))
        w.begin(b, {"buffer": b.counters(), "rng": b.rng_state(), "limiter": {}, "ledger": {}, "rejected": 0})
        metas.append(w.write_all(b, owner))
    newest = tmp_path / "replay" / metas[1]["segments"][-1][2]
    newest.write_bytes(newest.read_bytes()[:3000])  # cut short, as by a disk error
    restored = ReplayBuffer(10_000, 17, 6, seed=0)
    meta = load_latest(tmp_path / "replay", restored, np.zeros(restored.capacity, np.uint16))
    assert meta is not None and meta["k"] == metas[0]["k"] and restored.size == 1000
    assert f"replay snapshot {metas[1]['k']}" in caplog.text and "trying an older one" in caplog.text
