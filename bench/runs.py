"""Shared by the benchmarks that train: run `spreeze train` once and read its run directory.

A run directory's metrics.jsonl is appended to by every run that used the directory; the
readers here return only the newest run's records (from its last ``start`` record on).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from spreeze.common.algorithms import algorithm, registered

ROOT = Path(__file__).resolve().parents[1]
FINISHED = "bench-run.json"  # in a run directory whose `spreeze train` finished: its seconds and the commit
STOP_TIMEOUT_S = 60.0  # a terminated run's supervisor stops its services within this, or it is killed

# The score each task counts as learned within 100k env steps (deterministic evaluation).
THRESHOLDS = {"HalfCheetah-v5": 3000.0, "Hopper-v5": 1000.0, "Walker2d-v5": 1000.0, "Ant-v5": 1000.0}


def settings_key(fields: dict[str, Any], length: int) -> str:
    """A short, stable hash of the settings that define a benchmark's runs (names their files)."""
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:length]


def train_command(env: str, algo: str, seed: int, total_steps: int, run_dir: Path,
                  config: str | None, overrides: list[str], network: str | None = None) -> list[str]:
    """The `spreeze train` command line of one quiet run (``network``: None = the config's)."""
    cmd = [sys.executable, "-m", "spreeze.cli", "train", "--env", env, "--algo", algo, "--seed", str(seed),
           "--total-steps", str(total_steps), "--run-dir", str(run_dir), "--quiet", *overrides]
    if network:
        cmd += ["--network", network]
    if config:
        cmd += ["--config", config]
    return cmd


def run_seed(env: str, algo: str, seed: int, total_steps: int, run_dir: Path,
             config: str | None, overrides: list[str], network: str | None = None) -> dict[str, Any]:
    """Train one seed to completion; its evaluations, the command's wall-clock seconds and
    ``start_s``, the seconds from the command's start to the run's (its records' clock).

    Raises ``RuntimeError`` (with the end of stderr) when the run fails.
    """
    cmd = train_command(env, algo, seed, total_steps, run_dir, config, overrides, network)
    t0 = time.time()
    returncode, stderr = run_to_end(cmd)
    wall = time.time() - t0
    if returncode != 0:
        raise RuntimeError(f"seed {seed} failed ({returncode}): {stderr[-2000:]}")
    evals, started = read_evals(run_dir)
    for e in evals:  # seconds since the command was typed, start-up included
        e["since_command"] = started - t0 + e["wall_time"]
    finished = {"command_wall_s": wall, "start_s": started - t0, "commit": git_commit()}
    (run_dir / FINISHED).write_text(json.dumps(finished))
    return {"seed": seed, "run_dir": str(run_dir), "command_wall_s": wall, "start_s": started - t0,
            "evals": evals}


def finished_seed(run_dir: Path) -> dict[str, Any] | None:
    """What `run_seed` measured in ``run_dir`` when this commit's code finished a run there
    before (``kept``: true), so a benchmark stopped and run again trains only what is left;
    None when there is none, and then a run directory left unfinished (or by other code) is
    removed, so the seed trains afresh rather than being refused as a taken directory."""
    try:
        done = json.loads((run_dir / FINISHED).read_text())
    except (OSError, ValueError):
        done = None
    if isinstance(done, dict) and done.get("commit") == git_commit():  # (outside git: None on both sides)
        return {"command_wall_s": float(done["command_wall_s"]), "start_s": float(done["start_s"]), "kept": True}
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return None


def git_commit() -> str | None:
    """HEAD of the repository this code runs from (None without git or a repository)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = out.stdout.strip() if out.returncode == 0 else ""
    return commit or None


class Terminated(SystemExit):
    """SIGTERM arrived while a run was training (exit status 128 + 15, as the signal's)."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def run_to_end(cmd: list[str]) -> tuple[int, str]:
    """Run a `spreeze train` command to its end: (exit status, stderr).

    Stopped early (Ctrl-C, or SIGTERM to this process alone, as from ``kill`` or a job
    scheduler), it stops the run first: SIGTERM to the training command, whose supervisor
    then stops its services, a kill after ``STOP_TIMEOUT_S``; then the interruption goes on
    up. Without this a terminated benchmark would leave its run training on, orphaned.
    """
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            try:
                _, stderr = proc.communicate()
            except BaseException:
                proc.terminate()
                try:
                    proc.communicate(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                raise
            return proc.returncode, stderr
    finally:
        signal.signal(signal.SIGTERM, previous)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The newest run's records of ``run_dir/metrics.jsonl`` (from its last ``start`` record)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    starts = [i for i, r in enumerate(rows) if r["kind"] == "start"]
    if not starts:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no start record")
    return rows[starts[-1]:]


def read_evals(run_dir: Path) -> tuple[list[dict[str, Any]], float]:
    """The newest run's evaluation records and its start time (unix seconds)."""
    rows = read_metrics(run_dir)
    return [r for r in rows if r["kind"] == "eval"], rows[0]["unix_time"]


def first_reaching(evals: list[dict[str, Any]], threshold: float | None) -> dict[str, Any] | None:
    """The first evaluation whose mean return is >= ``threshold`` (None: none did, or no threshold)."""
    if threshold is None:
        return None
    return next((e for e in evals if e["return_mean"] >= threshold), None)


def median_reached(values: list[float | None]) -> float | None:
    """Median over seeds of a to-threshold value; a seed that never reached it counts as
    infinite, so the median is None unless most seeds reached it."""
    if not values:
        return None
    m = statistics.median(v if v is not None else float("inf") for v in values)
    return None if m == float("inf") else m


def algo_arg(text: str) -> str:
    """An ``--algo`` value: a registered algorithm's name or a module path defining ALGORITHM."""
    try:
        algorithm(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


ALGO_HELP = f"{' | '.join(registered())} | a module path defining ALGORITHM"
