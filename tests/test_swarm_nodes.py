"""docker-stack.yml on a real two-node Docker Swarm (SPREEZE_REAL_PATHS=1; .ci/run sets it).

The second node is a container running its own dockerd (docker/Dockerfile.node, from the
offline base image) on a bridge network the test makes; the host engine is the manager and
the container joins as a worker, with the Spreeze image loaded into it from the host. The
stack deploys with CURVE keys as Swarm secrets: replay, learners, supervisor, evaluator and
visualizer on the manager (label spreeze.learner=true), the sampler on the worker
(SPREEZE_SAMPLER_NODES="node.role == worker"), every socket over the overlay. Checked, in
one run:

1. the first evaluation, with the worker's sampler in replay's ledger;
2. sampling across the overlay against the sampler moved to the manager (printed ratio);
3. samplers anywhere, one per node: the worker drained -> its sampler is rescheduled on the
   manager and training goes on; the worker active again -> `docker service scale` puts the
   new sampler there;
4. the worker's container killed -> Swarm marks it down and its sampler runs on the manager;
5. replay's ledger balances for every sender (inserted = stored + evicted + rejected).

Everything it made (stack, swarm, node container, its volume, the bridge) goes, pass or fail.
The subnet is SPREEZE_NODES_SUBNET (a /24, default 10.213.0.0/24) when that one is taken.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spreeze.bench.engine import jsonl, volume_file
from spreeze.common.curve_auth import make_keys
from tests import docker_engine as de
from tests.test_real_paths import ledger_senders

WHY_NOT = de.ready()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)

STACK = "spreezenodes"
RUN = "nodes"
NODE_IMAGE = "spreeze-node:bookworm"
NODE = "spreeze-node-2"  # the worker's container, its hostname and so its node name
NETWORK = "spreeze-nodes"  # the bridge between the host engine and the worker
SUBNET = os.environ.get("SPREEZE_NODES_SUBNET", "10.213.0.0/24")
MANAGER_IP = SUBNET.rsplit(".", 1)[0] + ".1"  # the bridge's gateway: the host itself
WORKER_IP = SUBNET.rsplit(".", 1)[0] + ".2"
LABEL = "spreeze.learner=true"
KEYS_IN = "/run/secrets/spreeze-keys"
WINDOW_S = 45  # seconds of progress lines per throughput measurement


def inner(*argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """A docker command on the worker's own engine."""
    return de.sh("docker", "exec", NODE, "docker", *argv, **kw)


def start_worker() -> None:
    de.sh("docker", "build", "-q", "-t", NODE_IMAGE, "-f", "docker/Dockerfile.node", "docker", timeout=900)
    de.sh("docker", "network", "create", "--subnet", SUBNET, "--gateway", MANAGER_IP, NETWORK)
    # a dockerd needs most capabilities, writable cgroups and its own storage; not --privileged,
    # which also asks for capabilities some hosts (containers themselves) cannot grant
    de.sh("docker", "run", "-d", "--name", NODE, "--hostname", NODE, "--network", NETWORK, "--ip", WORKER_IP,
          "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE", "--security-opt", "seccomp=unconfined",
          "--security-opt", "apparmor=unconfined", "-v", "/sys/fs/cgroup:/sys/fs/cgroup",
          "-v", f"{NODE}-docker:/var/lib/docker", NODE_IMAGE,
          "dockerd", "--storage-driver=overlay2", f"--cgroup-parent=/{NODE}")
    de.wait_for(lambda: inner("info", check=False).returncode == 0, 120, "the worker's dockerd")
    save = subprocess.Popen(["docker", "save", de.CPU_IMAGE], stdout=subprocess.PIPE)
    loaded = subprocess.run(["docker", "exec", "-i", NODE, "docker", "load", "-q"], stdin=save.stdout,
                            capture_output=True, text=True, timeout=900)
    assert save.wait(timeout=60) == 0 and loaded.returncode == 0, loaded.stderr[-2000:]


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[dict[str, str]]:
    """{"manager": id, "worker": id} of a swarm made here: the host engine and a container node."""
    state = de.sh("docker", "info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()
    if state != "inactive":
        pytest.skip(f"this engine is already in a swarm ({state}); the two-node test makes its own")
    de.images()
    try:
        start_worker()
        de.sh("docker", "swarm", "init", "--advertise-addr", MANAGER_IP, "--listen-addr", f"{MANAGER_IP}:2377",
              "--dispatcher-heartbeat", "2s")  # a vanished node is declared down within seconds
        token = de.sh("docker", "swarm", "join-token", "-q", "worker").stdout.strip()
        inner("swarm", "join", "--token", token, "--advertise-addr", WORKER_IP, f"{MANAGER_IP}:2377")
        manager = de.sh("docker", "info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
        worker = inner("info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
        de.sh("docker", "node", "update", "--label-add", LABEL, manager)
        de.wait_for(lambda: node_field(worker, "{{.Status.State}}") == "ready", 60, "the worker ready")
        yield {"manager": manager, "worker": worker}
    finally:
        de.sh("docker", "rm", "-f", NODE, check=False)
        de.sh("docker", "swarm", "leave", "--force", check=False)
        de.sh("docker", "volume", "rm", f"{NODE}-docker", check=False)
        de.sh("docker", "network", "rm", NETWORK, check=False)


def node_field(node: str, template: str) -> str:
    return de.sh("docker", "node", "inspect", "--format", template, node, check=False).stdout.strip()


def sampler_nodes() -> list[str]:
    """The node id of each sampler task whose container runs (healthy or not yet checked)."""
    out = de.sh("docker", "service", "ps", "-q", "--filter", "desired-state=running", f"{STACK}_sampler",
                check=False).stdout.split()
    if not out:
        return []
    tasks = json.loads(de.sh("docker", "inspect", *out, check=False).stdout or "[]")
    return sorted(t["NodeID"] for t in tasks if t["Status"]["State"] in ("starting", "running"))


def run_file(name: str) -> str:
    return volume_file(f"{STACK}_runs", f"{RUN}/{name}")


def metrics() -> list[dict[str, Any]]:
    return jsonl(run_file("metrics.jsonl"))


def samplers_heard() -> set[str]:
    return {s for s in ledger_senders(metrics()) if s.startswith("sampler-")}


def replay_ledger() -> dict[str, dict[str, int]]:
    """sender -> {inserted, stored, evicted, rejected} from replay's newest metrics."""
    rows = [r for r in metrics() if r["kind"] == "metrics" and r.get("service") == "replay"]
    books: dict[str, dict[str, int]] = {}
    for key, value in (rows[-1].items() if rows else ()):
        if key.startswith("ledger/"):
            _, sender, field = key.split("/")
            books.setdefault(sender, {})[field] = int(value)
    return books


def critic_updates() -> int:
    rows = [r for r in metrics() if r["kind"] == "metrics" and r.get("service") == "critic_learner"]
    return int(rows[-1].get("updates", 0)) if rows else 0


def compiled() -> bool:
    """Both learners report a finished background compile (their steps no longer run eagerly)."""
    newest = {r["service"]: r for r in metrics() if r["kind"] == "metrics"}
    return all("compile_s" in newest.get(role, {}) for role in ("actor_learner", "critic_learner"))


def progress() -> list[dict[str, Any]]:
    return [r for r in metrics() if r["kind"] == "progress"]


def measure(seconds: float) -> float:
    """Median sampling rate (env steps/s) of the progress lines written in the next `seconds`."""
    mark = max((r["wall_time"] for r in progress()), default=0.0)  # seconds since the run's start
    time.sleep(seconds)
    hz = sorted(r["sampling_hz"] for r in progress() if r["wall_time"] > mark)
    return hz[len(hz) // 2] if hz else 0.0


def new_sampler(before: set[str], t0: float, what: str) -> float:
    """Seconds from t0 until a sampler not in `before` has rows stored in replay."""
    de.wait_for(lambda: samplers_heard() - before, 300, what)
    return time.monotonic() - t0


def move_sampler(old: str, new: str, node: str) -> None:
    """Swap the sampler service's placement constraint; wait for its new task on `node` to feed replay."""
    before = samplers_heard()
    de.sh("docker", "service", "update", "-q", "--detach", "--constraint-rm", old, "--constraint-add", new,
          f"{STACK}_sampler")
    new_sampler(before, time.monotonic(), f"the sampler on {node}")
    de.wait_for(lambda: sampler_nodes() == [node], 120, f"the only sampler on {node}")


@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_stack_across_two_nodes_survives_a_drain_and_a_lost_node(two_nodes: dict[str, str], tmp_path: Path) -> None:
    manager, worker = two_nodes["manager"], two_nodes["worker"]
    keys = make_keys(tmp_path / "keys")
    env = {"SPREEZE_CONFIG": "halfcheetah-smoke.yaml", "SPREEZE_ENV": "HalfCheetah-v5",
           "SPREEZE_TOTAL_STEPS": "1000000", "SPREEZE_RUN": RUN, "SPREEZE_SAMPLERS": "1",
           "SPREEZE_VISUALIZER_PORT": "18082", "SPREEZE_KEYS": KEYS_IN, "SPREEZE_KEYS_HOST": str(keys),
           "SPREEZE_SAMPLER_NODES": "node.role == worker"}
    report: list[str] = []
    de.remove_stack(STACK)
    try:
        t0 = time.monotonic()
        de.sh("docker", "stack", "deploy", "--resolve-image", "never", "-c", "docker-stack.yml",
              "-c", "docker/stack-keys.yml", STACK, env=env)
        de.wait_for(lambda: [r for r in metrics() if r["kind"] == "eval"], 900, "the first evaluation")
        report.append(f"first evaluation {time.monotonic() - t0:.0f} s after deploy (sampler on the worker)")
        on_worker = de.wait_for(samplers_heard, 300, "the worker's sampler in replay's ledger")
        assert sampler_nodes() == [worker]
        assert f"keys: {KEYS_IN}" in run_file("config.yaml")  # every socket of the run admits key holders only
        roles = {n: node_field(n, "{{.Spec.Role}}") for n in (manager, worker)}
        assert roles == {manager: "manager", worker: "worker"}
        # every other task on the manager, the node with the run volume
        others = de.sh("docker", "stack", "ps", "-q", "--filter", "desired-state=running", STACK).stdout.split()
        placed = {t["ServiceID"]: t["NodeID"] for t in json.loads(de.sh("docker", "inspect", *others).stdout)}
        sampler_service = de.sh("docker", "service", "inspect", "--format", "{{.ID}}",
                                f"{STACK}_sampler").stdout.strip()
        assert {n for s, n in placed.items() if s != sampler_service} == {manager}

        # throughput, once the learners' compiled steps are in, and A-B-A so that the run's drift
        # cancels: the sampler across the overlay, then on the manager, then across again
        de.wait_for(compiled, 600, "the learners' compiled update steps")
        across = [measure(WINDOW_S)]
        move_sampler("node.role == worker", "node.role == manager", manager)
        local = measure(WINDOW_S)
        move_sampler("node.role == manager", "node.role == worker", worker)
        across.append(measure(WINDOW_S))
        ratio = sum(across) / len(across) / max(local, 1e-9)
        report.append(f"sampling across the overlay {across[0]:,.0f} and {across[1]:,.0f} Hz, on the manager "
                      f"{local:,.0f} Hz between them: ratio {ratio:.2f}")

        # samplers anywhere (the stack's default), two of them: one per node
        before = samplers_heard()
        de.sh("docker", "service", "update", "-q", "--detach", "--constraint-rm", "node.role == worker",
              "--replicas", "2", f"{STACK}_sampler")
        de.wait_for(lambda: sampler_nodes() == sorted([manager, worker]), 300, "a sampler on each node")
        new_sampler(before, time.monotonic(), "the new samplers in replay's ledger")

        # drain the worker: its sampler comes back on the manager, training goes on
        before, updates = samplers_heard(), critic_updates()
        t = time.monotonic()
        de.sh("docker", "node", "update", "--availability", "drain", worker)
        de.wait_for(lambda: sampler_nodes() == [manager, manager], 300, "both samplers on the manager")
        report.append(f"worker drained: sampler rows from the manager again after "
                      f"{new_sampler(before, t, 'the rescheduled sampler'):.0f} s")
        de.wait_for(lambda: critic_updates() > updates, 300, "updates after the drain")

        # the worker back: scaling up puts the new sampler there
        de.sh("docker", "node", "update", "--availability", "active", worker)
        before = samplers_heard()
        t = time.monotonic()
        de.sh("docker", "service", "scale", "-d", f"{STACK}_sampler=3")
        de.wait_for(lambda: sampler_nodes().count(worker) == 1 and len(sampler_nodes()) == 3, 300,
                    "the third sampler on the worker")
        report.append(f"worker active again, scaled to 3: its sampler's rows after "
                      f"{new_sampler(before, t, 'the worker sampler'):.0f} s")

        # the worker vanishes: Swarm declares it down and runs its sampler on the manager
        before, updates = samplers_heard(), critic_updates()
        t = time.monotonic()
        de.sh("docker", "kill", NODE)
        de.wait_for(lambda: node_field(worker, "{{.Status.State}}") == "down", 120, "the worker declared down")
        down_s = time.monotonic() - t
        de.wait_for(lambda: sampler_nodes() == [manager] * 3, 300, "three samplers on the manager")
        report.append(f"worker killed: down after {down_s:.0f} s, the replacement sampler's rows after "
                      f"{new_sampler(before, t, 'the replacement sampler'):.0f} s")
        de.wait_for(lambda: critic_updates() > updates, 300, "updates after the lost node")

        books = replay_ledger()
        assert on_worker <= set(books)
        for sender, book in books.items():
            assert book["inserted"] == book["stored"] + book["evicted"] + book["rejected"], (sender, book)
        print("\ntwo-node swarm:\n  " + "\n  ".join(report))
    except BaseException:
        for svc in ("supervisor", "replay", "critic_learner", "sampler"):
            logs = de.sh("docker", "service", "logs", "--tail", "30", f"{STACK}_{svc}", check=False)
            print(f"--- {svc}\n{logs.stdout[-4000:]}{logs.stderr[-2000:]}")
        print("\n".join(report))
        raise
    finally:
        de.remove_stack(STACK)
    left = de.sh("docker", "ps", "-aq", "--filter", f"label=com.docker.stack.namespace={STACK}").stdout.strip()
    assert left == ""
