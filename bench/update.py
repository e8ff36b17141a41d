"""`spreeze bench update`: the learner's update rate, compiled vs eager vs a plain loop.

For each algorithm and batch size, interleaved in one invocation:
  spreeze: the real system's learner hot path. The Supervisor runs a roster of the real
      replay service, the real fused learner (its defaults: compiled steps) and a bench-only
      filler (bench/filler.py) that fills replay with random transitions of HalfCheetah
      sizes (obs 17, act 6) and then idles, so nothing competes with the learner for cores.
      replay.update_to_data=0 (never rate limited) and replay.min_size = capacity = --fill,
      so the learner starts on a full ring. Updates/s is the rate of the learner's `updates`
      metric between its first record after the first update and its last record before the
      stop (about `--seconds`); batches travel through real sockets (request, gather in
      replay, encode, send, decode, tensor view), `learner.prefetch` requests in flight.
  compiled, eager: in this process, the same networks built the same way
      (common.algorithms.make_parts, shared parts, the run's config) updated by the same
      common.algorithms.fused_step, with the parts' compiled steps (compiled after an
      untimed warm-up, then guards off as in the learner) or their eager update
      (learner.compile=false), on batches already in memory (a pool of random tensors on
      the device, cycled, no gather), with the same torch threads and the learner's loss
      read-out cadence.
  plain: in this process, a textbook eager PyTorch loop (bench/plain.py: module calls,
      torch.optim.Adam defaults, one backward per loss, CleanRL's way) of the same networks
      on the same batches: the baseline a user would otherwise run.
Ratios divide medians of runs taken side by side. Compile seconds, cold (an empty kernel
cache) and warm (the same cache again), are measured per algorithm in fresh processes.
Update frame rate = batch size x updates/s. Medians over `--repeats`; the order of the
sides rotates between repeats.

    spreeze bench update [--algo td3 sac] [--batch-sizes 256 1024 4096 8192] [--hidden 256 256]
                         [--seconds 10] [--threads 1] [--device cpu] [--no-compile-times]
                         [--json F] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from spreeze.bench.system import STARTUP_S, add_output_args, measure, rate
from spreeze.bench.plain import LOOPS, plain_loop
from spreeze.bench.runs import ALGO_HELP, algo_arg
from spreeze.common.algorithms import algorithm
from spreeze.common.algorithms.base import fused_step
from spreeze.common.algorithms.build import make_parts
from spreeze.common.algorithms.compiled import CACHE_ENV, CompileOptions, check_guards, use_compile_cache
from spreeze.common.config import Config, load_config
from spreeze.common.devices import checked_device
from spreeze.common.envs import env_spec
from spreeze.common.errors import ConfigError
from spreeze.common.learner_io import device_of
from spreeze.services.learner.base import LOSS_EVERY
from spreeze.services.supervisor.probe import CXX_HINT, cuda_devices, cxx_compiler
from spreeze.services.supervisor.processes import ServiceSpec, roster
from spreeze.services.supervisor.progress import Progress

ENV = "HalfCheetah-v5"  # the sizes measured: obs 17, act 6
HUGE = 10 ** 15  # total_steps: never reached
POOL = 8  # in-process loops: distinct in-memory batches, cycled
WARMUP_UPDATES = 10  # in-process loops: untimed updates first (allocator, first-call costs)
SIDES = ("spreeze", "compiled", "eager", "plain")


def bench_config(algo: str, batch: int, hidden: tuple[int, ...], threads: int, device: str,
                 fill: int, seconds: float, run_dir: Path, seed: int = 0,
                 overrides: tuple[str, ...] = ()) -> Config:
    """The run config of one measurement; the plain loop builds its networks from it too."""
    hid = ",".join(str(h) for h in hidden)
    return load_config(None, [*overrides,
        f"env={ENV}", f"algo={algo}", f"seed={seed}", f"run_dir={run_dir}", f"total_steps={HUGE}",
        f"time_limit={seconds + 2 * STARTUP_S}",  # safety net only: bench.system stops the run
        f"{algorithm(algo).name}.hidden=[{hid}]", "learner.mode=fused", f"learner.batch_size={batch}",
        f"learner.threads={threads}", f"learner.actor_device={device}", f"learner.critic_device={device}",
        "replay.update_to_data=0", f"replay.capacity={fill}", f"replay.min_size={fill}",
        "replay.snapshot_every_s=0",  # measures the learner, not writing the filled ring to disk
    ])


def checked_configs(algos: tuple[str, ...], batch_sizes: tuple[int, ...], hidden: tuple[int, ...], threads: int,
                    device: str, fill: int, seconds: float, overrides: tuple[str, ...]) -> None:
    """Build every measurement's config before anything starts, so that a bad one is refused
    at once (ConfigError) rather than after the measurements and compiles before it; the
    message names the batch size and --fill (replay.capacity here) besides the config's."""
    for algo in algos:
        for batch in batch_sizes:
            try:
                bench_config(algo, batch, hidden, threads, device, fill, seconds, Path("."), overrides=overrides)
            except ConfigError as exc:
                raise ConfigError(f"--algo {algo} --batch-sizes {batch} --fill {fill} (replay.capacity and "
                                  f"replay.min_size here): {exc}") from None


def system_rate(cfg: Config, seconds: float) -> dict[str, float]:
    """Updates/s of the real fused learner fed by the real replay service."""
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    specs = [s for s in roster(cfg) if s.role in ("replay", "learner")]
    specs.append(ServiceSpec("filler", "filler", "spreeze.bench.filler"))

    def ready(p: Progress) -> bool:
        return p.updates > 0  # the learner's `updates`, from its newest metrics

    rows, stop_at = measure(cfg, specs, ready, seconds)
    got = rate(rows, "learner", "updates", stop_at, also=("batch_wait_s",))
    return {"updates_per_s": got["rate"], "batch_wait_fraction": got["batch_wait_s"],
            "window_s": got["window_s"]}


def inproc_rate(cfg: Config, seconds: float, side: str) -> dict[str, float]:
    """Updates/s of one in-process side ("compiled", "eager" or "plain") on in-memory batches."""
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.learner.threads)
    try:
        device = device_of(cfg.learner.actor_device)
        layout, low, high = env_spec(cfg.env_source)
        actor, critic = make_parts(cfg.algo, layout.obs_dim, layout.act_dim, low, high, cfg.algo_config,
                                   device, True, cfg.seed, sparse=cfg.sparse, total_updates=cfg.total_updates)
        gen = torch.Generator().manual_seed(cfg.seed + 31)
        batches = []
        for _ in range(POOL):
            m = torch.rand((cfg.learner.batch_size, layout.width), generator=gen) * 2 - 1
            layout.columns(m)["done"][:] = 0.0
            batches.append(layout.columns(m.to(device)))
        out: dict[str, float] = {}
        loop = plain_loop(cfg.algo)
        if side == "plain" and loop is not None:
            plain = loop(actor, critic)

            def step(b: dict[str, torch.Tensor], want: bool) -> None:
                plain(b, want)
        else:  # compiled, eager, and the plain side of an algorithm without a textbook loop (its eager update)
            if side == "compiled":
                torch._dynamo.reset()  # this process builds many parts: keep one cache entry each
                options = CompileOptions(True, cfg.learner.cuda_graphs)
                actor.compile(options)
                critic.compile(options)
                out["compile_s"] = sum(p.fast.warm_up(batches[0]) for p in (critic, actor) if p.fast is not None)
                check_guards(False)  # as the learner does once its steps are compiled

            def step(b: dict[str, torch.Tensor], want: bool) -> None:
                fused_step(actor, critic, b, want_metrics=want)
        for i in range(WARMUP_UPDATES):
            step(batches[i % POOL], False)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        updates, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            step(batches[updates % POOL], updates % LOSS_EVERY == 0)
            updates += 1
        sync()
        out["updates_per_s"] = updates / (time.perf_counter() - start)
        return out
    finally:
        check_guards(True)
        torch.set_num_threads(before)


def compile_probe(algo: str, hidden: tuple[int, ...], batch: int, threads: int, device: str) -> None:
    """Print the seconds to build and compile (on CUDA: and capture) the fused steps of
    ``algo`` (run in a fresh process; the kernel cache is ``TORCHINDUCTOR_CACHE_DIR``)."""
    torch.set_num_threads(threads)
    cfg = bench_config(algo, batch, hidden, threads, device, 64 * batch, 1.0, Path("."))
    t0 = time.perf_counter()
    layout, low, high = env_spec(cfg.env_source)
    actor, critic = make_parts(algo, layout.obs_dim, layout.act_dim, low, high, cfg.algo_config,
                               device_of(device), True, 0)
    options = CompileOptions(True, cfg.learner.cuda_graphs)
    actor.compile(options)
    critic.compile(options)
    dummy = layout.columns(torch.rand((batch, layout.width), device=device_of(device)))
    for part in (critic, actor):
        if part.fast is not None:
            part.fast.warm_up(dummy)
    print(json.dumps({"compile_s": time.perf_counter() - t0}))


def compile_times(algo: str, hidden: tuple[int, ...], batch: int, threads: int, device: str) -> dict[str, float]:
    """Compile seconds with an empty kernel cache (cold), then with that cache (warm)."""
    call = (f"from spreeze.bench.update import compile_probe; "
            f"compile_probe({algo!r}, {tuple(hidden)!r}, {batch}, {threads}, {device!r})")
    out = {}
    with tempfile.TemporaryDirectory(prefix="spreeze-compile-cache-") as cache:
        env = {**os.environ, CACHE_ENV: cache, "OMP_NUM_THREADS": str(threads)}
        for kind in ("cold", "warm"):
            done = subprocess.run([sys.executable, "-c", call], env=env, capture_output=True, text=True,
                                  check=True)
            out[kind] = json.loads(done.stdout.strip().splitlines()[-1])["compile_s"]
    return out


def run(algos: tuple[str, ...] = tuple(LOOPS), batch_sizes: tuple[int, ...] = (256, 1024, 4096, 8192),
        hidden: tuple[int, ...] = (256, 256), seconds: float = 10.0, threads: int = 1,
        device: str = "cpu", repeats: int = 1, fill: int = 100_000, json_path: str | None = None,
        out: str | None = None, overrides: tuple[str, ...] = (),
        compile_seconds: bool = True) -> dict[str, Any]:
    """Measure every side for every (algo, batch), interleaved; print; return (and write) JSON."""
    if not cxx_compiler():
        raise ConfigError(f"spreeze bench update measures compiled steps, and no C++ compiler runs here "
                          f"($CXX={os.environ.get('CXX', '')!r}, g++) or this Python has no headers: {CXX_HINT}")
    fill = max(fill, max(batch_sizes))
    runs: dict[tuple[str, int], dict[str, list[dict[str, float]]]] = {
        (a, b): {side: [] for side in SIDES} for a in algos for b in batch_sizes}
    compiles = {a: compile_times(a, hidden, batch_sizes[0], threads, device) for a in algos} if compile_seconds else {}
    with tempfile.TemporaryDirectory(prefix="spreeze-bench-update-") as tmp:
        base = Path(out) if out else Path(tmp)
        use_compile_cache(base / "compile-cache")  # this process's compiled side
        for rep in range(repeats):
            for algo in algos:
                for batch in batch_sizes:
                    cfg = bench_config(algo, batch, hidden, threads, device, fill, seconds,
                                       base / f"r{rep}-{algo}-b{batch}", seed=rep, overrides=overrides)
                    k = rep % len(SIDES)
                    for side in SIDES[k:] + SIDES[:k]:
                        got = system_rate(cfg, seconds) if side == "spreeze" else inproc_rate(cfg, seconds, side)
                        runs[(algo, batch)][side].append(got)
    result = summarize(runs, hidden, seconds, threads, device, repeats, fill)
    result["compile_s"] = compiles
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
        ups = {side: [r["updates_per_s"] for r in sides[side]] for side in SIDES}
        row: dict[str, Any] = {"algo": algo, "batch": batch}
        for side in SIDES:
            row[f"{side}_updates_per_s"] = med(ups[side])
            row[f"{side}_frame_rate"] = batch * med(ups[side])
            row[f"{side}_updates_per_s_runs"] = ups[side]
        row.update({
            "ratio": med(ups["spreeze"]) / med(ups["plain"]),  # the headline: system vs plain loop
            "paired_ratio": med(s / p for s, p in zip(ups["spreeze"], ups["plain"])),
            "compiled_over_plain": med(ups["compiled"]) / med(ups["plain"]),
            "compiled_over_eager": med(ups["compiled"]) / med(ups["eager"]),
            "eager_over_plain": med(ups["eager"]) / med(ups["plain"]),
            "spreeze_batch_wait_fraction": med(r["batch_wait_fraction"] for r in sides["spreeze"]),
            "spreeze_window_s_runs": [r["window_s"] for r in sides["spreeze"]],
            "inproc_compile_s_runs": [r["compile_s"] for r in sides["compiled"]],
        })
        rows.append(row)
    return {"bench": "update", "env": ENV, "hidden": list(hidden), "threads": threads, "device": device,
            "seconds": seconds, "repeats": repeats, "fill": fill, "results": rows}


def table(result: dict[str, Any]) -> str:
    lines = [(f"{result['env']} sizes, hidden {result['hidden']}, {result['threads']} thread(s), "
              f"{result['device']}, replay filled with {result['fill']:,} random transitions"),
             (f"{'algo':>4} {'batch':>6} {'spreeze up/s':>12} {'compiled':>9} {'eager':>9} {'plain':>9} "
              f"{'spreeze/plain':>13} {'compiled/plain':>14} {'compiled/eager':>14} {'spreeze fr/s':>13} "
              f"{'batch wait':>10}")]
    for r in result["results"]:
        lines.append(f"{r['algo']:>4} {r['batch']:>6} {r['spreeze_updates_per_s']:>12,.1f} "
                     f"{r['compiled_updates_per_s']:>9,.1f} {r['eager_updates_per_s']:>9,.1f} "
                     f"{r['plain_updates_per_s']:>9,.1f} {r['ratio']:>13.2f} {r['compiled_over_plain']:>14.2f} "
                     f"{r['compiled_over_eager']:>14.2f} {r['spreeze_frame_rate']:>13,.0f} "
                     f"{100 * r['spreeze_batch_wait_fraction']:>9.1f}%")
    for algo, c in result.get("compile_s", {}).items():
        lines.append(f"{algo} compile (fused steps, batch {result['results'][0]['batch']}): "
                     f"cold {c['cold']:.1f} s, warm {c['warm']:.1f} s (kernel cache on disk)")
    if result.get("overrides"):
        lines.append(f"spreeze runs with {' '.join(result['overrides'])}")
    lines.append(f"medians of {result['repeats']} repeat(s), sides side by side; spreeze: real replay + "
                 "learner processes; compiled/eager/plain: in-process on in-memory batches; "
                 "fr/s = batch x updates/s; batch wait: share of the learner's time waiting for batches")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spreeze bench update", description=__doc__.splitlines()[0])
    p.add_argument("--algo", nargs="+", type=algo_arg, default=list(LOOPS),
                   help=f"algorithms: {ALGO_HELP} (default: those with a textbook loop, {' '.join(LOOPS)})")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024, 4096, 8192],
                   help="learner batch sizes, one measurement each")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256], help="hidden sizes, actor and critics")
    p.add_argument("--seconds", type=float, default=10.0, help="measurement window of each side")
    p.add_argument("--threads", type=int, default=1, help="torch threads (learner process and plain loop)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (learner and plain loop)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved repeats (medians reported)")
    p.add_argument("--fill", type=int, default=100_000, help="random transitions in replay (its capacity)")
    p.add_argument("--no-compile-times", action="store_true",
                   help="skip measuring compile seconds cold and warm (two fresh processes per algo)")
    add_output_args(p, "learner.batches_per_request=4")
    args = p.parse_args(argv)
    if (min(args.batch_sizes) <= 0 or min(args.hidden) <= 0 or args.seconds <= 0 or args.threads <= 0
            or args.repeats <= 0 or args.fill <= 0):
        p.error("--batch-sizes, --hidden, --seconds, --threads, --repeats and --fill must be positive")
    args.device = checked_device("actor_device", args.device, len(cuda_devices()))  # refused before anything starts
    checked_configs(tuple(args.algo), tuple(args.batch_sizes), tuple(args.hidden), args.threads, args.device,
                    max(args.fill, max(args.batch_sizes)), args.seconds, tuple(args.overrides))
    run(tuple(args.algo), tuple(args.batch_sizes), tuple(args.hidden), args.seconds, args.threads,
        args.device, args.repeats, args.fill, args.json, args.out, tuple(args.overrides),
        not args.no_compile_times)
    return 0


if __name__ == "__main__":
    sys.exit(main())
