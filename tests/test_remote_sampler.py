"""Remote samplers: `spreeze sampler --connect tcp://...` attaches to a running `spreeze train
--listen`, and with CURVE keys set nobody without an authorized key gets experience in.

Real processes on real tcp://127.0.0.1 sockets. The trainer starts no sampler of its own
(sampler.num_samplers=0), so every transition the replay counts came over tcp.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from spreeze.proto.codec import Encoder
from spreeze.common.curve_auth import client_keys, make_keys
from spreeze.proto.messages import Experience, to_frames
from tests.helpers import free_port_base
from tests.test_integration import FAST, pid_alive, records, wait_for

REMOTE = [*FAST, "sampler.num_samplers=0", "supervisor.heartbeat_interval=0.5", "--time-limit", "200"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "spreeze.cli", *args]


def roster(run: Path) -> dict[str, dict]:
    try:
        return json.loads((run / "services.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def state(run: Path, sid: str) -> str | None:
    return roster(run).get(sid, {}).get("state")


def inserted(run: Path) -> int:
    rows = [r for r in records(run, "metrics") if r.get("service") == "replay"]
    return rows[-1]["inserted"] if rows else 0


def stop(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_remote_sampler_attaches_over_tcp_and_leaves_the_accounting_when_killed(tmp_path: Path) -> None:
    run, port = tmp_path / "run", free_port_base()
    listen = f"tcp://127.0.0.1:{port}"
    trainer = subprocess.Popen(cli("train", "--run-dir", str(run), *REMOTE, "--total-steps", "3000",
                                   "--listen", listen), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = subprocess.Popen(cli("sampler", "--connect", listen, "--id", "remote-a"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    second = None
    try:
        wait_for(lambda: True if state(run, "remote-a") == "running" else None, 120)
        row = roster(run)["remote-a"]
        assert row["external"] and row["remote"] and row["pid"] == first.pid
        wait_for(lambda: True if inserted(run) >= 600 else None, 120)  # its experience is in replay
        first.send_signal(signal.SIGKILL)
        first.wait()
        wait_for(lambda: True if state(run, "remote-a") == "gone" else None, 60)
        stalled = inserted(run)
        second = subprocess.Popen(cli("sampler", "--connect", listen, "--id", "remote-b"),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = trainer.communicate(timeout=240)
        sampler_out, _ = second.communicate(timeout=60)  # told to shut down at the end of the run
    finally:
        for proc in (trainer, first, second):
            if proc is not None:
                stop(proc)
    assert trainer.returncode == 0, out
    assert "budget of 3,000 env steps reached" in out
    assert second.returncode == 0, sampler_out
    assert stalled < 3000 <= inserted(run)  # the rest came from the second remote sampler
    events = [(e["event"], e.get("service")) for e in records(run, "event")]
    # events ride the metrics bus (PUB: the first ones may be dropped while it connects); remote-a's
    # join was seen in services.json above
    assert ("leave", "remote-a") in events and ("join", "remote-b") in events
    final = roster(run)
    assert final["remote-a"]["state"] == "gone" and final["remote-b"]["state"] == "stopped"
    assert not pid_alive(second.pid)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_with_keys_a_sampler_without_an_authorized_key_is_refused(tmp_path: Path) -> None:
    keys = make_keys(tmp_path / "keys")
    rogue = tmp_path / "rogue"  # its own pair, never authorized, and the (public) server key
    make_keys(rogue)
    shutil.copy(keys / "server.key", rogue / "server.key")
    run, port = tmp_path / "run", free_port_base()
    listen = f"tcp://127.0.0.1:{port}"
    trainer = subprocess.Popen(cli("train", "--run-dir", str(run), *REMOTE, "--total-steps", "2000",
                                   "--listen", listen, "--keys", str(keys)),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    good = None
    try:
        wait_for(lambda: True if any(r.get("service") == "replay" for r in records(run, "metrics")) else None, 120)
        for extra in ([], ["--keys", str(rogue)]):  # no keys at all; a key pair the trainer does not know
            refused = subprocess.run(cli("sampler", "--connect", listen, "--register-timeout", "5", *extra),
                                     capture_output=True, text=True, timeout=60)
            assert refused.returncode == 1, refused.stderr
            assert "no Welcome from the supervisor" in refused.stderr
        push_unauthorized(f"tcp://127.0.0.1:{port + 2}", rogue)  # straight at replay's experience socket
        time.sleep(3.0)  # several replay metrics periods: what got through would show up as inserted
        assert inserted(run) == 0
        assert [r for r in records(run, "metrics") if r.get("service") == "replay"]
        assert not any(sid.startswith("sampler") for sid in roster(run))
        good = subprocess.Popen(cli("sampler", "--connect", listen, "--keys", str(keys), "--id", "trusted"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        out, _ = trainer.communicate(timeout=240)
    finally:
        for proc in (trainer, good):
            if proc is not None:
                stop(proc)
    assert trainer.returncode == 0, out
    assert inserted(run) >= 2000 and roster(run)["trusted"]["remote"]
    # refusals are said (console and the dashboard's events), naming the socket and why
    # (test_curve_auth.py checks each reason's words)
    said = [r["reason"] for r in records(run, "event") if r.get("event") == "refused_client"]
    assert any(s.startswith(f"supervisor refused a client at {listen}: ") for s in said), said
    assert f"event refused_client: supervisor refused a client at {listen}" in out
    assert any(s.startswith(f"replay refused a client at tcp://127.0.0.1:{port + 2}: ") for s in said), said


def push_unauthorized(endpoint: str, keys_dir: Path) -> None:
    """Valid Pendulum experience pushed with an unauthorized CURVE pair and with no CURVE at all."""
    rows = np.zeros((64, 2 * 3 + 1 + 2), np.float32)
    frames = to_frames(Experience(rows, 3, 1, 64), Encoder("rogue"))
    ctx = zmq.Context()
    try:
        for curve in (client_keys(keys_dir), None):
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDTIMEO, 500)
            if curve is not None:
                curve.apply(sock, server=False)
            sock.connect(endpoint)
            for _ in range(20):
                try:
                    sock.send_multipart(frames)
                except zmq.Again:
                    break  # nothing accepts it: the queue is full
            time.sleep(0.5)
            sock.close()
    finally:
        ctx.term()
