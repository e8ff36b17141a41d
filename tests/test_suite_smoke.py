"""A short `spreeze train` on each locomotion task beyond HalfCheetah (which the bare-machine
and compose tests run): the plan sizes the networks from the task, every service runs on
real sockets (split learners on two cores, for networks that wide), and the run evaluates and
checkpoints with no restart.

Learning itself is measured by `spreeze results` and `spreeze bench learning` (minutes to
hours per task), not here. The updates run eagerly to keep this short: compiling 256-256
steps takes about 30 s on 2 cores, and tests/test_compiled.py covers the compiled steps.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SHORT = ["--total-steps", "2000", "sampler.warmup_steps=1000", "replay.min_size=1000", "eval.every_updates=400",
         "eval.episodes=1", "eval.video_every=0", "learner.compile=false", "visualizer.enabled=false"]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("algo, env", [("td3", "Hopper-v5"), ("sac", "Walker2d-v5"), ("td3", "Ant-v5")])
def test_short_run_on_each_task(tmp_path: Path, algo: str, env: str) -> None:
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "spreeze.cli", "train", "--env", env, "--algo", algo,
                           "--run-dir", str(run), *SHORT], capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "budget of 2,000 env steps reached" in proc.stdout, proc.stdout[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    events = [r for r in rows if r["kind"] == "event"]
    plan = {e["key"]: e["value"] for e in events if e["event"] == "plan"}
    assert plan.get(f"{algo}.hidden") == [256, 256], plan  # the task ends episodes when the agent falls
    if len(os.sched_getaffinity(0)) >= 2:  # networks that wide: critic and actor learners on two cores
        assert plan.get("learner.mode") == "split", plan
    assert not [e for e in events if e["event"] == "restart"], events
    evals = [r for r in rows if r["kind"] == "eval"]
    assert evals and all(math.isfinite(e["return_mean"]) and e["length_mean"] >= 1 for e in evals), evals
    assert (run / "checkpoints" / "best.pt").is_file() and (run / "checkpoints" / "latest.pt").is_file()
