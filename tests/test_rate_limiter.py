"""Tests for common.rate_limiter: validation, min size, no deadlock, ratio held, snapshots."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spreeze.common.errors import ConfigError
from spreeze.common.rate_limiter import RateLimitedError, RateLimiter, RateLimiterConfig


def limiter(spi: float | None = 4.0, min_size: int = 10, eb: float = 8.0) -> RateLimiter:
    cfg = RateLimiterConfig(samples_per_insert=spi, min_size_to_sample=min_size, error_buffer=eb)
    return RateLimiter(cfg)


@st.composite
def configs(draw: st.DrawFn) -> RateLimiterConfig:
    """Random valid configs, unlimited ones included, windows from the minimum up."""
    spi = draw(st.sampled_from([None, 0, 0.25, 1, 3.5, 64, 256]))
    floor = max(1.0, float(spi or 0))
    eb = floor * draw(st.sampled_from([1, 1.5, 4, 32]))
    min_size = draw(st.integers(1, 500))
    return RateLimiterConfig(samples_per_insert=spi, min_size_to_sample=min_size, error_buffer=eb)


OPS = st.lists(
    st.tuples(st.sampled_from(["insert", "sample", "reconfigure"]), st.integers(1, 3000)),
    min_size=1, max_size=200,
)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"samples_per_insert": -1.0}, "samples_per_insert=-1.0"),
        ({"samples_per_insert": float("nan")}, "samples_per_insert=nan"),
        ({"min_size_to_sample": 0}, "min_size_to_sample=0"),
        ({"min_size_to_sample": 2.5}, "min_size_to_sample=2.5"),
        ({"error_buffer": -1.0}, "error_buffer=-1.0"),
        (
            {"samples_per_insert": 256.0, "error_buffer": 255.0},
            r"error_buffer=255.0 must be >= max\(1, samples_per_insert\)=256.0",
        ),
        ({"samples_per_insert": 0.5, "error_buffer": 0.5}, r"error_buffer=0.5 must be >= .*=1.0"),
    ],
)
def test_config_validation_names_field_and_value(kwargs: dict[str, object], pattern: str) -> None:
    fields: dict[str, object] = {"samples_per_insert": 4.0, "min_size_to_sample": 10, "error_buffer": 8.0}
    fields.update(kwargs)
    cfg = RateLimiterConfig(**fields)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=pattern):
        cfg.validate()
    with pytest.raises(ValueError, match=pattern):
        RateLimiter(cfg)


def test_min_size_respected_then_ratio_enforced() -> None:
    rl = limiter(spi=4.0, min_size=10, eb=8.0)
    for _ in range(9):
        assert not rl.can_sample(1)
        rl.insert(1)
    assert not rl.try_sample(1) and rl.sample_stalls == 1
    rl.insert(1)  # 10 inserted: stage 2, error 0
    assert rl.can_sample(1) and rl.can_insert(1) and rl.error == 0
    rl.insert(3)  # error 12 > 8: inserts stop, samples go on
    assert not rl.can_insert(1) and rl.can_sample(1)
    with pytest.raises(RateLimitedError, match="insert of 1 refused"):
        rl.insert(1)
    assert rl.insert_stalls == 1
    rl.sample(4)  # error 8: inserts allowed again (check is <=)
    assert rl.can_insert(1)
    rl.sample(16)  # error -8: still sampling allowed (>= -8)
    assert rl.can_sample(1)
    rl.sample(1)  # error -9: samples stop
    assert not rl.can_sample(1) and rl.can_insert(1)


def test_batches_larger_than_window_are_admitted_and_overshoot() -> None:
    rl = limiter(spi=1.0, min_size=5, eb=2.0)
    rl.insert(1000)  # stage 1 -> admitted whole
    assert rl.error == 995 and not rl.can_insert(1)
    rl.sample(5000)  # admitted: the check is on the state before the batch
    assert rl.error == -4005 and not rl.can_sample(1) and rl.can_insert(7)


def test_unlimited_never_blocks_inserts() -> None:
    for spi in (None, 0, 0.0):
        rl = limiter(spi=spi, min_size=3, eb=0.0)
        rl.insert(2)
        assert not rl.can_sample(1)
        rl.insert(1)
        for _ in range(100):
            rl.sample(10_000)
        rl.insert(1)
        assert rl.can_insert(10**9) and rl.can_sample(10**9) and rl.error == 0.0


def check_invariants(rl: RateLimiter, max_insert: int, max_sample: int) -> None:
    """No deadlock, min size respected, error inside the window plus one batch of overshoot."""
    cfg = rl.config
    for a, b in ((1, 1), (1, 3000), (3000, 1), (3000, 3000)):  # pending insert of a, sample of b
        assert rl.can_insert(a) or rl.can_sample(b), f"deadlock: insert of {a} and sample of {b} both refused"
    if rl.inserts < cfg.min_size_to_sample:
        assert rl.can_insert(1) and not rl.can_sample(1)
    elif cfg.limited:
        assert -cfg.error_buffer - max_sample <= rl.error <= cfg.error_buffer + cfg.spi * max_insert


@settings(max_examples=300, deadline=None)
@given(cfg=configs(), ops=OPS, new_cfgs=st.lists(configs(), min_size=1, max_size=4))
def test_never_deadlocks_under_random_interleavings(cfg: RateLimiterConfig, ops: list[tuple[str, int]],
                                                    new_cfgs: list[RateLimiterConfig]) -> None:
    rl = RateLimiter(cfg)
    max_i = max_s = 0
    for k, (side, n) in enumerate(ops):
        stage2 = rl.inserts >= rl.config.min_size_to_sample
        if side == "reconfigure":
            rl.reconfigure(new_cfgs[k % len(new_cfgs)])
            max_i = max_s = 0  # overshoot bounds restart with the new window
        elif side == "insert" and rl.try_insert(n):
            max_i = max(max_i, n)
        elif side == "sample" and rl.try_sample(n):
            assert stage2, "sampled before min_size_to_sample inserts"
            max_s = max(max_s, n)
        check_invariants(rl, max_i, max_s)


@settings(max_examples=100, deadline=None)
@given(cfg=configs(), ops=OPS)
def test_refused_side_implies_other_side_proceeds(cfg: RateLimiterConfig, ops: list[tuple[str, int]]) -> None:
    rl = RateLimiter(cfg)
    for side, n in ops:
        if side == "insert" and not rl.try_insert(n):
            assert rl.try_sample(n)
        elif side != "insert" and not rl.try_sample(n):
            assert rl.try_insert(n)
    assert rl.samples == 0 or rl.inserts >= cfg.min_size_to_sample


@pytest.mark.parametrize("spi, eb", [(256.0, 2048.0), (1.0, 4.0), (0.25, 1.0), (8.0, 100.0)])
def test_ratio_held_over_long_random_run(spi: float, eb: float) -> None:
    rng = random.Random(f"{spi}-{eb}")
    rl = limiter(spi=spi, min_size=1000, eb=eb)
    max_i, max_s = 64, 512
    for _ in range(20_000):
        if rng.random() < 0.5:
            rl.try_insert(rng.randint(1, max_i))
        else:
            rl.try_sample(rng.randint(1, max_s))
        check_invariants(rl, max_i, max_s)
    assert rl.inserts > 1000 and rl.samples > 0
    assert abs(rl.inserts * spi - rl.samples - 1000 * spi) <= eb + max(max_s, spi * max_i)
    assert rl.samples / (rl.inserts - 1000) == pytest.approx(spi, rel=0.2)


def test_reconfigure_carries_error_clamped() -> None:
    rl = limiter(spi=4.0, min_size=10, eb=8.0)
    rl.insert(12)  # error 8
    rl.reconfigure(RateLimiterConfig(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=3.0))
    assert rl.error == 3.0 and rl.can_insert(1)
    rl.insert(1)
    assert rl.error == 5.0 and not rl.can_insert(1)
    rl.reconfigure(RateLimiterConfig(samples_per_insert=2.0, min_size_to_sample=100, error_buffer=3.0))
    assert not rl.can_sample(1)  # back in stage 1 under the new min size
    rl.insert(87)
    assert rl.inserts == 100 and rl.error == 0.0 and rl.can_sample(1)


def test_state_dict_round_trip_and_rebase_on_new_config() -> None:
    rl = limiter(spi=4.0, min_size=10, eb=8.0)
    rl.insert(11)  # error 4
    rl.sample(2)  # error 2
    rl.insert(3)  # error 14
    assert not rl.try_insert(1)
    state = rl.state_dict()
    same = limiter(spi=4.0, min_size=10, eb=8.0)
    same.load_state_dict(state)
    assert same.state_dict() == state and same.error == rl.error == 14.0
    other = limiter(spi=1.0, min_size=10, eb=1.0)
    other.load_state_dict(state)
    assert other.config.samples_per_insert == 1.0
    assert (other.inserts, other.samples, other.insert_stalls, other.sample_stalls) == (14, 2, 1, 0)
    assert other.error == 1.0  # error 14 carried, clamped into the new window of 1


def test_batch_size_must_be_positive() -> None:
    rl = limiter()
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match=f"n={bad!r}"):
            rl.can_insert(bad)  # type: ignore[arg-type]
