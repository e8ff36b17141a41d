"""Tests for common.replay_buffer: ring contents, eviction, sampling, snapshots, validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spreeze.common.errors import ConfigError
from spreeze.common.replay_buffer import FIELDS, ReplayBuffer, ReplayEmptyError, ReplayInputError

OBS, ACT = 3, 2


def batch(ids: np.ndarray | list[int], obs_dim: int = OBS, act_dim: int = ACT) -> dict[str, np.ndarray]:
    """Rows whose every field encodes the row id, so a sampled row can be checked whole."""
    ids = np.asarray(ids, dtype=np.float64)
    return {
        "obs": ids[:, None] + np.arange(obs_dim) / 10,
        "action": -ids[:, None] - np.arange(act_dim) / 10,
        "reward": ids * 2,
        "next_obs": ids[:, None] + 0.5 + np.arange(obs_dim) / 10,
        "done": ids % 2,
    }


def ids_of(rows: dict[str, np.ndarray]) -> np.ndarray:
    """Row ids recovered from obs, after checking every field agrees with them."""
    ids = rows["obs"][:, 0]
    expected = batch(ids.astype(np.int64))
    for name in FIELDS:
        np.testing.assert_allclose(rows[name], expected[name], rtol=0, atol=1e-3, err_msg=name)
    return ids.astype(np.int64)


def stored_ids(buf: ReplayBuffer) -> np.ndarray:
    """Ids of the stored rows in ring (storage) order."""
    data = buf.state_dict()["data"]
    return ids_of({name: data[:, col] for name, col in buf.columns.items()})


def test_wrap_around_exact_contents() -> None:
    buf = ReplayBuffer(capacity=5, obs_dim=OBS, act_dim=ACT, seed=0)
    assert buf.add(**batch([0, 1, 2])) == 0
    assert (buf.size, buf.position) == (3, 3)
    assert buf.add(**batch([3, 4, 5, 6])) == 2  # wraps: 5 and 6 overwrite rows 0 and 1
    assert (buf.size, buf.position) == (5, 2)
    np.testing.assert_array_equal(stored_ids(buf), [5, 6, 2, 3, 4])


def test_batch_larger_than_capacity_keeps_last_rows() -> None:
    buf = ReplayBuffer(capacity=4, obs_dim=OBS, act_dim=ACT, seed=0)
    buf.add(**batch([100]))
    evicted = buf.add(**batch(list(range(10))))
    assert evicted == 1 + 10 - 4  # the old row plus the 6 rows that never fit
    assert (buf.size, buf.position, buf.inserted, buf.evicted) == (4, 3, 11, 7)
    # as if appended one by one from position 1: id i lands on (1 + i) % 4
    np.testing.assert_array_equal(stored_ids(buf), [7, 8, 9, 6])


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 9), sizes=st.lists(st.integers(0, 20), max_size=12))
def test_ring_matches_one_by_one_model(capacity: int, sizes: list[int]) -> None:
    buf = ReplayBuffer(capacity=capacity, obs_dim=OBS, act_dim=ACT, seed=0)
    model = [-1] * capacity
    pos = size = next_id = total_evicted = 0
    for n in sizes:
        ids = list(range(next_id, next_id + n))
        next_id += n
        expected_evicted = max(0, size + n - capacity)
        for i in ids:
            model[pos] = i
            pos = (pos + 1) % capacity
        size = min(capacity, size + n)
        total_evicted += expected_evicted
        assert buf.add(**batch(ids)) == expected_evicted
        assert (buf.position, buf.size, buf.evicted, buf.inserted) == (pos, size, total_evicted, next_id)
        assert buf.size == buf.inserted - buf.evicted
        np.testing.assert_array_equal(stored_ids(buf), model[:size])


def test_sampling_returns_only_stored_rows() -> None:
    buf = ReplayBuffer(capacity=50, obs_dim=OBS, act_dim=ACT, seed=1)
    buf.add(**batch(range(80)))  # ids 30..79 survive
    ids = ids_of(buf.sample(4096))
    assert ids.min() >= 30 and ids.max() <= 79
    assert buf.sampled == 4096


def test_partial_buffer_samples_only_written_rows() -> None:
    buf = ReplayBuffer(capacity=1000, obs_dim=OBS, act_dim=ACT, seed=2)
    buf.add(**batch([7, 8, 9]))
    assert set(ids_of(buf.sample(512)).tolist()) == {7, 8, 9}


def test_sampling_is_roughly_uniform() -> None:
    buf = ReplayBuffer(capacity=20, obs_dim=OBS, act_dim=ACT, seed=3)
    buf.add(**batch(range(20)))
    counts = np.bincount(buf.sample_packed(100_000)[:, 0].astype(np.int64), minlength=20)
    expected = 100_000 / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 45.3  # df=19: P(chi2 > 45.3) ~ 1e-3; the seed is fixed so this never flakes


def test_sample_reuses_buffers_per_size_and_accepts_out() -> None:
    buf = ReplayBuffer(capacity=100, obs_dim=OBS, act_dim=ACT, seed=4)
    buf.add(**batch(range(100)))
    first, second = buf.sample(32), buf.sample(32)
    assert np.shares_memory(first["obs"], second["obs"])  # documented reuse
    assert not np.shares_memory(first["obs"], buf.sample(16)["obs"])
    shapes = {"obs": (8, OBS), "action": (8, ACT), "reward": (8,), "next_obs": (8, OBS), "done": (8,)}
    out = {name: np.empty(shape, np.float32) for name, shape in shapes.items()}
    got = buf.sample(8, out=out)
    assert got is out and got["obs"].flags.c_contiguous
    ids_of(out)
    sampled = buf.sampled
    with pytest.raises(ReplayInputError, match=r"out\['reward'\] has shape \(8, 1\), expected \(8,\)"):
        buf.sample(8, out={**out, "reward": np.empty((8, 1), np.float32)})
    assert buf.sampled == sampled  # rejected before drawing anything


def test_sample_packed_layout_and_out() -> None:
    buf = ReplayBuffer(capacity=10, obs_dim=OBS, act_dim=ACT, seed=5)
    buf.add(**batch(range(10)))
    assert buf.width == 2 * OBS + ACT + 2
    mine = np.empty((6, buf.width), np.float32)
    packed = buf.sample_packed(6, out=mine)
    assert packed is mine
    ids_of({name: packed[:, col] for name, col in buf.columns.items()})
    with pytest.raises(ReplayInputError, match="expected C-contiguous"):
        buf.sample_packed(6, out=np.empty((6, buf.width), np.float64))


def test_sample_errors() -> None:
    buf = ReplayBuffer(capacity=10, obs_dim=OBS, act_dim=ACT, seed=6)
    with pytest.raises(ReplayEmptyError, match="empty"):
        buf.sample(4)
    buf.add(**batch([1]))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ReplayInputError, match=f"n={bad!r}"):
            buf.sample(bad)  # type: ignore[arg-type]


def test_state_dict_round_trip_is_exact_including_rng() -> None:
    a = ReplayBuffer(capacity=64, obs_dim=OBS, act_dim=ACT, seed=7)
    a.add(**batch(range(40)))
    a.sample(10)
    state = a.state_dict()
    b = ReplayBuffer(capacity=64, obs_dim=OBS, act_dim=ACT, seed=999)
    b.load_state_dict(state)
    assert b.counters() == a.counters() and b.position == a.position
    for n in (5, 300):
        np.testing.assert_array_equal(a.sample_packed(n), b.sample_packed(n))
    a.add(**batch(range(40, 100)))
    b.add(**batch(range(40, 100)))
    np.testing.assert_array_equal(stored_ids(a), stored_ids(b))
    np.testing.assert_array_equal(a.sample_packed(50), b.sample_packed(50))
    state["data"][:] = -1  # the snapshot owns its arrays
    assert stored_ids(a).min() >= 0


def test_load_state_dict_rejects_mismatch() -> None:
    state = ReplayBuffer(capacity=8, obs_dim=OBS, act_dim=ACT, seed=0).state_dict()
    with pytest.raises(ReplayInputError, match="capacity=8, this buffer has 9"):
        ReplayBuffer(capacity=9, obs_dim=OBS, act_dim=ACT, seed=0).load_state_dict(state)


@pytest.mark.parametrize("name, value", [("capacity", 0), ("capacity", -5), ("obs_dim", 0), ("act_dim", 1.5)])
def test_constructor_rejects_bad_sizes(name: str, value: object) -> None:
    kwargs: dict[str, object] = {"capacity": 10, "obs_dim": OBS, "act_dim": ACT, "seed": 0, name: value}
    with pytest.raises(ValueError, match=f"{name}={value!r}") as info:
        ReplayBuffer(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ConfigError)


def assert_rejected(buf: ReplayBuffer, rows: dict[str, np.ndarray], pattern: str) -> None:
    """The add raises ReplayInputError matching `pattern` and writes nothing."""
    before = buf.state_dict()
    with pytest.raises(ReplayInputError, match=pattern):
        buf.add(**rows)
    after = buf.state_dict()
    np.testing.assert_array_equal(before.pop("data"), after.pop("data"))
    assert before == after


def test_wrong_trailing_shape_is_named() -> None:
    buf = ReplayBuffer(capacity=1000, obs_dim=17, act_dim=6, seed=0)
    rows = batch(range(256), obs_dim=17, act_dim=6)
    buf.add(**rows)
    pattern = r"obs has shape \(256, 16\), expected \(256, 17\)"
    assert_rejected(buf, {**rows, "obs": rows["obs"][:, :16]}, pattern)
    pattern = r"done has shape \(256, 1\), expected \(256,\)"
    assert_rejected(buf, {**rows, "done": rows["done"][:, None]}, pattern)


def test_mismatched_row_counts_are_named() -> None:
    buf = ReplayBuffer(capacity=100, obs_dim=OBS, act_dim=ACT, seed=0)
    rows = batch(range(10))
    assert_rejected(buf, {**rows, "action": rows["action"][:9]}, "obs has 10 rows, action has 9 rows")
    assert_rejected(buf, {**rows, "reward": np.float32(1.0)}, r"reward has shape \(\)")


def test_bad_dtype_is_named() -> None:
    buf = ReplayBuffer(capacity=100, obs_dim=OBS, act_dim=ACT, seed=0)
    rows = batch(range(4))
    assert_rejected(buf, {**rows, "reward": np.array(["a", "b", "c", "d"])}, "reward has dtype <U1")
    assert_rejected(buf, {**rows, "done": rows["done"].astype(complex)}, "done has dtype complex128")


def test_non_finite_values_rejected_and_nothing_written() -> None:
    buf = ReplayBuffer(capacity=8, obs_dim=OBS, act_dim=ACT, seed=0)
    buf.add(**batch(range(6)))
    rows = batch(range(6, 12))  # would wrap and evict if written
    reward = rows["reward"].copy()
    reward[3] = np.nan
    assert_rejected(buf, {**rows, "reward": reward}, "reward has a non-finite value nan at row 3")
    obs = rows["next_obs"].copy()
    obs[5, 1] = 1e39  # finite in float64, inf in float32
    assert_rejected(buf, {**rows, "next_obs": obs}, "next_obs has a non-finite value inf at row 5")


def test_non_finite_allowed_when_flag_off() -> None:
    buf = ReplayBuffer(capacity=8, obs_dim=OBS, act_dim=ACT, seed=0, reject_non_finite=False)
    rows = batch(range(2))
    rows["reward"][1] = np.inf
    buf.add(**rows)
    assert np.isinf(buf.state_dict()["data"][1, buf.columns["reward"]])


def test_accepts_read_only_views_and_other_dtypes_stores_float32() -> None:
    buf = ReplayBuffer(capacity=16, obs_dim=OBS, act_dim=ACT, seed=0)
    frame = np.arange(4 * OBS, dtype=np.float32).tobytes()
    obs = np.frombuffer(frame, dtype=np.float32).reshape(4, OBS)  # read-only, like a zmq frame
    assert not obs.flags.writeable
    done = np.array([0, 1, 0, 1], bool)
    buf.add(obs, np.ones((4, ACT), np.float64), np.arange(4, dtype=np.int32), obs, done)
    data = buf.state_dict()["data"]
    assert data.dtype == np.float32
    np.testing.assert_array_equal(data[:, buf.columns["obs"]], obs)
    np.testing.assert_array_equal(data[:, buf.columns["done"]], [0, 1, 0, 1])
    assert buf.add(**batch([])) == 0 and buf.size == 4


def test_add_rows_matches_add_and_checks_its_input() -> None:
    rng = np.random.default_rng(3)
    a, b = ReplayBuffer(50, 3, 2, seed=1), ReplayBuffer(50, 3, 2, seed=1)
    for n in (7, 40, 30, 0, 80):
        rows = rng.standard_normal((n, a.width)).astype(np.float32)
        cols = {k: rows[:, c] for k, c in a.columns.items()}
        assert b.add_rows(rows) == a.add(**cols)
    np.testing.assert_array_equal(a.sample_packed(20), b.sample_packed(20))
    assert (a.size, a.position, a.inserted, a.evicted) == (b.size, b.position, b.inserted, b.evicted)
    bad = np.zeros((4, a.width), np.float32)
    bad[2, 0] = np.nan
    with pytest.raises(ReplayInputError, match="obs has a non-finite value nan at row 2"):
        b.add_rows(bad)
    with pytest.raises(ReplayInputError, match=f"expected float32 \\[n, {a.width}\\]"):
        b.add_rows(np.zeros((4, a.width - 1), np.float32))
    assert b.inserted == 157  # refused batches wrote nothing
