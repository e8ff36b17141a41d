"""`spreeze bench soak`: a long run under faults in rotation: recovery times, memory and handles, the ledger.

It starts `spreeze train` (every service a local process, listening on loopback) with one
remote sampler attached over tcp://, and every `--every` seconds applies the next fault of
the rotation:

    sigkill <service>   SIGKILL of the sampler, replay, learner(s), evaluator and visualizer,
                        each in turn (the supervisor restarts it)
    pause learner       SIGSTOP of the learner for `--pause` seconds, then SIGCONT
    stop remote         the remote sampler stopped (SIGTERM) for `--remote-off` seconds, then
                        started again
    sigkill supervisor  the whole run's supervisor: its services exit when they stop hearing
                        it, and `spreeze train --resume` continues the run

A fault is recovered once the service runs again (a new process in services.json, the
paused one heard again, the remote sampler registered again) and both replay's inserts and
the learner's updates rise again; the time counts from the fault (for a pause: from the
SIGSTOP, so it includes the pause unless the supervisor replaced the silent learner first). Every
`--sample` seconds each service's resident memory, open file descriptors and sockets are
read from /proc. At the end the run is stopped with SIGTERM and the ledger (env steps each
sampler made against those replay stored) must reconcile. The report, a markdown table per
fault kind and per service, goes to `--report` (results/reliability.md).

    spreeze bench soak --minutes 20 [--every 120] [--env HalfCheetah-v5] [key=value ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spreeze.bench.results import git_commit, machine_info
from spreeze.services.supervisor.ledger import balanced

REPORT = Path("results") / "reliability.md"
RECOVERY_TIMEOUT_S = 120.0  # a fault not recovered within this counts as not recovered
EXIT_WAIT_S = 60.0  # the services of a killed supervisor exit within this (they hear nothing for `liveness`)


@dataclass
class Fault:
    kind: str  # sigkill | pause | stop | sigkill-supervisor
    target: str  # service id (or "remote", "supervisor")
    at_s: float = 0.0  # seconds into the soak
    recovered_s: float | None = None
    note: str = ""

    @property
    def name(self) -> str:
        return {"sigkill": f"SIGKILL {self.target}", "pause": f"SIGSTOP {self.target}",
                "stop": f"stop {self.target} sampler", "sigkill-supervisor": "SIGKILL supervisor"}[self.kind]


@dataclass
class Sample:
    t: float
    pid: int
    rss_mb: float
    fds: int
    sockets: int


@dataclass
class Soak:
    run_dir: Path
    train_cmd: list[str]
    remote_cmd: list[str]
    duration: float
    pause_s: float
    remote_off_s: float
    t0: float = field(default_factory=time.monotonic)
    train: subprocess.Popen[bytes] | None = None
    remote: subprocess.Popen[bytes] | None = None
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    offset: int = 0  # bytes of metrics.jsonl read so far
    counts: tuple[int, int] = (0, 0)  # newest (env_steps, updates) of the progress records
    resumes: int = 0
    learner: str = "learner"  # the learner whose updates count (critic-learner when split)

    # ------------------------------------------------------------ the processes
    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def start_train(self, cmd: list[str]) -> None:
        log = open(self.run_dir.parent / f"train-{self.resumes}.log", "wb")
        self.train = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def start_remote(self) -> None:
        log = open(self.run_dir.parent / "remote-sampler.log", "ab")
        self.remote = subprocess.Popen(self.remote_cmd, stdout=log, stderr=subprocess.STDOUT)

    def roster(self) -> dict[str, dict[str, Any]]:
        try:
            rows: dict[str, dict[str, Any]] = json.loads((self.run_dir / "services.json").read_text())
            return rows
        except (OSError, ValueError):
            return {}

    def pid(self, sid: str) -> int | None:
        """The process of a running service (not one a killed supervisor's roster still lists)."""
        row = self.roster().get(sid, {})
        pid = row.get("pid")
        return pid if row.get("state") == "running" and isinstance(pid, int) and alive(pid) else None

    def progress(self) -> tuple[int, int]:
        """Newest (rows replay inserted, learner updates) of its metrics records (about one a second;
        a restarted replay or learner starts again from its snapshot or checkpoint)."""
        path = self.run_dir / "metrics.jsonl"
        try:
            with open(path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return self.counts
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("kind") != "metrics":
                continue
            if row.get("service") == "replay" and "inserted" in row:
                self.counts = (int(row["inserted"]), self.counts[1])
            elif row.get("service") in ("learner", "critic-learner") and "updates" in row:
                self.counts = (self.counts[0], int(row["updates"]))
        return self.counts

    def advancing(self) -> Any:
        """A test that is true once experience and updates both rose between two readings (a
        reading that went back, a restored snapshot or checkpoint, starts the comparison again)."""
        base = [self.progress()]

        def test() -> bool:
            now = self.progress()
            if now[0] > base[0][0] and now[1] > base[0][1]:
                return True
            if now[0] < base[0][0] or now[1] < base[0][1]:
                base[0] = now
            return False
        return test

    # ------------------------------------------------------------ memory and handles
    def sample(self) -> None:
        now = self.elapsed
        pids = {sid: row.get("pid") for sid, row in self.roster().items() if not row.get("remote")}
        if self.train is not None and self.train.poll() is None:
            pids["supervisor"] = self.train.pid
        if self.remote is not None and self.remote.poll() is None:
            pids["remote-sampler"] = self.remote.pid
        for sid, pid in pids.items():
            got = proc_sample(pid, now) if isinstance(pid, int) else None
            if got is not None:
                self.samples.setdefault(sid, []).append(got)

    def wait(self, seconds: float, sample_every: float) -> None:
        """Sleep `seconds`, sampling memory on the way."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.sample()
            time.sleep(min(left, sample_every))

    def until(self, done: Any, sample_every: float, timeout: float = RECOVERY_TIMEOUT_S) -> float | None:
        """Seconds until `done()` is true (None: not within `timeout`), polling every 0.25 s."""
        t0, last_sample = time.monotonic(), 0.0
        while time.monotonic() - t0 < timeout:
            if done():
                return time.monotonic() - t0
            if time.monotonic() - last_sample >= sample_every:
                self.sample()
                last_sample = time.monotonic()
            time.sleep(0.25)
        return None

    # ------------------------------------------------------------ faults
    def apply(self, fault: Fault, every: float) -> None:
        """Apply `fault` and wait (bounded) for the run to recover; its time and notes go in `fault`."""
        fault.at_s = self.elapsed
        if fault.kind in ("sigkill", "pause"):
            pid = self.pid(fault.target)
            if pid is None:
                fault.note = "not running at the time: skipped"
                return
            (self.kill if fault.kind == "sigkill" else self.pause)(fault, pid, every)
        elif fault.kind == "stop":
            self.stop_remote(fault, every)
        else:
            self.kill_supervisor(fault, every)
        if fault.recovered_s is not None and fault.kind != "pause":  # (a pause's: from the SIGSTOP)
            fault.recovered_s = self.elapsed - fault.at_s  # from the fault itself (the stop's wait included)

    def back(self, running: Any, every: float) -> float | None:
        """Once `running()`: seconds until inserts and updates rise again (None: not in time)."""
        return self.until(self.advancing(), every) if self.until(running, every) is not None else None

    def kill(self, fault: Fault, pid: int, every: float) -> None:
        os.kill(pid, signal.SIGKILL)
        fault.recovered_s = self.back(lambda: self.pid(fault.target) not in (None, pid), every)

    def pause(self, fault: Fault, pid: int, every: float) -> None:
        os.kill(pid, signal.SIGSTOP)
        rising = self.advancing()
        during = self.until(rising, every, timeout=self.pause_s)  # the supervisor may replace it meanwhile
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        if during is None:
            after = self.until(rising, every) if self.until(lambda: self.pid(fault.target), every) else None
            fault.recovered_s = None if after is None else self.pause_s + after
        else:
            fault.recovered_s = during
        if self.pid(fault.target) != pid:
            fault.note = "the supervisor restarted it (silent past its liveness)"

    def stop_remote(self, fault: Fault, every: float) -> None:
        assert self.remote is not None
        self.remote.terminate()
        self.remote.wait(EXIT_WAIT_S)
        self.wait(self.remote_off_s, every)
        self.start_remote()
        fault.recovered_s = self.back(self.remote_running, every)

    def kill_supervisor(self, fault: Fault, every: float) -> None:
        """SIGKILL the supervisor; once its services are gone (they stop hearing it), --resume."""
        assert self.train is not None
        rows = self.roster().values()
        services = [p for row in rows if not row.get("remote") and isinstance(p := row.get("pid"), int)]
        self.train.kill()
        self.train.wait()
        if self.until(lambda: not any(alive(p) for p in services), every, EXIT_WAIT_S) is None:
            fault.note = "services outlived their supervisor: killed"
            for p in services:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
        self.resumes += 1
        left = max(60.0, self.duration - self.elapsed + 30)
        self.start_train([sys.executable, "-m", "spreeze.cli", "train", "--resume", str(self.run_dir),
                          "--time-limit", f"{left:.0f}", "--quiet"])
        fault.recovered_s = self.back(lambda: self.pid(self.learner) is not None, every)

    def remote_running(self) -> bool:
        return any(row.get("remote") and row.get("state") == "running" for row in self.roster().values())


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def proc_sample(pid: int, t: float) -> Sample | None:
    """Resident memory (MB), open file descriptors and sockets of a process (None: it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = os.listdir(f"/proc/{pid}/fd")
        sockets = 0
        for fd in fds:
            try:
                sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
            except OSError:
                continue
    except OSError:
        return None
    rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return None if rss is None else Sample(t, pid, rss / 1024, len(fds), sockets)  # (None: a zombie)


KINDS = ("sampler", "replay", "learner", "pause", "evaluator", "visualizer", "remote", "supervisor")


def rotation(mode: str, kinds: list[str]) -> list[Fault]:
    """The faults in the order they come round, of the `kinds` asked for."""
    learners = ["learner"] if mode == "fused" else ["critic-learner", "actor-learner"]
    every = {"sampler": [Fault("sigkill", "sampler-0")], "replay": [Fault("sigkill", "replay")],
             "learner": [Fault("sigkill", sid) for sid in learners], "pause": [Fault("pause", learners[0])],
             "evaluator": [Fault("sigkill", "evaluator")], "visualizer": [Fault("sigkill", "visualizer")],
             "remote": [Fault("stop", "remote")], "supervisor": [Fault("sigkill-supervisor", "supervisor")]}
    return [f for kind in KINDS if kind in kinds for f in every[kind]]


# ------------------------------------------------------------------ the report

def memory_rows(samples: dict[str, list[Sample]], settle_s: float) -> list[dict[str, Any]]:
    """Per service: its longest-lived process's memory and handles after `settle_s`, first to last."""
    rows = []
    for sid, series in sorted(samples.items()):
        by_pid: dict[int, list[Sample]] = {}
        for s in series:
            by_pid.setdefault(s.pid, []).append(s)
        longest = max(by_pid.values(), key=lambda ss: ss[-1].t - ss[0].t)
        settled = [s for s in longest if s.t >= settle_s] or longest[-1:]
        first, last = settled[0], settled[-1]
        rows.append({"service": sid, "processes": len(by_pid), "from_s": first.t, "to_s": last.t,
                     "rss_first": first.rss_mb, "rss_last": last.rss_mb, "rss_max": max(s.rss_mb for s in series),
                     "growth": (last.rss_mb / first.rss_mb - 1) if first.rss_mb else 0.0,
                     "fds": (first.fds, last.fds, max(s.fds for s in series)),
                     "sockets": (first.sockets, last.sockets, max(s.sockets for s in series))})
    return rows


def fault_rows(faults: list[Fault]) -> list[dict[str, Any]]:
    kinds: dict[str, list[Fault]] = {}
    for f in faults:
        kinds.setdefault(f.name, []).append(f)
    rows = []
    for name, fs in kinds.items():
        times = [f.recovered_s for f in fs if f.recovered_s is not None]
        rows.append({"fault": name, "count": len(fs), "recovered": len(times),
                     "median_s": statistics.median(times) if times else None, "max_s": max(times) if times else None,
                     "notes": "; ".join(sorted({f.note for f in fs if f.note}))})
    return rows


def final_state(run_dir: Path) -> dict[str, Any]:
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    evals = [r for r in rows if r["kind"] == "eval"]
    ledgers = [r for r in rows if r["kind"] == "ledger"]
    ledger = ledgers[-1] if ledgers else None
    lost = None
    if ledger is not None:
        lost = {sid: not balanced({"left_unstored": 0, **r}) for sid, r in ledger["samplers"].items()}
    return {"evals": len(evals), "final": evals[-1]["return_mean"] if evals else None,
            "best": max(e["return_mean"] for e in evals) if evals else None,
            "env_steps": max((r.get("env_steps", 0) for r in rows if r["kind"] == "progress"), default=0),
            "ledger": ledger, "lost": lost, "sessions": sum(r["kind"] == "start" for r in rows)}


def report(args: argparse.Namespace, faults: list[Fault], memory: list[dict[str, Any]],
           end: dict[str, Any], exit_status: int | None, wall_s: float) -> str:
    info = machine_info()
    lines = [f"# Reliability: {args.env}, {args.minutes:g} min under faults every {args.every:g} s", "",
             f"Command: `spreeze bench soak {' '.join(args.argv)}`  ",
             f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit {git_commit() or '?'}; "
             f"machine: {info['cores']} cores, {info['cpu']}, GPU {info['gpu']}", "",
             f"Wall clock {wall_s / 60:.1f} min, {end['sessions']} supervisor sessions (each SIGKILL of the "
             f"supervisor is followed by `--resume`), {end['env_steps']:,} env steps, {end['evals']} evaluations; "
             f"final evaluation {fmt(end['final'])}, best {fmt(end['best'])}; the last session's exit status "
             f"{exit_status}.", "",
             "| fault | count | recovered | median s | max s | notes |", "|---|---:|---:|---:|---:|---|"]
    for r in fault_rows(faults):
        lines.append(f"| {r['fault']} | {r['count']} | {r['recovered']} | {fmt(r['median_s'])} | "
                     f"{fmt(r['max_s'])} | {r['notes']} |")
    led = end["ledger"]
    lines += ["", "Ledger at the end (env steps made by each sampler against those replay stored): " + (
        ", ".join(f"{sid} made {r['made']:,}, stored {r['stored']:,}, rejected {r['rejected']:,}, left unstored "
                  f"at a mid-run exit {r.get('left_unstored', 0):,}"
                  for sid, r in led["samplers"].items()) if led else "none written (the run did not end cleanly)"),
        "", f"Memory and handles (the longest-lived process of each service, from {args.settle:g} s on; "
        "fds and sockets: first / last / max):", "",
        "| service | processes | RSS MB first | RSS MB last | growth | RSS MB max | fds | sockets |",
        "|---|---:|---:|---:|---:|---:|---|---|"]
    for m in memory:
        lines.append(f"| {m['service']} | {m['processes']} | {m['rss_first']:.0f} | {m['rss_last']:.0f} | "
                     f"{100 * m['growth']:+.1f}% | {m['rss_max']:.0f} | {'/'.join(map(str, m['fds']))} | "
                     f"{'/'.join(map(str, m['sockets']))} |")
    return "\n".join(lines) + "\n"


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


# ------------------------------------------------------------------ command line

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spreeze bench soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0, help="length of the soak (default 20)")
    p.add_argument("--every", type=float, default=120.0, help="seconds between faults (default 120)")
    p.add_argument("--env", default="HalfCheetah-v5", help="the task (default HalfCheetah-v5)")
    p.add_argument("--algo", default="td3", help="the algorithm (default td3)")
    p.add_argument("--pause", type=float, default=30.0, help="seconds a learner stays paused (default 30)")
    p.add_argument("--remote-off", type=float, default=60.0, help="seconds the remote sampler stays stopped (60)")
    p.add_argument("--sample", type=float, default=10.0, help="seconds between memory samples (default 10)")
    p.add_argument("--settle", type=float, default=600.0,
                   help="memory growth is measured from this many seconds on (default 600; at most a third of "
                        "the soak)")
    p.add_argument("--faults", default=",".join(KINDS),
                   help=f"the faults in rotation, comma-separated (default all: {','.join(KINDS)})")
    p.add_argument("--port", type=int, default=47555, help="loopback port of the run's tcp:// endpoints (+0..3)")
    p.add_argument("--run-dir", help="the run directory (default: a temporary one, removed after)")
    p.add_argument("--report", default=str(REPORT), help=f"markdown report (default {REPORT}; '-' for none)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for the run")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv
    unknown = set(args.faults.split(",")) - set(KINDS)
    if unknown:
        parser().error(f"--faults {args.faults!r}: unknown {', '.join(sorted(unknown))} (known: {', '.join(KINDS)})")
    duration = args.minutes * 60
    args.settle = min(args.settle, duration / 3)
    base = Path(args.run_dir).parent if args.run_dir else Path(tempfile.mkdtemp(prefix="spreeze-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    run_dir = Path(args.run_dir) if args.run_dir else base / "run"
    listen = f"tcp://127.0.0.1:{args.port}"
    mode = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("learner.mode=")), "fused")
    train_cmd = [sys.executable, "-m", "spreeze.cli", "train", "--env", args.env, "--algo", args.algo,
                 "--run-dir", str(run_dir), "--total-steps", str(10**9), "--time-limit", f"{duration:.0f}",
                 "--listen", listen, "--quiet", f"learner.mode={mode}", *args.overrides]
    remote_cmd = [sys.executable, "-m", "spreeze.cli", "sampler", "--connect", listen]
    soak = Soak(run_dir, train_cmd, remote_cmd, duration, args.pause, args.remote_off,
                learner="learner" if mode == "fused" else "critic-learner")
    faults: list[Fault] = []
    exit_status: int | None = None
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # stop the run too (finally)
    try:
        soak.start_train(train_cmd)
        if soak.until(lambda: soak.progress()[1] > 0, args.sample, timeout=300) is None:
            raise SystemExit(f"the run made no update within 300 s: see {base}/train-0.log")
        soak.start_remote()
        kinds = rotation(mode, args.faults.split(","))
        while soak.elapsed + args.every < duration:
            soak.wait(args.every, args.sample)
            fault = Fault(**{k: v for k, v in vars(kinds[len(faults) % len(kinds)]).items()
                             if k in ("kind", "target")})
            soak.apply(fault, args.sample)
            faults.append(fault)
            said = "NOT recovered" if fault.recovered_s is None else f"recovered in {fmt(fault.recovered_s)} s"
            print(f"[{fault.at_s:7.0f}s] {fault.name}: {said}{' (' + fault.note + ')' if fault.note else ''}",
                  flush=True)
        soak.wait(max(0.0, duration - soak.elapsed - 5), args.sample)
        assert soak.train is not None
        soak.train.send_signal(signal.SIGTERM)
        exit_status = soak.train.wait(180)
    finally:
        for proc in (soak.train, soak.remote):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    end = final_state(run_dir)
    text = report(args, faults, memory_rows(soak.samples, args.settle), end, exit_status, soak.elapsed)
    print(text)
    if args.report != "-":
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(text)
    if not args.run_dir:
        shutil.rmtree(base, ignore_errors=True)
    failed = [f for f in faults if f.recovered_s is None and not f.note.endswith("skipped")]
    lost = {sid: n for sid, n in (end["lost"] or {}).items() if n}
    ok = exit_status == 0 and not failed and end["ledger"] is not None and not lost
    if not ok:
        print(f"soak FAILED: exit status {exit_status}, not recovered: {[f.name for f in failed]}, "
              f"ledger: {lost if end['ledger'] else 'none'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
