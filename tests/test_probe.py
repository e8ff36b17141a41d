"""services/supervisor/probe.py: the start plan for several hosts, pins, and the readings."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from spreeze.common.algorithms.sac import SACConfig
from spreeze.common.algorithms.td3 import TD3Config
from spreeze.common.config import given_keys
from spreeze.common.envs import task_facts
from spreeze.common.errors import ConfigError
from spreeze.services.supervisor.processes import core_sets
from spreeze.services.supervisor.probe import (Gpu, Hardware, apply, cpu_seconds, cxx_compiler, host_cpu, memory_gib,
                                       parse_nvidia_smi, plan, probe)
from tests.helpers import config

ROW = 168  # bytes of one HalfCheetah transition row


def chosen(hw: Hardware, tmp_path: Path, *overrides: str) -> dict[str, object]:
    cfg = config(tmp_path, *overrides)
    pinned = given_keys(None, list(overrides))
    choices = plan(hw, cfg, pinned, ROW)
    assert all(c.reason for c in choices)
    planned = apply(cfg, choices)  # the plan always makes a valid config
    assert planned.learner.mode in ("fused", "split")
    return {c.key: c.value for c in choices}


H100 = Gpu(0, "NVIDIA H100", 80.0)


@pytest.mark.parametrize("cores, samplers, threads", [(2, 1, 1), (16, 11, 4)])
def test_cpu_host_fused_learner(tmp_path: Path, cores: int, samplers: int, threads: int) -> None:
    got = chosen(Hardware(cores, 64.0), tmp_path)
    assert (got["learner.mode"], got["learner.actor_device"], got["learner.critic_device"]) == ("fused", "cpu", "cpu")
    assert (got["sampler.num_samplers"], got["learner.threads"]) == (samplers, threads)
    assert got["learner.batch_size"] == 32  # the config's own (tests' small config): the tuner moves it on CPU


@pytest.mark.parametrize("cores, hidden, mode", [(2, "[256,256]", "split"), (2, "[64,256]", "split"),
                                                 (2, "[128,128]", "fused"), (1, "[256,256]", "fused")])
def test_cpu_host_splits_learners_for_wide_networks(tmp_path: Path, cores: int, hidden: str, mode: str) -> None:
    """On CPU an update of 256-wide networks is long beside the weight exchange: the critic and
    actor learners each take a core (one core: nothing to gain)."""
    got = chosen(Hardware(cores, 64.0), tmp_path, f"td3.hidden={hidden}")
    assert (got["learner.mode"], got["learner.actor_device"], got["learner.critic_device"]) == (mode, "cpu", "cpu")
    assert got["sampler.num_samplers"] == 1
    reasons = {c.key: c.reason for c in plan(Hardware(cores, 64.0), config(tmp_path, f"td3.hidden={hidden}"),
                                             frozenset(), ROW)}
    assert ("256-wide networks: split learners" in reasons["learner.mode"]) == (mode == "split")


def test_one_gpu_both_learners_on_it(tmp_path: Path) -> None:
    got = chosen(Hardware(16, 64.0, (H100,)), tmp_path)
    assert (got["learner.mode"], got["learner.actor_device"], got["learner.critic_device"]) == \
        ("split", "cuda:0", "cuda:0")
    assert got["learner.threads"] == 1 and got["sampler.num_samplers"] == 16 - 2 - 1
    assert got["learner.batch_size"] == 1024 and got["sampler.envs_per_sampler"] == 8


def test_two_gpus_split_learners(tmp_path: Path) -> None:
    got = chosen(Hardware(32, 256.0, (H100, Gpu(1, "NVIDIA H100", 80.0))), tmp_path)
    assert (got["learner.mode"], got["learner.actor_device"], got["learner.critic_device"]) == \
        ("split", "cuda:0", "cuda:1")
    assert got["sampler.num_samplers"] == 29


def test_explicit_values_win(tmp_path: Path) -> None:
    got = chosen(Hardware(16, 64.0, (H100,)), tmp_path, "learner.mode=fused", "sampler.num_samplers=3",
                 "learner.batch_size=64")
    assert not {"learner.mode", "learner.actor_device", "learner.critic_device",
                "sampler.num_samplers", "learner.batch_size"} & set(got)
    assert got["learner.threads"] == 4  # fused on CPU (the config's devices): CPU threads


def test_replay_capacity_shrinks_to_fit_memory(tmp_path: Path) -> None:
    assert "replay.capacity" not in chosen(Hardware(2, 0.5), tmp_path, "replay.capacity=5000000")  # set: kept
    assert "replay.capacity" not in chosen(Hardware(2, 0.5), tmp_path)  # the config's own 5000 fit
    cfg = config(tmp_path)
    for memory, capacity in ((0.0001, int(0.0001 * 2 ** 30 / 4 / ROW)), (0.00001, cfg.replay.min_size)):
        (cap,) = [c for c in plan(Hardware(2, memory), cfg, frozenset(), ROW) if c.key == "replay.capacity"]
        assert cap.value == capacity and "exceed 25%" in cap.reason  # never below min_size


def test_given_keys_reads_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sampler: {num_samplers: 2}\nlearner:\n  batch_size: 128\n")
    assert given_keys(path, ["replay.min_size=5", "env=Pendulum-v1"]) == {
        "sampler.num_samplers", "learner.batch_size", "replay.min_size", "env"}
    with pytest.raises(ConfigError, match="no-such.yaml"):
        given_keys(tmp_path / "no-such.yaml")


def test_bad_tuning_bounds_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="supervisor.min_batch_size=512 exceeds"):
        config(tmp_path, "supervisor.min_batch_size=512", "supervisor.max_batch_size=256")
    with pytest.raises(ConfigError, match="supervisor.tune_window=0"):
        config(tmp_path, "supervisor.tune_window=0")


def test_readings_of_this_host() -> None:
    hw = probe()
    assert hw.cores == len(os.sched_getaffinity(0)) and hw.memory_gib > 0
    assert "CPU cores" in hw.describe()
    used = cpu_seconds(os.getpid())
    assert used is not None and used > 0
    assert cpu_seconds(2 ** 22 + 12345) is None  # no such process
    idle, total = host_cpu()
    assert 0 <= idle <= total and total > 0
    assert memory_gib(Path("/no/such/meminfo")) == 0.0


def test_nvidia_smi_lines() -> None:
    text = "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA A100-SXM4-40GB, 40960\ngarbage\n"
    gpus = parse_nvidia_smi(text)
    assert [(g.index, g.name) for g in gpus] == [(0, "NVIDIA H100 80GB HBM3"), (1, "NVIDIA A100-SXM4-40GB")]
    assert gpus[1].memory_gib == pytest.approx(40.0)


@pytest.mark.parametrize("algo, env, hidden", [
    ("td3", "HalfCheetah-v5", [64, 64]),  # never ends early: the algorithm's default
    ("td3", "Walker2d-v5", [256, 256]),  # falls end its episodes: larger networks
    ("td3", "Ant-v5", [256, 256]),
    ("sac", "HalfCheetah-v5", [64, 64]),
    ("sac", "Hopper-v5", [256, 256]),
])
def test_network_size_follows_early_termination(tmp_path: Path, algo: str, env: str, hidden: list[int]) -> None:
    task = task_facts(env)
    cfg = config(tmp_path, f"algo={algo}", f"env={env}")
    default = dataclasses.replace(cfg, algorithms={"td3": TD3Config(), "sac": SACConfig()})  # shipped defaults
    choices = plan(Hardware(2, 8.0), default, frozenset({"algo"}), ROW, task)  # the user chose the algorithm
    (choice,) = [c for c in choices if c.key == f"{algo}.hidden"]
    assert choice.value == hidden and env in choice.reason
    assert apply(default, choices).algo_config.hidden == tuple(hidden)
    (mode,) = [c.value for c in choices if c.key == "learner.mode"]  # placement follows the planned width
    assert mode == ("split" if max(hidden) >= 256 else "fused")
    pinned = plan(Hardware(2, 8.0), default, frozenset({"algo", f"{algo}.hidden"}), ROW, task)
    assert not [c for c in pinned if c.key == f"{algo}.hidden"]  # set by the user: kept


@pytest.mark.parametrize("env, algo", [("HalfCheetah-v5", "td3"), ("Hopper-v5", "crossq"), ("Ant-v5", "crossq")])
def test_the_algorithm_follows_early_termination(tmp_path: Path, env: str, algo: str) -> None:
    """With no algorithm chosen, a task that ends episodes when the agent falls gets CrossQ and
    the rest of the plan is made for it (its networks, its settings); one that never ends
    early keeps the configured TD3."""
    cfg = config(tmp_path, f"env={env}", "replay.capacity=20000")
    choices = plan(Hardware(2, 8.0), cfg, frozenset(), ROW, task_facts(env))
    assert choices[0].key == "algo" and choices[0].value == algo and env in choices[0].reason
    planned = apply(cfg, choices)
    assert planned.algo == algo
    assert any(c.key == f"{algo}.hidden" for c in choices)  # the networks are planned for the chosen one
    assert planned.learner.obs_norm is (algo == "crossq")  # and its own choices are made
    for pinned in ({"algo"}, {"td3.policy_noise"}):  # the algorithm, or a key of its section, set: td3 kept
        kept = apply(cfg, plan(Hardware(2, 8.0), cfg, frozenset(pinned), ROW, task_facts(env)))
        assert kept.algo == "td3"


def test_a_run_is_named_after_the_algorithm_the_plan_chose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """spreeze train --env Hopper-v5 (no --algo) runs CrossQ, its directory and Run.config say
    so; an --algo given is kept."""
    from spreeze.api import resolve
    monkeypatch.chdir(tmp_path)
    chose = resolve(None, [], env="Hopper-v5", seed=3)
    assert chose.config.algo == "crossq" and "Hopper-v5-crossq-s3-" in chose.config.run_dir
    assert "algo" not in chose.pinned  # the supervisor's plan prints why
    kept = resolve(None, [], env="Hopper-v5", algo="sac")
    assert kept.config.algo == "sac" and "Hopper-v5-sac-" in kept.config.run_dir
    cheetah = resolve(None, [], env="HalfCheetah-v5")
    assert cheetah.config.algo == "td3"


@pytest.mark.parametrize("env, warmup", [("HalfCheetah-v5", None), ("Walker2d-v5", 1000), ("Hopper-v5", 1000)])
def test_random_warm_up_follows_early_termination(tmp_path: Path, env: str, warmup: int | None) -> None:
    cfg = config(tmp_path, f"env={env}", "sampler.warmup_steps=10000", "replay.min_size=10000", "replay.capacity=20000")
    got = {c.key: c for c in plan(Hardware(2, 8.0), cfg, frozenset(), ROW, task_facts(env))}
    if warmup is None:  # random episodes as long as any: the configured warm-up
        assert "sampler.warmup_steps" not in got and "replay.min_size" not in got
        return
    assert got["sampler.warmup_steps"].value == got["replay.min_size"].value == warmup
    assert env in got["sampler.warmup_steps"].reason
    planned = apply(cfg, list(got.values()))
    assert (planned.sampler.warmup_steps, planned.replay.min_size) == (warmup, warmup)
    for key in ("sampler.warmup_steps", "replay.min_size"):  # either set by the user: both kept
        kept = plan(Hardware(2, 8.0), cfg, frozenset({key}), ROW, task_facts(env))
        assert not [c for c in kept if c.key in ("sampler.warmup_steps", "replay.min_size")]


def test_core_sets_give_learners_their_own_cores() -> None:
    assert core_sets(["learner"], 1, [0, 1]) == {"learner": frozenset({1}), "": frozenset({0})}
    split = core_sets(["critic_learner", "actor_learner"], 2, list(range(8)))
    assert split == {"critic_learner": frozenset({4, 5}), "actor_learner": frozenset({6, 7}),
                     "": frozenset({0, 1, 2, 3})}
    assert core_sets(["learner"], 1, [0]) == {}  # nothing would be left for the others: no pinning
    assert core_sets(["critic_learner", "actor_learner"], 1, [0, 1]) == {}


def test_no_cxx_compiler_plans_eager_updates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = dataclasses.replace(config(tmp_path), learner=dataclasses.replace(config(tmp_path).learner, compile=True))
    (off,) = [c for c in plan(Hardware(2, 8.0), cfg, frozenset(), ROW) if c.key == "learner.compile"]
    assert off.value is False and "no C++ compiler" in off.reason and "g++" in off.reason
    assert apply(cfg, [off]).learner.compile is False
    assert "learner.compile" not in {c.key for c in plan(Hardware(2, 8.0, cxx="/usr/bin/g++"), cfg, frozenset(), ROW)}
    assert "learner.compile" not in {c.key for c in plan(Hardware(2, 8.0), cfg, frozenset({"learner.compile"}), ROW)}
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert cxx_compiler() == ""
    assert "no C++ compiler" in Hardware(2, 8.0).describe()


def test_the_algorithm_plans_its_own_settings(tmp_path: Path) -> None:
    """CrossQ's descriptor narrows its critics for learners on CPU (a 512-wide update costs
    ~2.7x a 256-wide one there) and keeps the configured width on a GPU or when the user set
    it; it turns observation normalisation on unless the user set it; TD3 plans nothing of
    its own."""
    cfg = config(tmp_path, "algo=crossq", "crossq.critic_hidden=[512,512]")
    on_cpu = {c.key: c for c in plan(Hardware(2, 8.0), cfg, frozenset(), ROW)}
    assert on_cpu["crossq.critic_hidden"].value == [256, 256] and "CPU" in on_cpu["crossq.critic_hidden"].reason
    assert on_cpu["learner.obs_norm"].value is True
    planned = apply(cfg, list(on_cpu.values()))
    assert planned.algo_config.critic_hidden == (256, 256) and planned.learner.obs_norm
    on_gpu = {c.key: c.value for c in plan(Hardware(16, 64.0, (H100,)), cfg, frozenset(), ROW)}
    assert "crossq.critic_hidden" not in on_gpu and on_gpu["learner.obs_norm"] is True
    pinned = plan(Hardware(2, 8.0), cfg, frozenset({"crossq.critic_hidden", "learner.obs_norm"}), ROW)
    assert not {"crossq.critic_hidden", "learner.obs_norm"} & {c.key for c in pinned}
    narrow = config(tmp_path, "algo=crossq", "crossq.critic_hidden=[128,128]")  # already narrow: kept
    assert "crossq.critic_hidden" not in {c.key for c in plan(Hardware(2, 8.0), narrow, frozenset(), ROW)}
    td3 = plan(Hardware(2, 8.0), config(tmp_path, "algo=td3"), frozenset(), ROW)
    assert not [c for c in td3 if c.key.startswith("td3.") or c.key == "learner.obs_norm"]
