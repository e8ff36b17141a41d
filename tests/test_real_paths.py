"""The two real paths a user takes, on a real Docker engine (SPREEZE_REAL_PATHS=1; .ci/run sets it).

- A bare machine: a container of Debian bookworm with python3 and nothing optional (no GL,
  no browser, no Docker, no C++ compiler) runs the README's install command and a short
  HalfCheetah-v5 run, which must evaluate with no service restart, then the README's test
  command, which must pass (what needs the optional parts skips, saying why).
- `docker compose` with COMPOSE_PROFILES=cpu on images built offline: every container
  healthy, two evaluation records and checkpoints, learners on compiled update steps, two scaled samplers and a sampler
  container outside the project counted in replay's ledger, a SIGKILLed container
  restarted by compose and registered again, the SIGKILLed supervisor restarted and its run
  continued, a second `up` of the finished run ending at once with every container's exit
  status 0, and nothing left after `down -v`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from spreeze.bench.engine import jsonl
from spreeze.common.curve_auth import make_keys
from tests import docker_engine as de

WHY_NOT = de.ready()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)

RUN = "ci"  # run directory in the compose project's runs volume
OUTSIDE = f"{de.PROJECT}-outside-sampler"  # a sampler container that is not part of the project
SHORT_RUN = ["--env", "HalfCheetah-v5", "--run-dir", "runs/bare", "--total-steps", "3000",
             "sampler.warmup_steps=1000", "replay.min_size=1000", "eval.every_updates=500", "eval.episodes=1"]


@pytest.fixture(scope="module")
def images() -> None:
    de.images()


def failures(pytest_out: str) -> str:
    """pytest's FAILURES section (its tail is pushed out of sight by the warnings summary)."""
    section = pytest_out.partition("= FAILURES =")[2].partition("short test summary info")[0]
    return section[:8000] + "\n[...]\n" if section else ""


@pytest.mark.slow
@pytest.mark.timeout(3300)
def test_quick_start_on_a_bare_machine_trains_evaluates_and_passes_the_tests(tmp_path: Path, images: None) -> None:
    install, tests = de.quick_start_commands()
    assert install.endswith("spreeze train"), install
    src = de.source_copy(tmp_path / "src")
    script = f"{install} {' '.join(SHORT_RUN)} && {tests} -p no:cacheprovider"
    done = subprocess.run(["docker", "run", "--rm", "--network", "host", *de.pip_passthrough(),
                           "-v", f"{src}:/src", "-w", "/src", de.BARE_IMAGE, "bash", "-c", script],
                          capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, failures(done.stdout) + done.stdout[-3000:] + done.stderr[-3000:]
    assert "budget of 3,000 env steps reached" in done.stdout, done.stdout[-3000:]
    summary = done.stdout.strip().splitlines()[-1]  # pytest's last line: "N passed, M skipped in S s"
    assert " passed" in summary and "failed" not in summary and "error" not in summary, done.stdout[-6000:]
    rows = jsonl((src / "runs" / "bare" / "metrics.jsonl").read_text())
    assert [r for r in rows if r["kind"] == "eval"], "no evaluation record"
    events = [r for r in rows if r["kind"] == "event"]
    assert not [e for e in events if e.get("event") == "restart"], events
    unavailable = [e for e in events if e.get("event") == "video_unavailable"]
    assert unavailable and "libosmesa6" in unavailable[0]["reason"]  # said why, and went on
    eager = [e for e in events if e.get("event") == "plan" and e.get("key") == "learner.compile"]
    assert eager and eager[0]["value"] is False and "g++" in eager[0]["reason"], events  # no compiler: planned eager


# ------------------------------------------------------------------ docker compose, CPU profile

COMPOSE_ENV = {"COMPOSE_PROFILES": "cpu", "SPREEZE_CONFIG": "halfcheetah-smoke.yaml", "SPREEZE_ENV": "HalfCheetah-v5",
               "SPREEZE_TOTAL_STEPS": "1000000", "SPREEZE_RUN": RUN, "SPREEZE_SAMPLERS": "2",
               "SPREEZE_BASE_IMAGE": de.GL_IMAGE, "SPREEZE_VISUALIZER_PORT": "18080"}


def metrics(run: str = RUN) -> list[dict[str, Any]]:
    return jsonl(de.read_volume_file("runs", f"{run}/metrics.jsonl"))


def ledger_senders(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Rows stored per sender, from replay's newest metrics."""
    replay = [r for r in rows if r["kind"] == "metrics" and r.get("service") == "replay"]
    if not replay:
        return {}
    return {k.split("/")[1]: int(v) for k, v in replay[-1].items()
            if k.startswith("ledger/") and k.endswith("/stored") and int(v) > 0}


def services_json() -> dict[str, Any]:
    text = de.read_volume_file("runs", f"{RUN}/services.json")
    return json.loads(text) if text else {}


def all_healthy(count: int = 8) -> bool:
    found = de.containers(all_states=False)
    states = {de.service_of(c): c["State"].get("Health", {}).get("Status") for c in found}
    return len(found) == count and all(s == "healthy" for s in states.values())


def critic_metric(key: str, run: str = RUN) -> float:
    """The critic-learner's newest value of a metric (0 before it reports one)."""
    rows = [r for r in metrics(run) if r["kind"] == "metrics" and r.get("service") == "critic_learner"]
    return float(rows[-1].get(key, 0)) if rows else 0.0


def critic_updates(run: str = RUN) -> int:
    return int(critic_metric("updates", run))


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_compose_cpu_profile_on_a_real_engine(images: None) -> None:
    de.compose("down", "-v", "--remove-orphans", env=COMPOSE_ENV, check=False)
    subprocess.run(["docker", "rm", "-f", OUTSIDE], capture_output=True, timeout=60)
    try:
        de.compose("up", "-d", "--scale", "sampler=2", env=COMPOSE_ENV, timeout=600)
        # 8 containers: supervisor, replay, actor- and critic-learner, evaluator, visualizer, 2 samplers
        de.wait_for(all_healthy, 420, "every container healthy")
        de.wait_for(lambda: len([s for s in ledger_senders(metrics()) if s.startswith("sampler-")]) >= 2,
                    300, "two compose samplers in replay's ledger")

        # a sampler on "another host": a container outside the project, over the published tcp ports
        subprocess.run(["docker", "run", "-d", "--name", OUTSIDE, "--network", "host", de.CPU_IMAGE,
                        "spreeze", "sampler", "--connect", "tcp://127.0.0.1:5555", "--id", "sampler-outside"],
                       check=True, capture_output=True, timeout=120)
        de.wait_for(lambda: "sampler-outside" in ledger_senders(metrics()), 300, "the outside sampler's rows")

        # crash-only: SIGKILL the critic-learner's main process (from the host: `docker kill` would count
        # as a manual stop, which no restart policy restarts); compose restarts it, it registers again
        victim = next(c for c in de.containers(all_states=False) if de.service_of(c) == "critic_learner_cpu")
        os.kill(victim["State"]["Pid"], signal.SIGKILL)
        de.wait_for(lambda: services_json().get("critic_learner", {}).get("restarts", 0) >= 1
                    and services_json()["critic_learner"]["state"] == "running", 300, "the critic-learner back")
        restarted = json.loads(de.sh("docker", "inspect", victim["Id"]).stdout)[0]
        assert restarted["RestartCount"] >= 1 and restarted["State"]["Running"]
        before = critic_updates()
        de.wait_for(lambda: critic_updates() > before, 300, "updates after the restart")

        de.wait_for(lambda: len([r for r in metrics() if r["kind"] == "eval"]) >= 2, 600, "two evaluations")
        # the image holds g++ and the Python headers: the plan keeps learner.compile on, the learners compile
        de.wait_for(lambda: critic_metric("compiled") == 1.0, 600, "compiled update steps in the critic-learner")
        health = de.compose("exec", "-T", "critic_learner_cpu", "spreeze", "health", env=COMPOSE_ENV).stdout
        assert "running; compiled update steps" in health, health
        listing = de.sh("docker", "run", "--rm", "-v", f"{de.PROJECT}_runs:/v:ro", "--entrypoint", "ls",
                        de.CPU_IMAGE, f"/v/{RUN}/checkpoints").stdout.split()
        assert {"best.pt", "latest.pt"} <= set(listing), listing
        # the image holds libosmesa6: the evaluator films (in the background, at low priority)
        events = lambda: [r.get("event") for r in metrics() if r["kind"] == "event"]  # noqa: E731
        de.wait_for(lambda: "video" in events(), 600, "an evaluation video")
        assert "video_unavailable" not in events()
        de.wait_for(all_healthy, 120, "every container healthy again (a restarted one starts its checks anew)")

        # the supervisor itself: compose restarts its container, `--or-resume` continues the run, and
        # the containers it did not start register with the new one (or are restarted and register)
        sessions = len([r for r in metrics() if r["kind"] == "start"])
        supervisor = next(c for c in de.containers(all_states=False) if de.service_of(c) == "supervisor")
        killed_at = time.time()
        os.kill(supervisor["State"]["Pid"], signal.SIGKILL)
        de.wait_for(lambda: len([r for r in metrics() if r["kind"] == "start"]) > sessions, 300,
                    "a resumed supervisor session")

        def heard_again() -> set[str]:  # by the new supervisor: the roster it writes, heartbeats after the kill
            rows = services_json()
            return {sid for sid, row in rows.items()
                    if row.get("state") == "running" and (row.get("last_heartbeat") or 0) > killed_at + 1}
        wanted = {"replay", "critic_learner", "actor_learner", "evaluator", "visualizer"}
        try:
            de.wait_for(lambda: wanted <= heard_again(), 300,
                        "replay, learners, evaluator and visualizer registered with the resumed supervisor")
        except AssertionError as exc:  # say who is missing and what the roster says of them
            raise AssertionError(f"{exc}: heard {sorted(heard_again())}; services.json {services_json()}") from None
        before = critic_updates()
        de.wait_for(lambda: critic_updates() > before, 300, "updates after the supervisor's restart")

        # a second `up` of the same run once its budget is spent: it ends at once, every container exits 0
        de.compose("stop", env=COMPOSE_ENV, timeout=300)
        de.compose("up", "-d", "--scale", "sampler=2", env={**COMPOSE_ENV, "SPREEZE_TOTAL_STEPS": "1000"}, timeout=600)
        de.wait_for(lambda: not de.containers(all_states=False), 300, "every container down after a finished run")
        exits = {c["Name"]: (c["State"]["ExitCode"], c["RestartCount"]) for c in de.containers()}
        assert all(code == 0 for code, _ in exits.values()), exits
        assert any(r["kind"] == "event" and "budget of 1,000" in str(r.get("reason", "")) for r in metrics()) or \
            "budget of 1,000 env steps reached" in de.compose("logs", "supervisor", env=COMPOSE_ENV).stdout
    except BaseException:
        logs = de.compose("logs", "--tail", "40", env=COMPOSE_ENV, check=False)
        print(logs.stdout[-20000:])
        raise
    finally:
        subprocess.run(["docker", "rm", "-f", OUTSIDE], capture_output=True, timeout=60)
        de.compose("down", "-v", "--remove-orphans", env=COMPOSE_ENV, timeout=300)
    assert de.containers() == []
    volumes = de.sh("docker", "volume", "ls", "-q", "--filter", f"name={de.PROJECT}_").stdout.split()
    assert volumes == []
    networks = de.sh("docker", "network", "ls", "-q", "--filter", f"name={de.PROJECT}_").stdout.split()
    assert networks == []


KEYED = f"{de.PROJECT}-keyed-sampler"  # outside samplers of the keys test: one holding the keys...
KEYLESS = f"{de.PROJECT}-keyless-sampler"  # ...and one without


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_compose_with_keys_as_secrets_admits_key_holders_only(images: None, tmp_path: Path) -> None:
    """docker/keys.override.yml: the CURVE keys as compose secrets. A sampler holding them joins
    over the published port; one without is refused, the refusal is said in the supervisor's log
    and on the dashboard, and the run goes on."""
    keys = make_keys(tmp_path / "keys")
    for path in (keys, *keys.rglob("*")):
        os.chown(path, 1000, 1000)  # the images run as uid 1000; compose mounts secrets as they are
    run = "keys"
    env = {**COMPOSE_ENV, "SPREEZE_RUN": run, "SPREEZE_SAMPLERS": "1", "SPREEZE_KEYS": "/run/secrets/spreeze-keys",
           "SPREEZE_KEYS_HOST": str(keys)}
    files = ("-f", "docker-compose.yml", "-f", "docker/keys.override.yml")
    de.compose(*files, "down", "-v", "--remove-orphans", env=env, check=False)
    try:
        de.compose(*files, "up", "-d", env=env, timeout=600)
        de.wait_for(lambda: all_healthy(7), 420, "every container healthy")
        subprocess.run(["docker", "run", "-d", "--name", KEYED, "--network", "host", "-v", f"{keys}:/k:ro",
                        de.CPU_IMAGE, "spreeze", "sampler", "--connect", "tcp://127.0.0.1:5555", "--keys", "/k",
                        "--id", "sampler-keyed"], check=True, capture_output=True, timeout=120)
        de.wait_for(lambda: "sampler-keyed" in ledger_senders(metrics(run)), 300, "the keyed sampler's rows")

        refused = subprocess.run(["docker", "run", "--rm", "--name", KEYLESS, "--network", "host", de.CPU_IMAGE,
                                  "spreeze", "sampler", "--connect", "tcp://127.0.0.1:5555", "--register-timeout",
                                  "10", "--id", "sampler-keyless"], capture_output=True, text=True, timeout=300)
        assert refused.returncode == 1 and "no Welcome from the supervisor" in refused.stderr, refused.stderr[-2000:]
        said = lambda: [str(r.get("reason")) for r in metrics(run)  # noqa: E731
                        if r["kind"] == "event" and r.get("event") == "refused_client"]
        de.wait_for(lambda: any(r.startswith("supervisor refused a client at tcp://0.0.0.0:5555: ") for r in said()),
                    60, "the refusal in the run's events")
        log = de.compose(*files, "logs", "supervisor", env=env).stdout
        assert "event refused_client: supervisor refused a client at tcp://0.0.0.0:5555" in log, log[-3000:]
        with urllib.request.urlopen("http://127.0.0.1:18080/api/events", timeout=30) as page:
            dashboard = page.read().decode()
        assert "refused_client" in dashboard, dashboard[-3000:]

        # the run goes on: the keyed sampler still feeds it, the learners still learn
        before = critic_updates(run), ledger_senders(metrics(run))["sampler-keyed"]
        de.wait_for(lambda: critic_updates(run) > before[0]
                    and ledger_senders(metrics(run))["sampler-keyed"] > before[1], 300, "training after the refusal")
        assert "sampler-keyless" not in ledger_senders(metrics(run))
    except BaseException:
        print(de.compose(*files, "logs", "--tail", "40", env=env, check=False).stdout[-20000:])
        raise
    finally:
        subprocess.run(["docker", "rm", "-f", KEYED, KEYLESS], capture_output=True, timeout=60)
        de.compose(*files, "down", "-v", "--remove-orphans", env=env, timeout=300)
