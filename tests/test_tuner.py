"""services/supervisor/tuner.py on metric traces: a response model of a CPU host
(tests/tuner_model.py) in closed loop, and windows of a real recorded run
(tests/data/tune_trace.jsonl: replay and learner metrics of `spreeze train` on HalfCheetah,
2-core machine, tuning off)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from spreeze.services.supervisor.tuner import INVERSE, Bounds, Decision, Setting, Window, Tuner
from spreeze.services.supervisor.tuning import Sample, window_between
from tests.tuner_model import ENV_STEP, best, measure, rates

WINDOW = 14.0  # seconds per measurement window (settle + window of the defaults)
TRACE = Path(__file__).parent / "data" / "tune_trace.jsonl"


def grid(cores: int) -> list[Setting]:
    return [Setting(n, e, b) for n in range(1, cores + 1) for e in (1, 2, 4, 8, 16, 32, 64)
            for b in (32, 64, 128, 256, 512, 1024)]


def closed_loop(tuner: Tuner, cores: int, windows: int, seed: int = 0, utd: float = 1.0,
                env_step: float = ENV_STEP) -> list[tuple[float, Decision]]:
    """Run the tuner against the model: each window measures the tuner's current setting."""
    rng, out = random.Random(seed), []
    for i in range(windows):
        now = (i + 1) * WINDOW
        for d in tuner.observe(measure(tuner.setting, cores, rng, utd=utd, env_step=env_step), now):
            out.append((now, d))
    return out


def start(cores: int, utd: float = 1.0, pinned: frozenset[str] = frozenset({"bpr"}),
          setting: Setting = Setting(1, 1, 64)) -> Tuner:
    """A tuner of the model's host; batches per request pinned unless `pinned` says otherwise
    (the model gives them a gain of about 1 %, noise that the tests below need not see)."""
    return Tuner(setting, Bounds(cores, 64, 32, 1024), pinned, utd, min_gain=0.05, cooldown=300.0)


@pytest.mark.parametrize("cores, utd, env_step", [
    (2, 1.0, ENV_STEP),  # the development machine: the learner limits, the batch must grow
    (16, 1.0, ENV_STEP),
    (16, 0.05, 1e-3),  # expensive envs, few updates per step: sampling limits, envs and samplers must grow
])
def test_converges_near_the_best_setting(cores: int, utd: float, env_step: float) -> None:
    tuner = start(cores, utd)
    _, best_rate = best(grid(cores), cores, utd, env_step)
    first = rates(tuner.setting, cores, utd, env_step)[0]
    trace = closed_loop(tuner, cores, windows=9, utd=utd, env_step=env_step)  # about 2 minutes
    reached = rates(tuner.setting, cores, utd, env_step)[0]
    assert first < 0.5 * best_rate  # the start is bad...
    assert reached >= 0.9 * best_rate, (tuner.setting, trace)  # ...and within 2 minutes it is not
    assert all(d.reason for _, d in trace)


def test_sampling_limited_grows_envs_and_samplers() -> None:
    tuner = start(16, utd=0.05)
    trace = closed_loop(tuner, 16, windows=30, utd=0.05, env_step=1e-3)
    kept = [d.move for _, d in trace if d.action == "keep"]
    assert "envs+" in kept and "samplers+" in kept and tuner.setting.samplers > 1


@pytest.mark.parametrize("seed", range(5))
def test_no_oscillation_over_an_hour(seed: int) -> None:
    tuner = start(2)
    trace = closed_loop(tuner, 2, windows=int(3600 / WINDOW), seed=seed)
    kept = [(t, d.move) for t, d in trace if d.action == "keep"]
    for i, (t, move) in enumerate(kept):  # a kept change is not undone within the cooldown
        assert not any(m == INVERSE[move] and t2 - t < 300.0 for t2, m in kept[i + 1:]), kept
    tries = [t for t, d in trace if d.action == "try"]
    assert len(tries) <= 5 + 3600 / 300 * 3  # the climb, then at most a few re-checks per cooldown
    settled_at = max(t for t, _ in kept)
    assert settled_at < 300.0  # everything kept was found in the first five minutes
    reverts = [t for t, d in trace if d.action == "revert"]
    assert all(b - a >= 2 * WINDOW for a, b in zip(reverts, reverts[1:]))  # a window re-measures after each


def test_pinned_knobs_never_move() -> None:
    tuner = start(16, utd=0.05, pinned=frozenset({"batch", "samplers"}))
    trace = closed_loop(tuner, 16, windows=60, utd=0.05, env_step=1e-3)
    assert {d.setting.batch for _, d in trace} == {64}
    assert {d.setting.samplers for _, d in trace} == {1}
    assert tuner.setting.envs > 1  # the free knob still moved
    everything = start(16, pinned=frozenset({"batch", "samplers", "envs", "bpr"}))
    trace = closed_loop(everything, 16, windows=20)
    assert [d.action for _, d in trace] == ["settled"]


def test_defaults_leave_the_batch_alone_and_tune_the_neutral_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """`supervisor.tune` is on by default with the batch size pinned (`tune_batch` false): on a
    host where sample requests are costly the tuner asks for more batches per request, and
    where sampling limits it adds envs and samplers; the batch size never moves."""
    monkeypatch.setattr("tests.tuner_model.REQUEST", 2e-3)  # a slow transport: requests cost as much as an update
    tuner = start(2, pinned=frozenset({"batch"}), setting=Setting(1, 4, 256))
    trace = closed_loop(tuner, 2, windows=20)
    assert {d.setting.batch for _, d in trace} == {256}
    assert "bpr+" in [d.move for _, d in trace if d.action == "keep"] and tuner.setting.bpr > 4
    sampling = start(16, utd=0.05, pinned=frozenset({"batch"}))
    trace = closed_loop(sampling, 16, windows=30, utd=0.05, env_step=1e-3)
    assert {d.setting.batch for _, d in trace} == {64}
    assert sampling.setting.envs > 1 and sampling.setting.samplers > 1


def test_a_change_that_breaks_the_ratio_is_undone() -> None:
    tuner = start(2)
    base = Window(frame_rate=10_000, sampling_hz=150, update_to_data=1.0, insert_stall=0.8, sample_stall=0.0)
    (tried,) = tuner.observe(base, 0.0)
    assert tried.action == "try" and tried.move == "batch+" and tried.setting.batch == 128
    faster_but_off = Window(frame_rate=20_000, sampling_hz=50, update_to_data=1.6, insert_stall=0.8,
                              sample_stall=0.0)
    (verdict,) = tuner.observe(faster_but_off, WINDOW)
    assert verdict.action == "revert" and verdict.setting.batch == 64 and "update-to-data 1.60" in verdict.reason


def test_a_load_change_during_a_trial_is_seen_on_the_second_look() -> None:
    tuner = start(2)
    quiet = Window(frame_rate=10_000, sampling_hz=150, update_to_data=1.0, insert_stall=0.8, sample_stall=0.0)
    tuner.observe(quiet, 0.0)  # tries batch+
    loaded = dataclasses.replace(quiet, frame_rate=9_000)  # the move helped, but others took half the host
    (revert,) = tuner.observe(loaded, WINDOW)
    assert revert.action == "revert" and revert.setting.batch == 64
    (keep,) = tuner.observe(dataclasses.replace(quiet, frame_rate=5_000), 2 * WINDOW)  # the old setting, loaded
    assert keep.action == "keep" and keep.setting.batch == 128 and "second look" in keep.reason
    tuner = start(2)
    tuner.observe(quiet, 0.0)
    tuner.observe(loaded, WINDOW)
    decisions = tuner.observe(quiet, 2 * WINDOW)  # the old setting is as good as before: a real rejection
    assert decisions[0].action == "reject" and tuner.setting.batch == 64
    assert tuner.blocked["batch+"] == pytest.approx(2 * WINDOW + 300.0 / 8)  # a short block the first time


def test_drift_restarts_the_search_only_when_it_persists() -> None:
    tuner = start(2, setting=Setting(1, 1, 1024))
    snap = measure(tuner.setting, 2, random.Random(0), noise=0.0)
    assert [d.action for d in tuner.observe(snap, 0.0)] == ["settled"]
    slow = Window(frame_rate=snap.frame_rate * 0.5, sampling_hz=snap.sampling_hz * 0.5, update_to_data=1.0,
                    insert_stall=0.9, sample_stall=0.0)
    assert tuner.observe(slow, WINDOW) == []  # one slow window may be noise
    assert [d.action for d in tuner.observe(slow, 2 * WINDOW)][:1] == ["restart"]


def test_score_corrects_for_other_programs_load() -> None:
    quiet = Window(1000.0, 100, 1.0, 0.9, 0.0, idle_cores=0.5, cpu={"learner": 1.0, "replay": 0.5}, host_cores=2)
    assert quiet.score == 1000.0  # ours + idle = every core: nothing to correct
    busy = dataclasses.replace(quiet, frame_rate=600.0, idle_cores=0.0, cpu={"learner": 0.6, "replay": 0.4})
    assert busy.score == pytest.approx(1200.0)  # half the host went to others
    crowded = dataclasses.replace(busy, cpu={"learner": 0.1})
    assert crowded.score == pytest.approx(1200.0)  # the correction is capped (MAX_LOAD_CORRECTION)
    assert dataclasses.replace(busy, host_cores=0).score == 600.0  # host unknown: the raw rate


def test_nothing_before_the_learners_update() -> None:
    tuner = start(2)
    idle = Window(frame_rate=0.0, sampling_hz=500, update_to_data=0.0, insert_stall=0.0, sample_stall=0.0)
    assert tuner.observe(idle, 0.0) == [] and tuner.baseline is None


# ------------------------------------------------------------------ a real recorded run

def trace_samples(path: Path) -> list[Sample]:
    """Samples at each learner record of a recorded metrics.jsonl, with the newest replay values."""
    replay: dict | None = None
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["service"] == "replay":
            replay = row
        elif row["service"] == "learner" and replay is not None:
            out.append(Sample(row["wall_time"], row["updates"], row["wall_time"], replay["inserted"],
                              replay["insert_stall_s"], replay["sample_stall_s"], replay["wall_time"], {}, 0.0))
    return out


def recorded_windows(seconds: float) -> list[Window]:
    samples = trace_samples(TRACE)
    windows, first = [], samples[0]
    for s in samples[1:]:
        if s.wall - first.wall >= seconds:
            snap = window_between(first, s, batch=256)
            assert snap is not None
            windows.append(snap)
            first = s
    return windows


def test_recorded_windows_measure_what_the_run_did() -> None:
    windows = recorded_windows(10.0)
    assert len(windows) >= 4
    for snap in windows[1:]:  # after the first window (replay filling to min_size)
        assert snap.update_to_data == pytest.approx(1.0, abs=0.25)  # replay's limiter held the ratio
        assert snap.frame_rate == pytest.approx(256 * snap.sampling_hz * snap.update_to_data, rel=0.2)
        assert snap.bottleneck() == "learners"  # one fused learner on 2 cores: replay refuses inserts


def test_recorded_noise_is_not_taken_for_a_gain() -> None:
    """The recorded run never changed its setting, and its windows swing by tens of percent
    (a shared 2-core machine): fed those windows, the tuner tries the learner-limited move,
    sees no gain, undoes it, looks at the old setting again (A/B/A), rejects the move and
    settles; one slow window does not restart the search."""
    tuner = start(2, setting=Setting(1, 4, 256))
    decisions = []
    for i, snap in enumerate(recorded_windows(10.0)[1:]):
        decisions += tuner.observe(snap, i * WINDOW)
    assert [(d.action, d.move) for d in decisions] == [("try", "batch+"), ("revert", "batch+"),
                                                       ("reject", "batch+"), ("settled", "")]
    assert tuner.setting == Setting(1, 4, 256)
