"""bench/system.py's measure(): a bench run ends soon whatever its services do (real
supervisor, real service processes on real sockets)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from spreeze.bench.system import BenchFailed, measure
from spreeze.common.config import Config, load_config
from spreeze.services.supervisor.processes import ServiceSpec
from tests.test_integration import pid_alive


def bench_cfg(run_dir: Path) -> Config:
    run_dir.mkdir(parents=True, exist_ok=True)
    return load_config(None, [f"run_dir={run_dir}", "time_limit=120", "visualizer.enabled=false"])


@pytest.mark.timeout(60)
def test_a_service_that_will_not_stop_is_killed_with_what_it_started(tmp_path: Path) -> None:
    """A service that ignores its shutdown command and SIGTERM (blocked, as a learner joining
    its compile thread is) and has a helper process: both are gone when measure() returns,
    within the bench's grace periods instead of the 20 s + 5 s a training run allows."""
    cfg = bench_cfg(tmp_path / "run")
    pids = tmp_path / "run" / "stubborn.pids"
    spec = ServiceSpec("stubborn", "stubborn", "tests.stubborn_service")
    started = time.monotonic()
    measure(cfg, [spec], lambda progress: pids.exists(), seconds=0.5)
    took = time.monotonic() - started  # start-up, the window and the stop
    service, helper = (int(p) for p in pids.read_text().split())
    assert not pid_alive(service) and not pid_alive(helper)
    assert took < 20, f"the bench run took {took:.1f}s"


@pytest.mark.timeout(60)
def test_a_service_that_cannot_start_fails_the_bench_at_once_with_its_error(tmp_path: Path) -> None:
    """No restarts in a bench run: the first crash ends it, its last log line in the error."""
    cfg = bench_cfg(tmp_path / "run")
    spec = ServiceSpec("learner", "learner", "tests.crashing_service")
    started = time.monotonic()
    with pytest.raises(BenchFailed) as failed:
        measure(cfg, [spec], lambda progress: False, seconds=1.0)
    assert time.monotonic() - started < 20
    first = str(failed.value).splitlines()[0]
    assert "learner failed (exited with code 3)" in first
    assert "crashing_service: exiting with code 3 on purpose" in first
