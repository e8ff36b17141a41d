"""The services of a local run (`roster`), their child processes, and the restart policy with backoff."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from spreeze.common.config import Config
from spreeze.proto.names import ACTOR_LEARNER, CRITIC_LEARNER, EVALUATOR, LEARNER, REPLAY, SAMPLER, VISUALIZER


@dataclass
class ServiceSpec:
    """One service of the run: its id, role, module and process environment."""

    service_id: str
    role: str
    module: str  # run as `python -m <module>`
    threads: int = 1  # OMP/MKL threads for this process
    nice: int = 0  # added to the process's niceness: > 0 yields the CPU to the services that train


# The evaluator and visualizer report on training and need no CPU for it to go on: at a higher
# niceness they leave the cores to the learner's compile at start-up and to its updates later.
OBSERVER_NICE = 5


def service(role: str, service_id: str = "", threads: int = 1, nice: int = 0) -> ServiceSpec:
    """A service of `role`, run as `python -m spreeze.services.<role>` (id: the role, unless given)."""
    return ServiceSpec(service_id or role, role, f"spreeze.services.{role}", threads, nice)


def roster(cfg: Config) -> list[ServiceSpec]:
    """The services of a local run, in start order: those that train first, then the observers
    (none in hub mode: they register on their own)."""
    if cfg.supervisor.mode == "hub":
        return []
    threads = cfg.learner.threads
    specs = [service(REPLAY)]
    if cfg.learner.mode == "fused":
        specs.append(service(LEARNER, threads=threads))
    else:
        specs += [service(CRITIC_LEARNER, threads=threads), service(ACTOR_LEARNER, threads=threads)]
    specs += [service(SAMPLER, f"{SAMPLER}-{i}") for i in range(cfg.sampler.num_samplers)]
    specs.append(service(EVALUATOR, nice=OBSERVER_NICE))
    if cfg.visualizer.enabled:
        specs.append(service(VISUALIZER, nice=OBSERVER_NICE))
    return specs


@dataclass
class Child:
    """A service process and what the supervisor knows of it."""

    spec: ServiceSpec
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    registered: bool = False
    last_heartbeat: float = 0.0
    state: str = "starting"
    counters: dict = field(default_factory=dict)
    restarts: deque[float] = field(default_factory=deque)  # restart times within the window
    total_restarts: int = 0
    restart_at: float = 0.0  # when a pending restart is due (0 = none pending)
    last_error: str = ""  # the last line of its log when it last crashed ("" = never crashed)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def core_sets(learners: list[str], threads: int, cores: list[int]) -> dict[str, frozenset[int]]:
    """CPU affinity per service id for `learner.own_cores`: each learner process its own
    `threads` cores (the last ones), every other service (key "") the cores left. Empty
    when that leaves no core for the others: then nothing is pinned."""
    need = len(learners) * threads
    if need >= len(cores):
        return {}
    rest, mine = cores[:-need], cores[-need:]
    sets = {sid: frozenset(mine[i * threads:(i + 1) * threads]) for i, sid in enumerate(learners)}
    return {**sets, "": frozenset(rest)}


def spawn(spec: ServiceSpec, control: str, log_dir: Path, extra_env: dict[str, str],
          cpus: frozenset[int] = frozenset()) -> subprocess.Popen[bytes]:
    """Start one service as `python -m module` in its own session, logging to a file, at its
    spec's niceness; with `cpus`, on those cores only. Both are set right after the fork,
    while the child still imports (its threads, started later, inherit them)."""
    env = dict(os.environ)
    env.pop("SPREEZE_HEALTH", None)  # the health socket is the supervisor's (e.g. a container's main process)
    env.update(extra_env)
    env.update({"SPREEZE_CONTROL": control, "SPREEZE_SERVICE_ID": spec.service_id,
                "OMP_NUM_THREADS": str(spec.threads), "MKL_NUM_THREADS": str(spec.threads)})
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{spec.service_id}.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", spec.module], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # Ctrl-C reaches the supervisor only
    try:
        if spec.nice:
            os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + spec.nice)
        if cpus:
            os.sched_setaffinity(proc.pid, cpus)
    except OSError:  # gone already: the watch loop sees it exit
        pass
    return proc


LOG_TAIL_BYTES = 8192  # read from the end of a service's log for its last line (a traceback's last line fits)
LOG_LINE_MAX = 300  # characters of that line a console line quotes


def last_log_line(path: Path) -> str:
    """The last non-empty line of a service's log (a crash's last traceback line, e.g. the
    ConfigError message), shortened; "" when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES, 0))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= LOG_LINE_MAX else line[:LOG_LINE_MAX - 3] + "..."


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int  # restarts allowed within `window` seconds
    window: float
    backoff: float  # first delay, doubled per restart in the window

    def next_delay(self, child: Child, now: float) -> float | None:
        """Seconds to wait before restarting, or None to give up."""
        while child.restarts and now - child.restarts[0] > self.window:
            child.restarts.popleft()
        if len(child.restarts) >= self.max_restarts:
            return None
        return self.backoff * (2 ** len(child.restarts))


KILL_WAIT = 5.0  # seconds to reap a process after SIGKILL (one in uninterruptible sleep may take a while)


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """`sig` to a service and to every process it started (env workers, compile workers): it
    runs in its own session (spawn), so its process group id is its pid."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def terminate(children: list[Child], timeout: float) -> None:
    """SIGTERM to each child's process group, wait up to `timeout`, then SIGKILL what is left of
    the group (the service and whatever it started), so that nothing it started outlives it.
    Bounded: a process that cannot be reaped KILL_WAIT seconds after SIGKILL is left behind."""
    for child in children:
        if child.alive:
            signal_group(child.proc, signal.SIGTERM)  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout
    for child in children:
        if child.proc is None:
            continue
        try:
            child.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        signal_group(child.proc, signal.SIGKILL)  # its helpers too, the service itself if it still runs
        try:
            child.proc.wait(KILL_WAIT)
        except subprocess.TimeoutExpired:
            pass
