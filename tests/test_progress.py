"""The console progress line: the sparse part (sparsity and FLOPs) and the unchanged dense line."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from spreeze.common.algorithms.td3 import TD3Config
from spreeze.common.algorithms.build import make_parts
from spreeze.common.sparse_config import SparseConfig
from spreeze.common.sparse_stats import combined_flops_ratio
from spreeze.proto.messages import EvalResult, Metrics
from spreeze.services.supervisor.progress import Progress, StepRate

pytestmark = pytest.mark.timeout(30)
DENSE_LINE = re.compile(r"^\[\s*\d+s\] steps 400/1,000 \| updates 200 \| sampling [\d,]+ Hz \| "
                        r"update 6\.4k fr/s \| utd [\d.]+ \| eval - \| left \d+s$")


def progress(tmp_path: Path) -> Progress:
    p = Progress(tmp_path / "metrics.jsonl", total_steps=1000, time_limit=0.0)
    p.take(Metrics("replay", {"inserted": 400}))
    return p


def test_dense_line_has_no_sparse_part(tmp_path: Path) -> None:
    p = progress(tmp_path)
    p.take(Metrics("learner", {"updates": 200, "update_frame_rate": 6400.0, "critic_loss": 1.0}))
    assert DENSE_LINE.match(p.line())
    p.close()


def test_counts_hold_and_rates_stay_non_negative_when_services_leave(tmp_path: Path) -> None:
    p = progress(tmp_path)
    p.take(Metrics("critic_learner", {"updates": 200, "update_frame_rate": 6400.0}))
    p.take(Metrics("actor_learner", {"updates": 100, "update_frame_rate": 3200.0}))
    p.line()
    for gone in ("replay", "critic_learner", "actor_learner"):  # the end of a compose run
        p.forget(gone)
    s = p.summary()
    assert (s["env_steps"], s["updates"]) == (400, 200)
    assert s["sampling_hz"] == 0 and s["update_to_data"] == 0 and s["update_frame_rate"] == 0
    p.take(Metrics("replay", {"inserted": 350}))  # a restarted replay that restored an older snapshot
    assert p.summary()["env_steps"] == 400
    assert "steps 400/1,000 | updates 200 | sampling 0 Hz" in p.line()
    p.close()


def evaluate(p: Progress, env_steps: int, ret: float) -> None:
    p.take(EvalResult(actor_version=env_steps, env_steps=env_steps, updates=env_steps, return_mean=ret,
                      return_std=1.0, length_mean=1000.0, episodes=5))


def test_a_run_with_no_better_evaluation_for_a_long_stretch_says_so_with_knobs(tmp_path: Path) -> None:
    p = Progress(tmp_path / "metrics.jsonl", total_steps=100_000, time_limit=0.0)
    p.take(Metrics("replay", {"inserted": 60_000}))
    for k, ret in enumerate([300.0, 450.0, 420.0, 400.0, 430.0, 410.0]):  # the best at 20k, then nothing better
        evaluate(p, 10_000 * (k + 1), ret)
    why = p.stall()
    assert why is not None and "no evaluation better than 450 (at 20,000 env steps)" in why
    assert "td3.hidden=[256,256]" in why and "replay.update_to_data" in why
    assert p.line().endswith(" | stalled since 20k")
    evaluate(p, 70_000, 900.0)  # it learns again
    assert p.stall() is None and "stalled" not in p.line()
    p.close()


def test_a_short_or_improving_run_is_not_flagged(tmp_path: Path) -> None:
    p = Progress(tmp_path / "metrics.jsonl", total_steps=1_000_000, time_limit=0.0)
    for k in range(6):  # flat, but over 50k of a 1M budget: too short a stretch to tell
        evaluate(p, 10_000 * (k + 1), 100.0 - k)
    assert p.stall() is None
    q = Progress(tmp_path / "q.jsonl", total_steps=10_000, time_limit=0.0)
    for k in range(8):
        evaluate(q, 1_000 * (k + 1), 100.0 * k)  # improving
    assert q.stall() is None
    p.close()
    q.close()


def test_fused_line_shows_sparsity_and_weighted_flops(tmp_path: Path) -> None:
    p = progress(tmp_path)
    p.take(Metrics("learner", {"updates": 200, "update_frame_rate": 6400.0,
                               "sparsity/actor": 0.5, "flops_ratio/actor": 0.45, "dense_flops/actor": 100.0,
                               "sparsity/critic": 0.8, "flops_ratio/critic": 0.53, "dense_flops/critic": 300.0}))
    line = p.line()
    head, sparse = line.split(" | sparse ")
    assert DENSE_LINE.match(head) and sparse == "a50% c80% flops 0.51x"  # (0.45 + 3 x 0.53) / 4
    p.close()


def test_split_learners_are_merged_and_a_missing_role_is_left_out(tmp_path: Path) -> None:
    p = progress(tmp_path)
    p.take(Metrics("critic_learner", {"updates": 200, "update_frame_rate": 6400.0, "sparsity/critic": 0.5,
                                      "flops_ratio/critic": 0.51, "dense_flops/critic": 300.0}))
    assert p.line().endswith(" | sparse c50% flops 0.51x")  # the actor has not reported yet
    p.take(Metrics("actor_learner", {"updates": 100, "sparsity/actor": 0.5, "flops_ratio/actor": 0.55,
                                     "dense_flops/actor": 100.0}))
    assert p.line().endswith(" | sparse a50% c50% flops 0.52x")
    p.close()


def test_line_from_real_topology_metrics(tmp_path: Path) -> None:
    """The learners' real metrics: TD3's actor weighs 1/policy_delay of its dense training FLOPs."""
    actor, critic = make_parts("td3", 17, 6, -np.ones(6), np.ones(6), TD3Config(hidden=(256, 256)),
                               torch.device("cpu"), True, sparse=SparseConfig(network="ds", sparsity=0.5))
    values = {**actor.sparse.metrics(), **critic.sparse.metrics()}
    wa, wc = values["dense_flops/actor"], values["dense_flops/critic"]
    assert wa == 3 * (17 * 256 + 256 * 256 + 256 * 6) / 2 and wc == 3 * 2 * (23 * 256 + 256 * 256 + 256)
    flops = combined_flops_ratio(values)
    assert flops == pytest.approx((actor.sparse.flops_ratio * wa + critic.sparse.flops_ratio * wc) / (wa + wc))
    p = progress(tmp_path)
    p.take(Metrics("learner", {"updates": 200, "update_frame_rate": 6400.0, **values}))
    assert p.line().endswith(f" | sparse a50% c50% flops {flops:.2f}x")
    p.close()


def test_fused_learner_reads_out_on_an_actor_update() -> None:
    """The fused learner's loss read-outs fall on updates that train the actor too (TD3: every
    policy_delay), so the actor's sparsity reaches the line; the first update is read out as well."""
    from types import SimpleNamespace

    from spreeze.services.learner.main import LOSS_EVERY, Learner

    def due(critic_updates: int, delay: int) -> bool:
        stand_in = SimpleNamespace(critic=SimpleNamespace(updates=critic_updates),
                                   actor=SimpleNamespace(policy_delay=delay))
        return Learner.read_out_due(stand_in)  # type: ignore[arg-type]

    for delay in (1, 2, 3):
        due_at = [n + 1 for n in range(4 * LOSS_EVERY * delay) if due(n, delay)]
        assert due_at[0] == 1 and len(due_at) >= 3
        assert all(n % delay == 0 and n % LOSS_EVERY == 0 for n in due_at[1:])


def test_line_shows_compile_seconds_of_the_slowest_learner(tmp_path: Path) -> None:
    p = progress(tmp_path)
    p.take(Metrics("critic_learner", {"updates": 200, "update_frame_rate": 6400.0, "compile_s": 12.4}))
    p.take(Metrics("actor_learner", {"updates": 100, "compile_s": 7.0}))
    head, compiled = p.line().split(" | compiled ")
    assert DENSE_LINE.match(head) and compiled == "12s"
    p.close()


def test_line_says_compiling_while_a_learner_compiles_then_the_gain(tmp_path: Path) -> None:
    p = progress(tmp_path)
    p.take(Metrics("critic_learner", {"updates": 200, "update_frame_rate": 6400.0, "compiling": 1.0,
                                      "compile_cold": 1.0, "compile_expected_s": 30.0, "compile_elapsed_s": 12.3}))
    p.take(Metrics("actor_learner", {"updates": 100, "compiling": 1.0, "compile_cold": 0.0,
                                     "compile_expected_s": 4.0, "compile_elapsed_s": 2.0}))
    assert p.line().endswith(" | compiling (cold, ~30s) 12s")
    p.take(Metrics("critic_learner", {"updates": 400, "compiling": 0.0, "compile_s": 31.0, "compile_gain": 2.14}))
    p.take(Metrics("actor_learner", {"updates": 200, "compiling": 0.0, "compile_s": 5.0, "compile_gain": 1.8}))
    assert p.line().endswith(" | compiled 31s, 1.8x eager")
    p.close()


def test_the_step_rate_behind_time_left_is_smoothed() -> None:
    rate = StepRate(weight=0.3)
    assert rate.add(0.0) == 0.0  # start-up windows without steps do not count
    assert rate.add(100.0) == 100.0
    assert rate.add(20.0) == pytest.approx(76.0)  # one slow window moves it by 30% of the gap, not to 20
    assert rate.add(100.0) == pytest.approx(83.2)


def test_time_left_does_not_jump_and_is_never_shown_past_the_budget(tmp_path: Path) -> None:
    p = Progress(tmp_path / "metrics.jsonl", total_steps=10_000, time_limit=0.0)
    lefts = []
    for steps, seconds in ((1000, 1.0), (2000, 1.0), (2200, 1.0), (3200, 1.0)):  # one window at 200/s among 1000/s
        p.take(Metrics("replay", {"inserted": steps}))
        p._window = (time.monotonic() - seconds, *p._window[1:])  # as if `seconds` passed since the last line
        lefts.append(p.summary()["remaining"])
    assert lefts[2] < 2 * lefts[1] and lefts[3] < lefts[2]  # a raw rate would give 8 s, 39 s, 7 s
    p.take(Metrics("replay", {"inserted": 10_050}))
    assert p.summary()["remaining"] == 0.0
    assert p.line().endswith("| left finishing")
    p.close()


def test_compile_state_in_words() -> None:
    from spreeze.common.compile_state import compile_state
    assert compile_state({"compiling": 1.0, "compile_cold": 0.0, "compile_expected_s": 4.2,
                          "compile_elapsed_s": 1.0}) == "compiling (~4s) 1s"
    assert compile_state({"compiling": 0.0, "compile_s": 30.6}) == "compiled 31s"
    assert compile_state({"compiling": 0.0, "compile_s": 30.6, "compile_gain": 1.94}) == "compiled 31s, 1.9x eager"
    assert compile_state({"compiling": 0.0, "update_hz": 100.0}) == "eager"  # compile failed
    assert compile_state({"update_hz": 100.0}) == "eager"  # learner.compile=false
    assert compile_state({"inserted": 5}) == ""
