"""`spreeze bench soak`, short: every fault of the rotation once on a real run (real processes,
a remote sampler over tcp://, a SIGKILLed supervisor resumed), each recovered, the ledger
reconciled and the report written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import free_port_base


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_short_soak_recovers_from_every_fault_and_the_ledger_reconciles(tmp_path: Path) -> None:
    report = tmp_path / "reliability.md"
    cmd = [sys.executable, "-m", "spreeze.cli", "bench", "soak", "--minutes", "3.2", "--every", "8", "--pause", "6",
           "--remote-off", "5", "--sample", "2", "--env", "Pendulum-v1", "--port", str(free_port_base()),
           "--run-dir", str(tmp_path / "soak" / "run"), "--report", str(report),
           "replay.min_size=1000", "sampler.warmup_steps=1000", "eval.every_updates=2000"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    text = report.read_text()
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| fault") and "RSS" not in line}
    for fault in ("SIGKILL sampler-0", "SIGKILL replay", "SIGKILL learner", "SIGSTOP learner", "SIGKILL evaluator",
                  "SIGKILL visualizer", "stop remote sampler", "SIGKILL supervisor"):
        assert fault in rows, text
        count, recovered = (int(v) for v in rows[fault])
        assert count >= 1 and recovered == count, (fault, text)
    assert "2 supervisor sessions" in text and "exit status 0" in text
    for service in ("replay", "learner", "sampler-0", "remote-sampler", "supervisor", "evaluator", "visualizer"):
        assert f"| {service} |" in text, text
