"""`spreeze bench update`: the fused learner's update frame rate vs a plain PyTorch loop.

For each algorithm and batch size, interleaved in one invocation:
  spreeze: the real system's learner hot path. The Supervisor runs a roster of the real
      replay service, the real fused learner and a bench-only filler (bench/filler.py)
      that fills replay with random transitions of HalfCheetah sizes (obs 17, act 6) and
      then idles, so nothing competes with the learner for cores. replay.update_to_data=0
      (never rate limited) and replay.min_size = capacity = --fill, so the learner starts
      on a full ring. Updates/s is the rate of the learner's `updates` metric between its
      first record after the first update and its last record before the stop (about
      `--seconds`); batches travel through real sockets (request, gather in replay,
      encode, send, decode, tensor view), `learner.prefetch` requests in flight.
  plain: in this process, the same networks built the same way (common.algorithms.make_parts,
      shared parts, the run's config) updated by the same common.algorithms.fused_step on
      batches already in memory (a pool of random tensors on the device, cycled, no
      gather), with the same torch threads and the learner's loss read-out cadence. This
      is the fairest "same networks, same update code" reference: the ratio is what the
      message-driven pipeline costs (or hides) around identical update arithmetic.
Update frame rate = batch size x updates/s. Medians over `--repeats`; within each
repeat the order of the two alternates.

    spreeze bench update [--algo td3 sac] [--batch-sizes 256 1024 4096 8192] [--hidden 256 256]
                         [--seconds 10] [--threads 1] [--device cpu] [--json F] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.system import STARTUP_S, add_output_args, measure, rate
from common.algorithms import ALGOS, fused_step, make_parts
from common.config import Config, load_config
from common.envs import env_spec
from common.learner_io import device_of
from services.learner.base import LOSS_EVERY
from services.supervisor.main import roster
from services.supervisor.processes import ServiceSpec
from services.supervisor.progress import Progress

ENV = "HalfCheetah-v5"  # the sizes measured: obs 17, act 6
HUGE = 10 ** 15  # total_steps: never reached
POOL = 8  # plain loop: distinct in-memory batches, cycled
WARMUP_UPDATES = 10  # plain loop: untimed updates first (allocator, first-call costs)


def bench_config(algo: str, batch: int, hidden: tuple[int, ...], threads: int, device: str,
                 fill: int, seconds: float, run_dir: Path, seed: int = 0,
                 overrides: tuple[str, ...] = ()) -> Config:
    """The run config of one measurement; the plain loop builds its networks from it too."""
    hid = ",".join(str(h) for h in hidden)
    return load_config(None, [*overrides,
        f"env={ENV}", f"algo={algo}", f"seed={seed}", f"run_dir={run_dir}", f"total_steps={HUGE}",
        f"time_limit={seconds + 2 * STARTUP_S}",  # safety net only: bench.system stops the run
        f"{algo}.hidden=[{hid}]", "learner.mode=fused", f"learner.batch_size={batch}",
        f"learner.threads={threads}", f"learner.actor_device={device}", f"learner.critic_device={device}",
        "replay.update_to_data=0", f"replay.capacity={fill}", f"replay.min_size={fill}",
        "replay.snapshot_every_s=0",  # measures the learner, not writing the filled ring to disk
    ])


def system_rate(cfg: Config, seconds: float) -> dict[str, float]:
    """Updates/s of the real fused learner fed by the real replay service."""
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    specs = [s for s in roster(cfg) if s.role in ("replay", "learner")]
    specs.append(ServiceSpec("filler", "filler", "bench.filler"))

    def ready(p: Progress) -> bool:
        return p.updates > 0  # the learner's `updates`, from its newest metrics

    rows, stop_at = measure(cfg, specs, ready, seconds)
    got = rate(rows, "learner", "updates", stop_at, also=("batch_wait_s",))
    return {"updates_per_s": got["rate"], "batch_wait_fraction": got["batch_wait_s"],
            "window_s": got["window_s"]}


def plain_rate(cfg: Config, seconds: float) -> dict[str, float]:
    """Updates/s of make_parts + fused_step on in-memory batches, in this process."""
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.learner.threads)
    try:
        device = device_of(cfg.learner.actor_device)
        layout, low, high = env_spec(cfg.env)
        actor, critic = make_parts(cfg.algo, layout.obs_dim, layout.act_dim, low, high, cfg.algo_config,
                                   device, True, cfg.seed, sparse=cfg.sparse, total_updates=cfg.total_updates)
        gen = torch.Generator().manual_seed(cfg.seed + 31)
        batches = []
        for _ in range(POOL):
            m = torch.rand((cfg.learner.batch_size, layout.width), generator=gen) * 2 - 1
            layout.columns(m)["done"][:] = 0.0
            batches.append(layout.columns(m.to(device)))
        for i in range(WARMUP_UPDATES):
            fused_step(actor, critic, batches[i % POOL], want_metrics=False)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        updates, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            fused_step(actor, critic, batches[updates % POOL], want_metrics=updates % LOSS_EVERY == 0)
            updates += 1
        sync()
        return {"updates_per_s": updates / (time.perf_counter() - start)}
    finally:
        torch.set_num_threads(before)


def run(algos: tuple[str, ...] = ALGOS, batch_sizes: tuple[int, ...] = (256, 1024, 4096, 8192),
        hidden: tuple[int, ...] = (256, 256), seconds: float = 10.0, threads: int = 1,
        device: str = "cpu", repeats: int = 1, fill: int = 100_000, json_path: str | None = None,
        out: str | None = None, overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """Measure both sides for every (algo, batch), interleaved; print; return (and write) JSON."""
    fill = max(fill, max(batch_sizes))
    runs: dict[tuple[str, int], dict[str, list[dict[str, float]]]] = {
        (a, b): {"spreeze": [], "plain": []} for a in algos for b in batch_sizes}
    with tempfile.TemporaryDirectory(prefix="spreeze-bench-update-") as tmp:
        base = Path(out) if out else Path(tmp)
        for rep in range(repeats):
            for algo in algos:
                for batch in batch_sizes:
                    cfg = bench_config(algo, batch, hidden, threads, device, fill, seconds,
                                       base / f"r{rep}-{algo}-b{batch}", seed=rep, overrides=overrides)
                    sides = ("spreeze", "plain") if rep % 2 == 0 else ("plain", "spreeze")
                    for side in sides:
                        got = system_rate(cfg, seconds) if side == "spreeze" else plain_rate(cfg, seconds)
                        runs[(algo, batch)][side].append(got)
    result = summarize(runs, hidden, seconds, threads, device, repeats, fill)
    result["overrides"] = list(overrides)
    print(table(result))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
    return result


def summarize(runs: dict[tuple[str, int], dict[str, list[dict[str, float]]]], hidden: tuple[int, ...],
              seconds: float, threads: int, device: str, repeats: int, fill: int) -> dict[str, Any]:
    med = statistics.median
    rows = []
    for (algo, batch), sides in runs.items():
        s_ups = [r["updates_per_s"] for r in sides["spreeze"]]
        p_ups = [r["updates_per_s"] for r in sides["plain"]]
        rows.append({
            "algo": algo, "batch": batch,
            "spreeze_updates_per_s": med(s_ups), "plain_updates_per_s": med(p_ups),
            "spreeze_frame_rate": batch * med(s_ups), "plain_frame_rate": batch * med(p_ups),
            "ratio": med(s_ups) / med(p_ups),
            "paired_ratio": med(s / p for s, p in zip(s_ups, p_ups)),
            "spreeze_batch_wait_fraction": med(r["batch_wait_fraction"] for r in sides["spreeze"]),
            "spreeze_updates_per_s_runs": s_ups, "plain_updates_per_s_runs": p_ups,
            "spreeze_window_s_runs": [r["window_s"] for r in sides["spreeze"]],
        })
    return {"bench": "update", "env": ENV, "hidden": list(hidden), "threads": threads, "device": device,
            "seconds": seconds, "repeats": repeats, "fill": fill, "results": rows}


def table(result: dict[str, Any]) -> str:
    lines = [(f"{result['env']} sizes, hidden {result['hidden']}, {result['threads']} thread(s), "
              f"{result['device']}, replay filled with {result['fill']:,} random transitions"),
             (f"{'algo':>4} {'batch':>6} {'spreeze up/s':>12} {'spreeze fr/s':>13} {'plain up/s':>11} "
              f"{'plain fr/s':>12} {'spreeze/plain':>13} {'batch wait':>10}")]
    for r in result["results"]:
        lines.append(f"{r['algo']:>4} {r['batch']:>6} {r['spreeze_updates_per_s']:>12,.1f} "
                     f"{r['spreeze_frame_rate']:>13,.0f} {r['plain_updates_per_s']:>11,.1f} "
                     f"{r['plain_frame_rate']:>12,.0f} {r['ratio']:>13.3f} "
                     f"{100 * r['spreeze_batch_wait_fraction']:>9.1f}%")
    if result.get("overrides"):
        lines.append(f"spreeze runs with {' '.join(result['overrides'])}")
    lines.append(f"medians of {result['repeats']} interleaved repeat(s); fr/s = batch x updates/s; "
                 "batch wait: share of the learner's time spent waiting for batches")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spreeze bench update", description=__doc__.splitlines()[0])
    p.add_argument("--algo", nargs="+", choices=ALGOS, default=list(ALGOS))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024, 4096, 8192])
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256], help="hidden sizes, actor and critics")
    p.add_argument("--seconds", type=float, default=10.0, help="measurement window of each side")
    p.add_argument("--threads", type=int, default=1, help="torch threads (learner process and plain loop)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (learner and plain loop)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved repeats (medians reported)")
    p.add_argument("--fill", type=int, default=100_000, help="random transitions in replay (its capacity)")
    add_output_args(p, "learner.batches_per_request=4")
    args = p.parse_args(argv)
    if (min(args.batch_sizes) <= 0 or min(args.hidden) <= 0 or args.seconds <= 0 or args.threads <= 0
            or args.repeats <= 0 or args.fill <= 0):
        p.error("--batch-sizes, --hidden, --seconds, --threads, --repeats and --fill must be positive")
    bench_config(args.algo[0], args.batch_sizes[0], tuple(args.hidden), args.threads, args.device,
                 max(args.fill, max(args.batch_sizes)), args.seconds, Path("."),
                 overrides=tuple(args.overrides))  # validate the config
    device_of(args.device)  # refuse cuda without CUDA before starting anything
    run(tuple(args.algo), tuple(args.batch_sizes), tuple(args.hidden), args.seconds, args.threads,
        args.device, args.repeats, args.fill, args.json, args.out, tuple(args.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
