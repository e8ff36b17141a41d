"""`spreeze conformance` against Spreeze's own replay and sampler, and against the minimal
example sampler; the example attached to a real `spreeze train --listen` run.

Real processes on real sockets: the kit (a CLI subprocess) binds the control endpoint, the
service under test registers there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from spreeze.common.transport import make_ipc_dir
from spreeze.proto.codec import Encoder
from spreeze.proto.messages import Heartbeat, to_frames
from tests.test_integration import FAST, records
from tests.helpers import free_port_base
from tests.test_remote_sampler import cli, roster, stop

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "minimal_sampler.py"


def conformance(role: str, endpoint: str, service: list[str], env: dict[str, str] | None = None,
                timeout: float = 150) -> str:
    """Run the kit for `role` at `endpoint` against `service` (a command); the kit's report."""
    kit = subprocess.Popen(cli("conformance", role, endpoint, "--timeout", "60"), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    proc = subprocess.Popen(service, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        report, _ = kit.communicate(timeout=timeout)
        out, _ = proc.communicate(timeout=30)
    finally:
        stop(kit)
        stop(proc)
    assert kit.returncode == 0 and " 0 failed" in report, report + "\n--- service output ---\n" + out[-3000:]
    assert proc.returncode == 0, out[-3000:]  # it exited cleanly on the kit's shutdown
    return report


def passed(report: str) -> int:
    return int(report.strip().splitlines()[-1].split()[0])


@pytest.mark.timeout(200)
def test_spreeze_replay_passes_every_replay_check() -> None:
    d = make_ipc_dir("spzk-")
    endpoint = f"ipc://{d}/control"
    report = conformance("replay", endpoint, [sys.executable, "-m", "spreeze.services.replay"],
                         {"SPREEZE_CONTROL": endpoint, "SPREEZE_SERVICE_ID": "replay-under-test"})
    assert passed(report) >= 41 and "FAIL" not in report


@pytest.mark.timeout(200)
def test_spreeze_sampler_over_tcp_passes_every_sampler_check() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port_base()}"
    report = conformance("sampler", endpoint, cli("sampler", "--connect", endpoint, "--id", "sampler-under-test"))
    assert passed(report) >= 23 and "register.remote is true exactly over tcp" in report


@pytest.mark.timeout(200)
def test_the_minimal_example_sampler_passes_every_sampler_check() -> None:
    d = make_ipc_dir("spzk-")
    endpoint = f"ipc://{d}/control"
    report = conformance("sampler", endpoint, [sys.executable, str(EXAMPLE), endpoint, "minimal-under-test"])
    assert passed(report) >= 23


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_kit_fails_a_peer_that_breaks_the_spec() -> None:
    """A "replay" whose first message is a heartbeat, not a register: a FAIL line, exit 1."""
    d = make_ipc_dir("spzk-")
    endpoint = f"ipc://{d}/control"
    kit = subprocess.Popen(cli("conformance", "replay", endpoint, "--timeout", "20"), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, b"rogue")
        sock.connect(endpoint)
        time.sleep(0.5)
        sock.send_multipart(to_frames(Heartbeat("rogue", "running"), Encoder("rogue")))
        report, _ = kit.communicate(timeout=40)
    finally:
        stop(kit)
        ctx.destroy(linger=0)
    assert kit.returncode == 1, report
    assert "FAIL  §4.8 register: the first message on control is a valid `register`" in report
    assert report.strip().endswith("0 passed, 1 failed")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_minimal_example_beside_a_local_sampler_in_a_real_run(tmp_path: Path) -> None:
    """Its experience is in replay's ledger, nothing either sampler made is lost at the budget
    stop, and the two together take exactly warmup_steps random steps."""
    run, port = tmp_path / "run", free_port_base()
    listen = f"tcp://127.0.0.1:{port}"
    trainer = subprocess.Popen(cli("train", "--run-dir", str(run), *FAST, "sampler.warmup_steps=1500",
                                   "supervisor.heartbeat_interval=0.5", "--total-steps", "4000", "--listen", listen),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    example = subprocess.Popen([sys.executable, str(EXAMPLE), listen, "minimal-remote"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = trainer.communicate(timeout=240)
        ex_out, _ = example.communicate(timeout=30)
    finally:
        stop(trainer)
        stop(example)
    assert trainer.returncode == 0, out
    assert example.returncode == 0, ex_out
    [ledger] = records(run, "ledger")
    rows = ledger["samplers"]
    assert set(rows) == {"sampler-0", "minimal-remote"}, ledger
    assert rows["minimal-remote"]["stored"] > 0
    for sid, row in rows.items():
        assert row["made"] == row["stored"] and row["rejected"] == 0, (sid, row)
    assert sum(row["random"] for row in rows.values()) == 1500
    assert roster(run)["minimal-remote"]["state"] == "stopped"
    replay = [r for r in records(run, "metrics") if r.get("service") == "replay"][-1]
    assert replay["ledger/minimal-remote/inserted"] == rows["minimal-remote"]["stored"]
