"""`spreeze bench e2e`: the whole system training, and where its CPU time goes.

Runs the real roster of a training run (replay, learner(s), evaluator, samplers; every one
a process on real sockets, under the real Supervisor) with the given config, waits until
the learner has been updating for `--settle` seconds (start-up, the warm-up and the
catching-up right after it are excluded), then measures a window of `--seconds`:
  sampling Hz        replay `inserted` per second (env steps reaching replay);
  update frame rate  learner updates per second x batch size;
  update-to-data     updates per env step, beside the configured target;
  rate-limiter stalls: share of the replay's time that inserts / sample requests waited;
and per service: CPU share (CPU seconds per wall second from /proc, 1.0 = one core busy;
the supervisor is this process) and transport share (the part of the service's own CPU
seconds spent encoding, decoding and in socket calls, from the `transport_s` and `cpu_s`
every service reports with its metrics). Medians over `--repeats`.

The config is planned on this host as `spreeze train` plans it (samplers, envs per sampler,
batch size, learner placement and threads, from the same hardware probe; keys set in
--config or as overrides are kept), and the plan is printed as `spreeze train` prints it.
The tuner does not run: the window measures one setting.

    spreeze bench e2e [--config F] [--seconds 30] [--settle 15] [--repeats 1] [--json F] [--out DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from spreeze.bench.system import BenchFailed, STARTUP_S, add_output_args, measure, rate
from spreeze.common.config import Config, given_keys, load_config
from spreeze.services.supervisor.main import Supervisor
from spreeze.services.supervisor.probe import cpu_seconds, probe
from spreeze.services.supervisor.processes import roster
from spreeze.services.supervisor.start import planned
from spreeze.services.supervisor.progress import Progress
from spreeze.proto.names import LEARNER_ROLES

HUGE = 10 ** 15  # total_steps: never reached


class CpuWindow:
    """CPU seconds of every service process (and of the supervisor) over the window."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, tuple[float, float | None]]] = {}
        self.opened = 0.0

    def __call__(self, phase: str, sup: Supervisor) -> None:
        now = time.monotonic()
        marks = {sid: (now, cpu_seconds(c.proc.pid) if c.alive else None)  # type: ignore[union-attr]
                 for sid, c in sup.children.items()}
        marks["supervisor"] = (now, time.process_time())
        self.marks[phase] = marks
        if phase == "start":
            self.opened = sup.progress.elapsed  # the window's start on the metrics' clock

    def shares(self) -> dict[str, float]:
        start, end = self.marks.get("start", {}), self.marks.get("end", {})
        out = {}
        for sid, (t1, c1) in end.items():
            t0, c0 = start.get(sid, (t1, None))
            if c0 is not None and c1 is not None and t1 > t0:
                out[sid] = (c1 - c0) / (t1 - t0)
        return out


def learner_service(cfg: Config) -> str:
    return "learner" if cfg.learner.mode == "fused" else "critic_learner"


def measure_run(cfg: Config, seconds: float, settle: float) -> dict[str, Any]:
    """One window of the full system in its steady state: `settle` seconds after the first
    update (the learner first works off the slack the rate limiter allows past the warm-up)
    with every learner done compiling (while one compiles in the background it updates
    eagerly and a cold compile may hold up its metrics); the table's numbers."""
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    cpu = CpuWindow()
    first_update: list[float] = []

    def ready(p: Progress) -> bool:
        if p.updates > 0 and not first_update:
            first_update.append(time.monotonic())
        compiling = any(v.get("compiling") for sid, v in p.latest.items() if sid.split("-")[0] in LEARNER_ROLES)
        return bool(first_update) and time.monotonic() - first_update[0] >= settle and not compiling

    rows, stop_at = measure(cfg, roster(cfg), ready, seconds, on_window=cpu)
    steps = rate(rows, "replay", "inserted", stop_at, also=("insert_stall_s", "sample_stall_s"), since=cpu.opened)
    updates = rate(rows, learner_service(cfg), "updates", stop_at, since=cpu.opened)
    services = {}
    for sid, share in sorted(cpu.shares().items()):
        row: dict[str, Any] = {"cpu_share": share, "transport_share": None}
        try:
            got = rate(rows, sid, "cpu_s", stop_at, also=("transport_s",), since=cpu.opened)
            row["transport_share"] = got["transport_s"] / got["rate"] if got["rate"] > 0 else None
        except BenchFailed:
            pass  # a service that reports no metrics within the window (the evaluator, the supervisor)
        services[sid] = row
    return {
        "sampling_hz": steps["rate"], "updates_per_s": updates["rate"],
        "update_frame_rate": updates["rate"] * cfg.learner.batch_size,
        "update_to_data": updates["rate"] / steps["rate"] if steps["rate"] > 0 else 0.0,
        "insert_stall_share": steps["insert_stall_s"], "sample_stall_share": steps["sample_stall_s"],
        "window_s": steps["window_s"], "services": services,
    }


def run(cfg: Config, seconds: float = 30.0, repeats: int = 1, json_path: str | None = None,
        out: str | None = None, settle: float = 15.0) -> dict[str, Any]:
    runs = []
    with tempfile.TemporaryDirectory(prefix="spreeze-bench-e2e-") as tmp:
        base = Path(out) if out else Path(tmp)
        for rep in range(repeats):
            run_cfg = dataclasses.replace(cfg, run_dir=str(base / f"r{rep}"), seed=cfg.seed + rep)
            runs.append(measure_run(run_cfg, seconds, settle))
    result = summarize(cfg, seconds, repeats, runs)
    result["settle"] = settle
    print(table(result), flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
    return result


def summarize(cfg: Config, seconds: float, repeats: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    med = statistics.median

    def m(key: str) -> float:
        return med(r[key] for r in runs)

    services = {}
    for sid in sorted({s for r in runs for s in r["services"]}):
        cpu = [r["services"][sid]["cpu_share"] for r in runs if sid in r["services"]]
        tr = [r["services"][sid]["transport_share"] for r in runs
              if sid in r["services"] and r["services"][sid]["transport_share"] is not None]
        services[sid] = {"cpu_share": med(cpu), "transport_share": med(tr) if tr else None}
    return {
        "bench": "e2e", "env": cfg.env, "algo": cfg.algo, "network": cfg.sparse.network,
        "learner_mode": cfg.learner.mode, "batch_size": cfg.learner.batch_size,
        "samplers": cfg.sampler.num_samplers, "envs_per_sampler": cfg.sampler.envs_per_sampler,
        "target_update_to_data": cfg.replay.update_to_data, "cores": os.cpu_count(),
        "seconds": seconds, "repeats": repeats,
        **{k: m(k) for k in ("sampling_hz", "updates_per_s", "update_frame_rate", "update_to_data",
                             "insert_stall_share", "sample_stall_share")},
        "services": services, "runs": runs,
    }


def table(result: dict[str, Any]) -> str:
    r = result
    lines = [f"{r['algo']} on {r['env']} ({r['network']}, {r['learner_mode']} learner, batch {r['batch_size']}, "
             f"{r['samplers']} sampler(s) x {r['envs_per_sampler']} envs, {r['cores']} cores)",
             f"sampling {r['sampling_hz']:,.0f} Hz | update {r['updates_per_s']:,.1f}/s = "
             f"{r['update_frame_rate']:,.0f} fr/s | update-to-data {r['update_to_data']:.3f} "
             f"(target {r['target_update_to_data']:g}) | replay waits: inserts "
             f"{100 * r['insert_stall_share']:.0f}%, sample requests {100 * r['sample_stall_share']:.0f}%",
             f"{'service':>16} {'CPU (cores)':>11} {'transport share of its CPU':>27}"]
    for sid, s in r["services"].items():
        tr = "-" if s["transport_share"] is None else f"{100 * s['transport_share']:.1f}%"
        lines.append(f"{sid:>16} {s['cpu_share']:>11.2f} {tr:>27}")
    total = sum(s["cpu_share"] for s in r["services"].values())
    lines.append(f"{'total':>16} {total:>11.2f}")
    lines.append(f"medians of {r['repeats']} run(s), each a ~{r['seconds']:g}s window starting "
                 f"{r['settle']:g}s after the first update")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spreeze bench e2e", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None,
                   help="a YAML config file (default: the built-in defaults; the repository's configs/ has examples)")
    p.add_argument("--seconds", type=float, default=30.0, help="measurement window of each run")
    p.add_argument("--settle", type=float, default=15.0,
                   help="seconds between the first update and the window (the start-up transient)")
    p.add_argument("--repeats", type=int, default=1, help="runs (medians reported)")
    add_output_args(p, "learner.batch_size=512")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.repeats <= 0 or args.settle < 0:
        p.error("--seconds and --repeats must be positive, --settle not negative")
    cfg = load_config(args.config, [*args.overrides, f"total_steps={HUGE}",
                                    f"time_limit={args.seconds + 2 * STARTUP_S + 300}"])
    hardware = probe()
    # as `spreeze train` plans: a GPU this host lacks is refused before anything starts
    cfg, choices = planned(cfg, given_keys(args.config, args.overrides), hardware)
    print(f"spreeze: hardware: {hardware.describe()}", flush=True)
    for choice in choices:
        print(f"event plan: {choice.describe()}", flush=True)
    run(cfg, args.seconds, args.repeats, args.json, args.out, args.settle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
