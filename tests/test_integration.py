"""End to end: `spreeze train` starts real processes on real ipc:// sockets and learns.

Pendulum-v1 with tiny budgets (CleanRL-style smoke tests). A random policy scores about
-1200 to -1500 on Pendulum; a learning TD3 passes -800 within a few thousand steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import needs_cxx

LEARNED = -800.0  # "clearly beats random" (uniform random actions score about -1200)
REPLAYED = -1000.0  # the best checkpoint on fresh starts: its best evaluation was picked as the maximum of
# several, so a re-run of it scores lower (-814 over 2 episodes, after a best of about -700, was seen)
FAST = ["--env", "Pendulum-v1", "replay.min_size=1000", "sampler.warmup_steps=1000",
        "eval.every_updates=1000", "eval.episodes=3", "supervisor.progress_every=2"]


def train(run_dir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "spreeze.cli", "train", "--run-dir", str(run_dir), *FAST, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def records(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["kind"] == kind]


def best_eval(run_dir: Path) -> float:
    evals = records(run_dir, "eval")
    assert evals, "no evaluation was recorded"
    return max(e["return_mean"] for e in evals)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fused_and_split_both_learn_pendulum(tmp_path: Path) -> None:
    results = {}
    for mode in ("fused", "split"):
        run = tmp_path / mode
        proc = train(run, "--total-steps", "8000", f"learner.mode={mode}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "budget of 8,000 env steps reached" in proc.stdout
        results[mode] = best_eval(run)
        for e in records(run, "eval"):
            assert {"env_steps", "updates", "wall_time", "return_mean"} <= set(e)
        assert (run / "checkpoints" / "best.pt").is_file()
        assert (run / "config.yaml").is_file()
    ev = subprocess.run([sys.executable, "-m", "spreeze.cli", "eval", str(tmp_path / "fused"), "--episodes", "5"],
                        capture_output=True, text=True, timeout=120)
    assert ev.returncode == 0, ev.stderr
    assert "over 5 episodes" in ev.stdout
    assert float(ev.stdout.split("return ")[1].split()[0]) > REPLAYED, ev.stdout
    assert results["fused"] > LEARNED, results
    assert results["split"] > LEARNED, results
    # (8,000 steps: with 6,000, an eager fused run on a bare machine once peaked at -845.
    # How close the two come on 8,000 steps varies with the machine's load: one seed's best
    # evaluations of two learned runs differed by 150 to 620; both beating random is the claim)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_sac_split_learns_pendulum(tmp_path: Path) -> None:
    run = tmp_path / "sac"
    proc = train(run, "--algo", "sac", "--total-steps", "8000", "learner.mode=split")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert best_eval(run) > LEARNED  # (with 6,000 steps a run on a loaded machine once peaked at -869;
    # SAC on Pendulum turns from about -1200 to about -150 between 4,500 and 6,000 steps)
    alphas = [r["alpha"] for r in records(run, "metrics") if r.get("service") == "actor_learner" and "alpha" in r]
    assert alphas and alphas[-1] < 1.0  # the temperature was learned (starts at 1.0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sampler_killed_is_restarted_and_training_goes_on(tmp_path: Path) -> None:
    run = tmp_path / "kill"
    cmd = [sys.executable, "-m", "spreeze.cli", "train", "--run-dir", str(run), *FAST,
           "--total-steps", "4000", "supervisor.backoff=0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pid = wait_for(lambda: registered_pid(run, "sampler-0"), 90)
        steps_before = wait_for(lambda: env_steps(run) if env_steps(run) >= 512 else None, 90)
        os.kill(pid, signal.SIGKILL)
        new_pid = wait_for(lambda: p if (p := registered_pid(run, "sampler-0")) not in (None, pid) else None, 60)
        assert new_pid != pid
        out, _ = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    restarts = [e for e in records(run, "event") if e.get("event") == "restart"]
    assert any(e.get("service") == "sampler-0" for e in restarts), restarts
    assert env_steps(run) >= 4000 > steps_before
    assert json.loads((run / "services.json").read_text())["sampler-0"]["restarts"] == 1


def registered_pid(run: Path, sid: str) -> int | None:
    try:
        row = json.loads((run / "services.json").read_text())[sid]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None
    return row["pid"] if row["state"] == "running" else None


def env_steps(run: Path) -> int:
    rows = [r for r in records(run, "metrics") if r.get("service") == "replay"]
    return rows[-1]["inserted"] if rows else 0


def updates(run: Path) -> int:
    rows = [r for r in records(run, "metrics") if r.get("service") == "learner"]
    return rows[-1].get("updates", 0) if rows else 0


def wait_for(probe, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(0.2)
    raise AssertionError(f"condition not met within {timeout}s")


@pytest.mark.parametrize("override, named", [
    ("replay.capacity=-5", "replay.capacity=-5"),
    ("learner.mode=sideways", "learner.mode='sideways'"),
    ("td3.tau=1.5", "td3.tau=1.5"),
    ("replay.capcity=10", "replay.capcity"),
    ("learner.batch_size=big", "learner.batch_size='big'"),
])
def test_bad_config_values_are_refused_by_name(tmp_path: Path, override: str, named: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "spreeze.cli", "train", "--run-dir", str(tmp_path / "r"),
                           override], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert named in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()  # refused before anything started


def test_unknown_env_is_refused_by_name(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "spreeze.cli", "train", "--env", "NoSuchEnv-v9",
                           "--run-dir", str(tmp_path / "r")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "NoSuchEnv-v9" in proc.stderr


@pytest.mark.slow
@needs_cxx
@pytest.mark.timeout(200)
def test_ctrl_c_while_the_steps_compile_stops_at_once_with_a_checkpoint(tmp_path: Path) -> None:
    """The learner updates eagerly while its steps compile (cold: an empty compile cache); a
    Ctrl-C then does not wait for the compile to end."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "spreeze.cli", "train", "--run-dir", str(run), *FAST, "--total-steps", "1000000",
           "learner.compile=true", "learner.compile_cache=run", "learner.mode=fused", "td3.hidden=[256,256]"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def compiling_and_updating() -> bool | None:
            rows = [r for r in records(run, "metrics") if r.get("service") == "learner"]
            return True if rows and rows[-1].get("compiling") and rows[-1].get("updates", 0) > 0 else None
        wait_for(compiling_and_updating, 90)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert took < 15, f"the stop took {took:.0f} s: it waited for the compile"
    assert (run / "checkpoints" / "learner.pt").is_file()  # the eager updates' state, saved on the way out


@pytest.mark.timeout(200)
def test_sigint_stops_every_service_cleanly_exits_130_and_prints_the_resume_command(tmp_path: Path) -> None:
    """Ctrl-C once the learner updates: every service stops (the learner checkpoints), the
    shell's status for an interrupted command, and the exact command that continues the run."""
    run = tmp_path / "ctrl c"  # a space: the printed command quotes it
    cmd = [sys.executable, "-m", "spreeze.cli", "train", "--run-dir", str(run), *FAST, "--total-steps", "1000000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: True if updates(run) > 0 else None, 90)  # a checkpoint needs an update first
        pids = {sid: row["pid"] for sid, row in json.loads((run / "services.json").read_text()).items()}
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "stopped: signal SIGINT" in out
    assert out.strip().splitlines()[-1] == (f"spreeze train: interrupted; continue with: "
                                            f"spreeze train --resume '{run}'"), out
    assert "Traceback" not in out, out
    for sid, pid in pids.items():
        assert not pid_alive(pid), f"{sid} (pid {pid}) still runs"
    assert (run / "checkpoints" / "learner.pt").is_file()  # final learner checkpoint on shutdown


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie awaiting its parent counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"
