"""`spreeze bench containers`: what the container paths cost, measured side by side on the local engine.

The same short HalfCheetah-v5 run (configs/halfcheetah-smoke.yaml: split learners on CPU, one
sampler), started fresh for each variant, the variants alternated over `--repeats`:
  compose       `docker compose`, COMPOSE_PROFILES=cpu: every socket ipc:// in a shared volume,
                health checks on (the default)
  compose-nohc  the same with every health check replaced by `true`: what health checks cost
  swarm         `docker stack deploy` of docker-stack.yml on a single-node swarm: every socket
                tcp:// on an overlay network: what TCP costs
Per run: env steps/s and update frame rate (medians of the progress lines from the first
evaluation to the budget, so start-up and the random warm-up are left out) and the seconds
from start to the first evaluation. Prints each variant's medians and its ratios to compose.

    spreeze bench containers [--steps 12000] [--repeats 2] [--variants compose compose-nohc swarm] [--json F]

Needs a Docker engine and the images (built first, as docs/containers.md "Building without a package index
or registry" says); swarm needs an active swarm, or makes one on loopback and leaves it after.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from spreeze.bench.engine import ROOT, compose, images, jsonl, sh, volume_file, wait_for

PROJECT = "spreezebench"
RUN = "bench"
VARIANTS = ("compose", "compose-nohc", "swarm")
START_S = 600.0  # longest wait for the first evaluation (image start, imports, warm-up)


def run_env(steps: int) -> dict[str, str]:
    return {"COMPOSE_PROFILES": "cpu", "SPREEZE_CONFIG": "halfcheetah-smoke.yaml", "SPREEZE_ENV": "HalfCheetah-v5",
            "SPREEZE_TOTAL_STEPS": str(steps), "SPREEZE_RUN": RUN, "SPREEZE_SAMPLERS": "1",
            "SPREEZE_VISUALIZER_PORT": "18082"}


def no_health_override(folder: Path) -> Path:
    """A compose override whose health checks always pass at once (`true`)."""
    names = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    path = folder / "no-health.yml"
    path.write_text(yaml.safe_dump({"services": {n: {"healthcheck": {"test": ["CMD", "true"]}} for n in names}}))
    return path


class Variant:
    """Starts and stops one way of running the stack; `volume` holds the run directory."""

    def __init__(self, name: str, steps: int, scratch: Path) -> None:
        self.name, self.env = name, run_env(steps)
        files = ["-f", "docker-compose.yml"]
        if name == "compose-nohc":
            files += ["-f", str(no_health_override(scratch))]
        self.files = files
        self.volume = f"{PROJECT}_runs"

    def up(self) -> None:
        if self.name == "swarm":
            sh("docker", "stack", "deploy", "--resolve-image", "never", "-c", "docker-stack.yml", PROJECT,
               env=self.env)
        else:
            compose(PROJECT, *self.files, "up", "-d", env=self.env)

    def down(self) -> None:
        if self.name == "swarm":
            sh("docker", "stack", "rm", PROJECT, check=False)
            wait_for(lambda: not sh("docker", "ps", "-q", "--filter",
                                    f"label=com.docker.stack.namespace={PROJECT}").stdout.strip(), 180,
                     "the stack's containers gone")
            wait_for(lambda: not sh("docker", "network", "ls", "-q", "--filter",
                                    f"name={PROJECT}_").stdout.strip(), 120, "the stack's network gone")
        else:
            compose(PROJECT, *self.files, "down", "-v", env=self.env, check=False)
        # a task's container may hold the volume a moment longer; the next run must start empty
        wait_for(lambda: not sh("docker", "volume", "ls", "-q", "--filter", f"name={self.volume}").stdout.strip()
                 or sh("docker", "volume", "rm", self.volume, check=False).returncode == 0, 120,
                 f"the volume {self.volume} removed")


def measure(variant: Variant, steps: int) -> dict[str, float]:
    variant.down()
    t0 = time.monotonic()
    variant.up()
    try:
        def rows() -> list[dict[str, Any]]:
            return jsonl(volume_file(variant.volume, f"{RUN}/metrics.jsonl"))

        wait_for(lambda: any(r["kind"] == "eval" for r in rows()), START_S, f"{variant.name}: a first evaluation")
        first_eval_s = time.monotonic() - t0
        def finished() -> list[dict[str, Any]]:
            got = rows()
            return got if any(r["kind"] == "progress" and r["env_steps"] >= steps for r in got) else []

        done = wait_for(finished, START_S + steps / 10, f"{variant.name}: the budget of {steps} env steps")
    finally:
        variant.down()
    first = min(r["wall_time"] for r in done if r["kind"] == "eval")
    lines = [r for r in done if r["kind"] == "progress" and r["wall_time"] > first and r["env_steps"] < steps]
    if len(lines) < 3:
        raise RuntimeError(f"{variant.name}: only {len(lines)} progress lines after the first evaluation; "
                           f"raise --steps")
    return {"steps_per_s": statistics.median(r["sampling_hz"] for r in lines),
            "update_frames_per_s": statistics.median(r["update_frame_rate"] for r in lines),
            "first_eval_s": first_eval_s}


def ensure_swarm() -> bool:
    """True when this call made the swarm (and so should leave it)."""
    state = sh("docker", "info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()
    if state != "active":
        sh("docker", "swarm", "init", "--advertise-addr", "127.0.0.1", "--listen-addr", "127.0.0.1:2377")
    node = sh("docker", "info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
    sh("docker", "node", "update", "--label-add", "spreeze.learner=true", node)
    return state != "active"


def report(results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
    base = medians.get("compose")
    print(f"{'variant':14s} {'env steps/s':>12s} {'update fr/s':>12s} {'1st eval s':>11s}   ratios to compose")
    for name, m in medians.items():
        ratio = (f"steps {m['steps_per_s'] / base['steps_per_s']:.3f}  "
                 f"updates {m['update_frames_per_s'] / base['update_frames_per_s']:.3f}") if base else ""
        print(f"{name:14s} {m['steps_per_s']:12,.0f} {m['update_frames_per_s']:12,.0f} {m['first_eval_s']:11.0f}   "
              f"{ratio if name != 'compose' else ''}")
    return medians


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spreeze bench containers", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12_000, help="env steps per run (the first 2,000 are warm-up)")
    p.add_argument("--repeats", type=int, default=2, help="runs per variant, alternated")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   help="set-ups to compare: compose, compose without health checks, swarm (default all)")
    p.add_argument("--json", help="also write the results to this JSON file")
    args = p.parse_args(argv)
    images(PROJECT)
    left_swarm = "swarm" in args.variants and ensure_swarm()
    results: dict[str, list[dict[str, float]]] = {v: [] for v in args.variants}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for i in range(args.repeats):
                for name in args.variants:
                    got = measure(Variant(name, args.steps, Path(scratch)), args.steps)
                    results[name].append(got)
                    print(f"[{i + 1}/{args.repeats}] {name}: {got['steps_per_s']:,.0f} env steps/s, "
                          f"{got['update_frames_per_s']:,.0f} update fr/s, first eval {got['first_eval_s']:.0f} s",
                          flush=True)
    finally:
        if left_swarm:
            sh("docker", "swarm", "leave", "--force", check=False)
    medians = report(results)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "medians": medians}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
