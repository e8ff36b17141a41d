"""docker-stack.yml on a real single-node Docker Swarm (SPREEZE_REAL_PATHS=1; .ci/run sets it).

The test makes its own swarm (listening on loopback only) unless one is active, labels the
node for learners, deploys the stack (every socket over tcp on the stack's own overlay
network), and checks: two evaluation records; `docker service scale <stack>_sampler=3`
counted three times in replay's ledger; a task whose main process is SIGKILLed replaced by
Swarm and registered again; `docker stack rm` (and `swarm leave` of a swarm it made) leaving
nothing behind. It prints the time from deploy to the first evaluation and the run's rates.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests import docker_engine as de
from spreeze.bench.engine import jsonl, volume_file
from tests.test_real_paths import ledger_senders

WHY_NOT = de.ready()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)

STACK = "spreezeswarm"
RUN = "swarm"
STACK_ENV = {"SPREEZE_CONFIG": "halfcheetah-smoke.yaml", "SPREEZE_ENV": "HalfCheetah-v5",
             "SPREEZE_TOTAL_STEPS": "1000000", "SPREEZE_RUN": RUN, "SPREEZE_SAMPLERS": "1",
             "SPREEZE_VISUALIZER_PORT": "18081"}
LABEL = "spreeze.learner=true"


@pytest.fixture(scope="module")
def swarm() -> Iterator[str]:
    """The node id of an active single-node swarm; one made here is left at the end."""
    de.images()
    state = de.sh("docker", "info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()
    made = state != "active"
    if made:
        de.sh("docker", "swarm", "init", "--advertise-addr", "127.0.0.1", "--listen-addr", "127.0.0.1:2377")
    node = de.sh("docker", "info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
    de.sh("docker", "node", "update", "--label-add", LABEL, node)
    try:
        yield node
    finally:
        if made:
            de.sh("docker", "swarm", "leave", "--force", check=False)
        else:
            de.sh("docker", "node", "update", "--label-rm", LABEL.split("=")[0], node, check=False)


def stack_containers() -> list[dict[str, Any]]:
    ids = de.sh("docker", "ps", "-q", "--filter", f"label=com.docker.stack.namespace={STACK}").stdout.split()
    return json.loads(de.sh("docker", "inspect", *ids).stdout) if ids else []


def service_name(container: dict[str, Any]) -> str:
    return str(container["Config"]["Labels"]["com.docker.swarm.service.name"])


def run_file(name: str) -> str:
    return volume_file(f"{STACK}_runs", f"{RUN}/{name}")


def metrics() -> list[dict[str, Any]]:
    return jsonl(run_file("metrics.jsonl"))


def evals() -> list[dict[str, Any]]:
    return [r for r in metrics() if r["kind"] == "eval"]


def registered(sid: str) -> dict[str, Any]:
    text = run_file("services.json")
    return dict(json.loads(text).get(sid, {})) if text else {}


def rates(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Median env steps/s and update frame rate over the progress lines after the first evaluation."""
    first = min(r["wall_time"] for r in rows if r["kind"] == "eval")
    lines = [r for r in rows if r["kind"] == "progress" and r["wall_time"] > first]
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0.0  # noqa: E731
    return med([r["sampling_hz"] for r in lines]), med([r["update_frame_rate"] for r in lines])


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_stack_deploys_trains_scales_and_replaces_a_killed_task(swarm: str) -> None:
    de.remove_stack(STACK)
    try:
        t0 = time.monotonic()
        de.sh("docker", "stack", "deploy", "--resolve-image", "never", "-c", "docker-stack.yml", STACK,
              env=STACK_ENV)
        de.wait_for(evals, 600, "the first evaluation")
        first_eval_s = time.monotonic() - t0

        de.sh("docker", "service", "scale", f"{STACK}_sampler=3")
        de.wait_for(lambda: len([s for s in ledger_senders(metrics()) if s.startswith("sampler-")]) >= 3,
                    300, "three samplers in replay's ledger")

        # SIGKILL the critic-learner's main process: Swarm replaces the task, which registers again
        victim = next(c for c in stack_containers() if service_name(c) == f"{STACK}_critic_learner")
        os.kill(victim["State"]["Pid"], signal.SIGKILL)
        de.wait_for(lambda: registered("critic_learner").get("restarts", 0) >= 1
                    and registered("critic_learner").get("state") == "running", 300, "the critic-learner back")
        # a new task, not the old container; `docker ps` may list it a moment after it registered
        de.wait_for(lambda: [c for c in stack_containers() if service_name(c) == f"{STACK}_critic_learner"
                             and c["Id"] != victim["Id"]], 60, "the critic-learner's new container")

        de.wait_for(lambda: len(evals()) >= 2, 600, "two evaluations")
        steps_hz, frames_hz = rates(metrics())
        print(f"\nswarm over tcp: first evaluation {first_eval_s:.0f} s after deploy; "
              f"median {steps_hz:,.0f} env steps/s, {frames_hz:,.0f} update frames/s")
    except BaseException:
        for svc in ("supervisor", "critic_learner", "evaluator", "sampler"):
            logs = de.sh("docker", "service", "logs", "--tail", "30", f"{STACK}_{svc}", check=False)
            print(f"--- {svc}\n{logs.stdout[-4000:]}{logs.stderr[-2000:]}")
        raise
    finally:
        de.remove_stack(STACK)
    assert not stack_containers()
    for kind in ("service", "network", "volume"):
        left = de.sh("docker", kind, "ls", "-q", "--filter", f"name={STACK}_").stdout.split()
        assert left == [], (kind, left)
    configs = de.sh("docker", "config", "ls", "-q", "--filter", f"name={STACK}_", check=False).stdout.split()
    assert configs == []
    assert subprocess.run(["docker", "ps", "-aq", "--filter", f"label=com.docker.stack.namespace={STACK}"],
                          capture_output=True, text=True, timeout=60).stdout.strip() == ""
