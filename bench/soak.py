"""`spreeze bench soak`: a long run under faults in rotation: recovery times, memory and handles, the ledger.

It trains (TD3 on HalfCheetah-v5 by default) with one remote sampler attached over tcp://,
either as local processes under `spreeze train` or, with `--compose`, under `docker compose
up` (the cpu profile, images built as docs/containers.md says) on the real engine; and every
`--every` seconds applies the next fault of the rotation:

    sigkill <service>   SIGKILL of the sampler, the replay, each learner, the evaluator and the
                        visualizer in turn (the supervisor, or compose, restarts it)
    pause learner       SIGSTOP of the (critic) learner for `--pause` seconds, then SIGCONT
    stop remote         the remote sampler stopped for `--remote-off` seconds, then started again
    sigkill supervisor  the supervisor itself: locally its services exit when they stop hearing
                        it and `spreeze train --resume` continues the run; under compose the
                        container is restarted and `--or-resume` continues it

A fault is recovered once the service runs again (a new process, the paused one heard
again, the remote sampler registered again) and both replay's inserts and the learner's
updates rise again; the time counts from the fault (for a pause: from the SIGSTOP, so it
includes the pause unless the supervisor replaced the silent learner first). Every
`--sample` seconds each process's resident memory, open file descriptors and sockets are
read from /proc. At the end the run is stopped cleanly and the ledger (env steps each
sampler made against those replay stored) must balance. The report, a table per fault
kind and per service, goes to `--report` (results/reliability.md); the exit status is 1
when a fault was not recovered or the ledger does not balance.

    spreeze bench soak --minutes 20 [--every 120] [--env HalfCheetah-v5] [key=value ...]
    spreeze bench soak --compose --minutes 60
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spreeze.bench.soak_deploy import Compose, Local
from spreeze.bench.soak_report import (Fault, Sample, final_state, fmt, memory_rows, proc_sample, report)
from spreeze.proto.names import REPLAY

REPORT = Path("results") / "reliability.md"
RECOVERY_TIMEOUT_S = 120.0  # a fault not recovered within this counts as not recovered
KINDS = ("sampler", "replay", "learner", "pause", "evaluator", "visualizer", "remote", "supervisor")
Deployment = Local | Compose


class Soak:
    """The fault loop over one deployment: faults, recovery, memory samples."""

    def __init__(self, deploy: Deployment, duration: float, pause_s: float, remote_off_s: float,
                 every_sample: float) -> None:
        self.deploy, self.duration = deploy, duration
        self.pause_s, self.remote_off_s, self.every_sample = pause_s, remote_off_s, every_sample
        self.t0 = time.monotonic()
        self.samples: dict[str, list[Sample]] = {}
        self.offset = 0  # bytes of metrics.jsonl read so far
        self.counts = (0, 0)  # newest (rows replay inserted, learner updates)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def rotation(self, kinds: list[str]) -> list[Fault]:
        """The faults in the order they come round, of the `kinds` asked for."""
        t, learners = self.deploy.targets(), self.deploy.learners
        every = {"sampler": [Fault("sigkill", t["sampler"])], "replay": [Fault("sigkill", t["replay"])],
                 "learner": [Fault("sigkill", name) for name in learners], "pause": [Fault("pause", learners[0])],
                 "evaluator": [Fault("sigkill", t["evaluator"])], "visualizer": [Fault("sigkill", t["visualizer"])],
                 "remote": [Fault("stop", "remote")], "supervisor": [Fault("sigkill-supervisor", "supervisor")]}
        return [f for kind in KINDS if kind in kinds for f in every[kind]]

    # ------------------------------------------------------------ progress
    def progress(self) -> tuple[int, int]:
        """Newest (rows replay inserted, learner updates) of their metrics records (about one a
        second; a restarted replay or learner starts again from its snapshot or checkpoint)."""
        try:
            with open(self.deploy.run_dir / "metrics.jsonl", "rb") as f:
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
            if row.get("service") == REPLAY and "inserted" in row:
                self.counts = (int(row["inserted"]), self.counts[1])
            elif row.get("service") == self.deploy.learner and "updates" in row:
                self.counts = (self.counts[0], int(row["updates"]))
        return self.counts

    def advancing(self) -> Callable[[], bool]:
        """A test that is true once inserts and updates both rose between two readings (a reading
        that went back, a restored snapshot or checkpoint, starts the comparison again)."""
        base = [self.progress()]

        def test() -> bool:
            now = self.progress()
            if now[0] > base[0][0] and now[1] > base[0][1]:
                return True
            if now[0] < base[0][0] or now[1] < base[0][1]:
                base[0] = now
            return False
        return test

    # ------------------------------------------------------------ waiting, sampling on the way
    def sample(self) -> None:
        now = self.elapsed
        for name, pid in self.deploy.processes().items():
            got = proc_sample(pid, now)
            if got is not None:
                self.samples.setdefault(name, []).append(got)

    def wait(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.sample()
            time.sleep(min(left, self.every_sample))

    def until(self, done: Callable[[], Any], timeout: float = RECOVERY_TIMEOUT_S) -> float | None:
        """Seconds until `done()` is true (None: not within `timeout`), polling every 0.25 s."""
        t0, last_sample = time.monotonic(), 0.0
        while time.monotonic() - t0 < timeout:
            if done():
                return time.monotonic() - t0
            if time.monotonic() - last_sample >= self.every_sample:
                self.sample()
                last_sample = time.monotonic()
            time.sleep(0.25)
        return None

    def back(self, running: Callable[[], Any]) -> float | None:
        """Once `running()`: seconds until inserts and updates rise again (None: not in time)."""
        return self.until(self.advancing()) if self.until(running) is not None else None

    # ------------------------------------------------------------ faults
    def apply(self, fault: Fault) -> None:
        """Apply `fault` and wait (bounded) for the run to recover; its time and notes go in `fault`."""
        fault.at_s = self.elapsed
        deploy = self.deploy
        if fault.kind in ("sigkill", "pause"):
            pid = deploy.pid(fault.target)
            if pid is None:
                fault.note = "not running at the time: skipped"
                return
            (self.kill if fault.kind == "sigkill" else self.pause)(fault, pid)
        elif fault.kind == "stop":
            deploy.stop_remote()
            self.wait(self.remote_off_s)
            deploy.start_remote()
            fault.recovered_s = self.back(deploy.remote_running)
        else:
            fault.note = deploy.kill_supervisor(self.until, self.duration - self.elapsed)
            fault.recovered_s = self.back(lambda: deploy.pid(deploy.learners[0]) is not None)
        if fault.recovered_s is not None and fault.kind != "pause":  # (a pause's: from the SIGSTOP)
            fault.recovered_s = self.elapsed - fault.at_s  # from the fault itself (the stop's wait included)

    def kill(self, fault: Fault, pid: int) -> None:
        signal_pid(pid, signal.SIGKILL)
        fault.recovered_s = self.back(lambda: self.deploy.pid(fault.target) not in (None, pid))

    def pause(self, fault: Fault, pid: int) -> None:
        signal_pid(pid, signal.SIGSTOP)
        rising = self.advancing()
        during = self.until(rising, timeout=self.pause_s)  # the supervisor may replace it meanwhile
        signal_pid(pid, signal.SIGCONT)
        if during is None:
            after = self.until(rising) if self.until(lambda: self.deploy.pid(fault.target)) is not None else None
            fault.recovered_s = None if after is None else self.pause_s + after
        else:
            fault.recovered_s = during
        if self.deploy.pid(fault.target) != pid:
            fault.note = "restarted (silent past the supervisor's liveness)"


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------ command line

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spreeze bench soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0, help="length of the soak (default 20)")
    p.add_argument("--every", type=float, default=120.0, help="seconds between faults (default 120)")
    p.add_argument("--env", default="HalfCheetah-v5", help="the task (default HalfCheetah-v5)")
    p.add_argument("--algo", default="td3", help="the algorithm (default td3)")
    p.add_argument("--compose", action="store_true",
                   help="under `docker compose up` (cpu profile, images built) instead of `spreeze train`")
    p.add_argument("--pause", type=float, default=30.0, help="seconds a learner stays paused (default 30)")
    p.add_argument("--remote-off", type=float, default=60.0, help="seconds the remote sampler stays stopped (60)")
    p.add_argument("--sample", type=float, default=10.0, help="seconds between memory samples (default 10)")
    p.add_argument("--settle", type=float, default=600.0,
                   help="memory growth is measured from this many seconds on (default 600; at most a third of "
                        "the soak)")
    p.add_argument("--faults", default=",".join(KINDS),
                   help=f"the faults in rotation, comma-separated (default all: {','.join(KINDS)})")
    p.add_argument("--port", type=int, default=47555, help="loopback port of a local run's tcp:// endpoints (+0..3)")
    p.add_argument("--run-dir", help="a local run's directory (default: a temporary one, removed after)")
    p.add_argument("--report", default=str(REPORT), help=f"markdown report (default {REPORT}; '-' for none)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides of a local run")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    args = p.parse_args(argv)
    args.argv = argv
    unknown = set(args.faults.split(",")) - set(KINDS)
    if unknown:
        p.error(f"--faults {args.faults!r}: unknown {', '.join(sorted(unknown))} (known: {', '.join(KINDS)})")
    if args.compose and args.overrides:
        p.error("key=value overrides apply to a local run; a compose run takes its settings from .env")
    duration = args.minutes * 60
    args.settle = min(args.settle, duration / 3)
    base = Path(args.run_dir).parent if args.run_dir else Path(tempfile.mkdtemp(prefix="spreeze-soak-"))
    mode = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("learner.mode=")), "fused")
    deploy: Deployment = (Compose(args.env, args.algo, duration, samplers=1) if args.compose else
                          Local(Path(args.run_dir) if args.run_dir else base / "run", args.env, args.algo, duration,
                                args.port, mode, args.overrides))
    soak = Soak(deploy, duration, args.pause, args.remote_off, args.sample)
    faults: list[Fault] = []
    exit_status: int | None = None
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # stop the run too (finally)
    try:
        deploy.start()
        if soak.until(lambda: soak.progress()[1] > 0, timeout=600) is None:
            raise SystemExit(f"the run made no update within 600 s (run directory {deploy.run_dir})")
        deploy.start_remote()
        kinds = soak.rotation(args.faults.split(","))
        while soak.elapsed + args.every < duration:
            soak.wait(args.every)
            fault = Fault(kinds[len(faults) % len(kinds)].kind, kinds[len(faults) % len(kinds)].target)
            soak.apply(fault)
            faults.append(fault)
            said = "NOT recovered" if fault.recovered_s is None else f"recovered in {fmt(fault.recovered_s)} s"
            print(f"[{fault.at_s:7.0f}s] {fault.name}: {said}{' (' + fault.note + ')' if fault.note else ''}",
                  flush=True)
        soak.wait(max(0.0, duration - soak.elapsed - 5))
        exit_status = deploy.stop()
        end = final_state(deploy.run_dir)  # (before close: a compose run's volume goes with it)
        text = report(args, faults, memory_rows(soak.samples, args.settle), end, exit_status, soak.elapsed)
    finally:
        deploy.close()
    print(text)
    if args.report != "-":
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(text)
    if not args.run_dir:
        shutil.rmtree(base, ignore_errors=True)
    failed = [f for f in faults if f.recovered_s is None and not f.note.endswith("skipped")]
    unbalanced = [sid for sid, bad in (end["lost"] or {}).items() if bad]
    ok = exit_status == 0 and not failed and end["ledger"] is not None and not unbalanced
    if not ok:
        print(f"soak FAILED: exit status {exit_status}, not recovered: {[f.name for f in failed]}, "
              f"ledger: {unbalanced if end['ledger'] else 'none'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
