"""common/devices.py: learner devices checked against the host's CUDA devices, and a run
asking for a GPU the host lacks refused before any service starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spreeze.common.devices import checked_device, checked_devices
from spreeze.common.errors import ConfigError
from spreeze.services.supervisor.probe import cuda_devices
from tests.helpers import config


@pytest.mark.parametrize("value, gpus, used", [
    ("cpu", 0, "cpu"), ("auto", 0, "auto"), ("cuda", 1, "cuda:0"), ("cuda:1", 2, "cuda:1"), ("cuda:0", 1, "cuda:0"),
])
def test_devices_the_host_has_are_kept_and_a_bare_cuda_is_cuda_0(value: str, gpus: int, used: str) -> None:
    assert checked_device("actor_device", value, gpus) == used


@pytest.mark.parametrize("value, gpus, why", [
    ("cuda", 0, "has none"), ("cuda:0", 0, "has none"), ("cuda:3", 2, "beyond this host's 2 CUDA devices"),
    ("cuda:1", 1, "beyond this host's 1 CUDA device "), ("cuda:x", 1, "must be cpu, cuda, cuda:N or auto"),
])
def test_a_device_the_host_lacks_is_refused_by_key_and_value(value: str, gpus: int, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as err:
        checked_device("critic_device", value, gpus)
    assert f"learner.critic_device={value!r}" in str(err.value)


def test_both_learner_devices_are_checked(tmp_path: Path) -> None:
    cfg = checked_devices(config(tmp_path, "learner.actor_device=cuda", "learner.critic_device=cuda:1"), 2)
    assert (cfg.learner.actor_device, cfg.learner.critic_device) == ("cuda:0", "cuda:1")
    with pytest.raises(ConfigError, match="learner.critic_device='cuda:1'"):
        checked_devices(cfg, 1)


@pytest.mark.parametrize("override", [
    "learner.actor_device=cuda:64",  # beyond any host's device count
    pytest.param("learner.critic_device=cuda", marks=pytest.mark.skipif(bool(cuda_devices()),
                                                                        reason="this host has a CUDA device")),
])
def test_train_refuses_a_missing_gpu_before_any_service_starts(tmp_path: Path, override: str) -> None:
    run = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "spreeze.cli", "train", "--env", "Pendulum-v1", "--run-dir", str(run),
                           override], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()  # one line, naming the key and the value
    key, value = override.split("=")
    assert line.startswith("spreeze train: error: ") and f"{key}={value!r}" in line
    assert not run.exists() and "computes on the GPU" not in proc.stdout  # nothing planned, nothing started


@pytest.mark.parametrize("command", [["bench", "e2e", "learner.actor_device=cuda:64"],
                                     ["bench", "update", "--device", "cuda:64"]])
def test_the_benches_refuse_a_missing_gpu_before_any_service_starts(tmp_path: Path, command: list[str]) -> None:
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "spreeze.cli", *command, "--out", str(out)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("spreeze bench: error: ") and "'cuda:64'" in line
    assert not out.exists()
