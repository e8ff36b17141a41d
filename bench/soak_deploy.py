"""Where `spreeze bench soak` runs its training, and how it reaches each part to fault it.

`Local`: `spreeze train` with every service a local process (listening on loopback) and a
remote sampler process attached over tcp://; a SIGKILLed supervisor is followed by
`spreeze train --resume`. `Compose`: `docker compose up` (the cpu profile) on the real
engine, a sampler container outside the project attached over the published ports, each
fault applied to a container's main process from the host; compose restarts what dies
(the supervisor with `--or-resume`). Both give host pids, so memory and handles are read
from /proc the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from spreeze.bench import engine
from spreeze.proto.names import ACTOR_LEARNER, CRITIC_LEARNER, EVALUATOR, LEARNER, REPLAY, SAMPLER, VISUALIZER

EXIT_WAIT_S = 60.0  # the services of a killed supervisor exit within this (they hear nothing for `liveness`)
PROJECT = "spreezesoak"  # the compose project of a soak: its containers and volumes carry this name
OUTSIDE = f"{PROJECT}-outside-sampler"  # the compose soak's remote sampler: a container outside the project
STOP_WAIT_S = 180.0  # a SIGTERMed hub stops its containers within this


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


class Local:
    """Every service a local process of `spreeze train`; a remote sampler process over tcp://."""

    def __init__(self, run_dir: Path, env: str, algo: str, duration: float, port: int, mode: str,
                 overrides: list[str]) -> None:
        self.run_dir, self.duration = run_dir, duration
        self.listen = f"tcp://127.0.0.1:{port}"
        self.learner = LEARNER if mode == "fused" else CRITIC_LEARNER
        self.learners = [LEARNER] if mode == "fused" else [CRITIC_LEARNER, ACTOR_LEARNER]
        self.train_cmd = [sys.executable, "-m", "spreeze.cli", "train", "--env", env, "--algo", algo,
                          "--run-dir", str(run_dir), "--total-steps", str(10**9), "--time-limit", f"{duration:.0f}",
                          "--listen", self.listen, "--quiet", f"learner.mode={mode}", *overrides]
        self.train: subprocess.Popen[bytes] | None = None
        self.remote: subprocess.Popen[bytes] | None = None
        self.sessions = 0

    def targets(self) -> dict[str, str]:
        return {"sampler": f"{SAMPLER}-0", "replay": REPLAY, "evaluator": EVALUATOR, "visualizer": VISUALIZER}

    def start(self) -> None:
        self.run_dir.parent.mkdir(parents=True, exist_ok=True)
        self._train(self.train_cmd)

    def _train(self, cmd: list[str]) -> None:
        log = open(self.run_dir.parent / f"train-{self.sessions}.log", "wb")
        self.train = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.sessions += 1

    def roster(self) -> dict[str, dict[str, Any]]:
        try:
            rows: dict[str, dict[str, Any]] = json.loads((self.run_dir / "services.json").read_text())
            return rows
        except (OSError, ValueError):
            return {}

    def pid(self, target: str) -> int | None:
        """The process of a running service (not one a killed supervisor's roster still lists)."""
        row = self.roster().get(target, {})
        pid = row.get("pid")
        return pid if row.get("state") == "running" and isinstance(pid, int) and alive(pid) else None

    def processes(self) -> dict[str, int]:
        pids = {sid: row["pid"] for sid, row in self.roster().items()
                if not row.get("remote") and isinstance(row.get("pid"), int)}
        if self.train is not None and self.train.poll() is None:
            pids["supervisor"] = self.train.pid
        if self.remote is not None and self.remote.poll() is None:
            pids["remote-sampler"] = self.remote.pid
        return pids

    def start_remote(self) -> None:
        log = open(self.run_dir.parent / "remote-sampler.log", "ab")
        self.remote = subprocess.Popen([sys.executable, "-m", "spreeze.cli", "sampler", "--connect", self.listen],
                                       stdout=log, stderr=subprocess.STDOUT)

    def stop_remote(self) -> None:
        assert self.remote is not None
        self.remote.terminate()
        self.remote.wait(EXIT_WAIT_S)

    def remote_running(self) -> bool:
        return any(row.get("remote") and row.get("state") == "running" for row in self.roster().values())

    def kill_supervisor(self, until: Any, left_s: float) -> str:
        """SIGKILL the supervisor; once its services are gone (they stop hearing it), --resume.
        A note ("" if none)."""
        assert self.train is not None
        rows = self.roster().values()
        services = [p for row in rows if not row.get("remote") and isinstance(p := row.get("pid"), int)]
        self.train.kill()
        self.train.wait()
        note = ""
        if until(lambda: not any(alive(p) for p in services), EXIT_WAIT_S) is None:
            note = "services outlived their supervisor: killed"
            for p in services:
                if alive(p):
                    os.kill(p, signal.SIGKILL)
        self._train([sys.executable, "-m", "spreeze.cli", "train", "--resume", str(self.run_dir),
                     "--time-limit", f"{max(60.0, left_s + 30):.0f}", "--quiet"])
        return note

    def stop(self) -> int | None:
        """SIGTERM to the run (a clean end); its exit status."""
        if self.train is None:
            return None
        self.train.send_signal(signal.SIGTERM)
        return self.train.wait(180)

    def close(self) -> None:
        for proc in (self.train, self.remote):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()


class Compose:
    """`docker compose up` of the cpu profile in project PROJECT; the remote sampler a container
    outside it on the host network, attached over the published ports."""

    def __init__(self, env: str, algo: str, duration: float, samplers: int) -> None:
        self.env = {"COMPOSE_PROFILES": "cpu", "SPREEZE_ENV": env, "SPREEZE_ALGO": algo, "SPREEZE_RUN": "soak",
                    "SPREEZE_TOTAL_STEPS": str(10**9), "SPREEZE_SAMPLERS": str(samplers),
                    "SPREEZE_BASE_IMAGE": engine.GL_IMAGE}
        self.samplers = samplers
        self.learner = CRITIC_LEARNER
        self.learners = [f"{CRITIC_LEARNER}_cpu", f"{ACTOR_LEARNER}_cpu"]
        self.duration = duration
        self.sessions = 1
        self.run_dir = Path("/nonexistent")

    def targets(self) -> dict[str, str]:
        return {"sampler": SAMPLER, "replay": REPLAY, "evaluator": EVALUATOR, "visualizer": VISUALIZER}

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        return engine.compose(PROJECT, *args, env=self.env, timeout=timeout, check=check)

    def start(self) -> None:
        self.compose("down", "-v", "--remove-orphans", check=False)
        engine.sh("docker", "rm", "-f", OUTSIDE, check=False)
        self.compose("up", "-d", "--scale", f"sampler={self.samplers}", timeout=900)
        mount = json.loads(engine.sh("docker", "volume", "inspect", f"{PROJECT}_runs").stdout)[0]["Mountpoint"]
        self.run_dir = Path(mount) / "soak"  # the runs volume on the host (root reads it directly)

    def containers(self) -> list[dict[str, Any]]:
        ids = engine.sh("docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}").stdout.split()
        return json.loads(engine.sh("docker", "inspect", *ids).stdout) if ids else []

    def pid(self, target: str) -> int | None:
        """The host pid of the first running container of the compose service `target`."""
        for c in sorted(self.containers(), key=lambda c: c["Name"]):
            if c["Config"]["Labels"].get("com.docker.compose.service") == target and c["State"]["Running"]:
                return int(c["State"]["Pid"]) or None
        return None

    def processes(self) -> dict[str, int]:
        pids = {}
        for c in self.containers():
            labels = c["Config"]["Labels"]
            name = labels.get("com.docker.compose.service", c["Name"])
            if c["State"]["Running"]:
                pids[f"{name}-{labels.get('com.docker.compose.container-number', '1')}"] = int(c["State"]["Pid"])
        remote = self.remote_pid()
        if remote:
            pids["remote-sampler"] = remote
        return pids

    def remote_pid(self) -> int | None:
        done = engine.sh("docker", "inspect", OUTSIDE, check=False)
        if done.returncode != 0:
            return None
        state = json.loads(done.stdout)[0]["State"]
        return int(state["Pid"]) if state["Running"] else None

    def start_remote(self) -> None:
        if engine.sh("docker", "start", OUTSIDE, check=False).returncode != 0:
            engine.sh("docker", "run", "-d", "--name", OUTSIDE, "--network", "host", engine.CPU_IMAGE, "spreeze",
                      "sampler", "--connect", "tcp://127.0.0.1:5555", "--id", "sampler-outside")

    def stop_remote(self) -> None:
        engine.sh("docker", "stop", OUTSIDE, timeout=120)

    def remote_running(self) -> bool:
        try:
            rows = json.loads((self.run_dir / "services.json").read_text())
        except (OSError, ValueError):
            return False
        return rows.get("sampler-outside", {}).get("state") == "running" and self.remote_pid() is not None

    def kill_supervisor(self, until: Any, left_s: float) -> str:
        """SIGKILL the supervisor container's main process: compose restarts it, and it resumes."""
        pid = self.pid("supervisor")
        if pid is None:
            return "not running at the time: skipped"
        os.kill(pid, signal.SIGKILL)
        self.sessions += 1
        return ""

    def stop(self) -> int | None:
        """SIGTERM to the supervisor's main process (a clean end: it stops the services in order, and
        they exit 0); its exit status. What is still up after STOP_WAIT_S is stopped by compose."""
        pid = self.pid("supervisor")
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while self.pid("supervisor") is not None and time.monotonic() < deadline:
            time.sleep(1)
        engine.sh("docker", "stop", OUTSIDE, timeout=120, check=False)
        self.compose("stop", timeout=300)
        ids = engine.sh("docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}",
                        "--filter", "label=com.docker.compose.service=supervisor").stdout.split()
        return int(json.loads(engine.sh("docker", "inspect", *ids).stdout)[0]["State"]["ExitCode"]) if ids else None

    def close(self) -> None:
        engine.sh("docker", "rm", "-f", OUTSIDE, check=False)
        self.compose("down", "-v", "--remove-orphans", timeout=300, check=False)
