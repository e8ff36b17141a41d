"""Tests for proto/messages.py: every message type round-trips the wire; schema errors."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from spreeze.proto.codec import Encoder, decode
from spreeze.proto.errors import SchemaError, UnknownTypeError
from spreeze.proto.messages import (
    MESSAGE_TYPES, Control, ControlReply, Error, EvalResult, Event, Experience, ExperienceAck, Heartbeat, Message,
    Metrics, Register, SampledBatch, SampleRequest, TransitionLayout, Weights, Welcome,
    from_envelope, to_frames,
)

pytestmark = pytest.mark.timeout(30)
OBS, ACT = 17, 6
LAYOUT = TransitionLayout(OBS, ACT)
RNG = np.random.default_rng(0)


def transitions(n: int) -> np.ndarray:
    m = RNG.standard_normal((n, LAYOUT.width), dtype=np.float32)
    LAYOUT.columns(m)["done"][:] = RNG.integers(0, 2, n)  # done is 0 or 1
    return m


def sparse(shape: tuple[int, ...], density: float) -> tuple[np.ndarray, np.ndarray]:
    size = int(np.prod(shape))
    idx = np.sort(RNG.choice(size, int(size * density), replace=False)).astype(np.int32)
    return idx, RNG.standard_normal(len(idx), dtype=np.float32)


def dense_weights() -> Weights:
    return Weights(net="actor", version=3, updates=1000, extras={"alpha": 0.2},
                   dense={"l0.weight": RNG.standard_normal((256, 17), dtype=np.float32),
                          "l0.bias": np.zeros(256, np.float32)})


def sparse_weights() -> Weights:
    i0, v0 = sparse((256, 17), 0.1)
    i1, v1 = sparse((6, 256), 0.5)
    return Weights(net="critic", version=7, updates=5000, dense={"l0.bias": np.ones(256, np.float32)},
                   idx={"l0.weight": i0, "l1.weight": i1}, val={"l0.weight": v0, "l1.weight": v1},
                   shapes={"l0.weight": [256, 17], "l1.weight": [6, 256]})


SAMPLES: dict[str, Callable[[], Message]] = {
    "experience": lambda: Experience(transitions(256), OBS, ACT, env_steps=4096, actor_version=2,
                                     episode_returns=[1.5, -3.25], episode_lengths=[1000, 17]),
    "experience_ack": lambda: ExperienceAck(batch=12, status="stored", stored=12, durable=8),
    "sample_request": lambda: SampleRequest(request_id=9, batch_size=256, obs_stats=True),
    "sampled_batch": lambda: SampledBatch(9, transitions(256), OBS, ACT, replay_size=10**6,
                                          inserted=2 * 10**6, obs_count=2 * 10**6,
                                          obs_stats={"mean": np.linspace(-1, 1, OBS, dtype=np.float32),
                                                     "var": np.linspace(0, 3, OBS, dtype=np.float32)}),
    "weights": sparse_weights,
    "metrics": lambda: Metrics("replay", {"inserted": 5, "rate": 1.5e6, "state": "ok"}),
    "eval_result": lambda: EvalResult(4, 10**5, 10**4, 1234.5, 12.25, 1000.0, 10, [1200.0, 1269.0]),
    "event": lambda: Event("restart", "sampler-2 missed 3 heartbeats", {"pid": 4242, "n": [1, 2]}),
    "register": lambda: Register("sampler", 4242, "host-a", "sampler-2"),
    "welcome": lambda: Welcome("sampler-2", {"experience": "ipc:///tmp/x/exp"},
                               {"envs": 8, "env": {"id": "HalfCheetah-v5"}}, 1.0),
    "heartbeat": lambda: Heartbeat("sampler-2", "running", {"env_steps": 10, "sps": 2.5e3}),
    "control": lambda: Control("set", 12, key="envs_per_sampler", value=16),
    "control_reply": lambda: ControlReply(12, True, "envs_per_sampler=16"),
    "error": lambda: Error("array", "array 'transitions' dtype 'float128' is not allowed",
                           "experience", 77),
}


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://messages-test")
    b.connect("inproc://messages-test")
    yield a, b
    ctx.destroy(linger=0)


def as_bytes(frames: list[Any]) -> list[bytes]:
    return [bytes(memoryview(f)) for f in frames]


def as_zmq_frames(pair: tuple[zmq.Socket, zmq.Socket], frames: list[Any]) -> list[zmq.Frame]:
    pair[0].send_multipart(frames, copy=False)
    assert pair[1].poll(5000)
    got = pair[1].recv_multipart(copy=False)
    assert all(isinstance(f, zmq.Frame) for f in got)
    return got


def assert_same(a: Message, b: Message) -> None:
    """Field-by-field equality; arrays equal in dtype, shape and values."""
    assert type(a) is type(b)
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        elif isinstance(x, dict) and f.name in ("dense", "idx", "val", "obs_stats"):
            assert x.keys() == y.keys(), f.name
            for k in x:
                assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, f"{f.name}/{k}"
                np.testing.assert_array_equal(x[k], y[k], err_msg=f"{f.name}/{k}")
        else:
            assert x == y and type(x) is type(y), (f.name, x, y)


def test_samples_cover_every_message_type() -> None:
    assert SAMPLES.keys() == MESSAGE_TYPES.keys()
    assert all(type(make()) is MESSAGE_TYPES[t] for t, make in SAMPLES.items())


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_round_trip_as_bytes(kind: str) -> None:
    msg = SAMPLES[kind]()
    got = from_envelope(decode(as_bytes(to_frames(msg, Encoder("s")))))
    assert_same(msg, got)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_round_trip_as_zmq_frames(kind: str, pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    msg = SAMPLES[kind]()
    got = from_envelope(decode(as_zmq_frames(pair, to_frames(msg, Encoder("s")))))
    assert_same(msg, got)


def test_envelope_header_fields() -> None:
    enc = Encoder("replay")
    envs = [decode(as_bytes(to_frames(SAMPLES[k](), enc))) for k in sorted(SAMPLES)]
    assert [e.seq for e in envs] == list(range(1, len(SAMPLES) + 1))
    assert {e.session for e in envs} == {enc.session}
    assert {e.sender for e in envs} == {"replay"}
    assert [e.type for e in envs] == sorted(SAMPLES)


@pytest.mark.parametrize("make", [dense_weights, sparse_weights], ids=["dense", "sparse"])
def test_weights_round_trip(make: Callable[[], Weights], pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    msg = make()
    got = from_envelope(decode(as_zmq_frames(pair, to_frames(msg, Encoder("learner")))))
    assert isinstance(got, Weights)
    assert_same(msg, got)
    for key, shape in got.shapes.items():  # the sparse tensors rebuild exactly
        a, b = np.zeros(shape, np.float32).ravel(), np.zeros(shape, np.float32).ravel()
        a[msg.idx[key]], b[got.idx[key]] = msg.val[key], got.val[key]
        np.testing.assert_array_equal(a, b)


def test_weights_frame_names() -> None:
    frames = to_frames(sparse_weights(), Encoder("s"))
    names = list(decode(as_bytes(frames)).arrays)
    assert sorted(names) == ["dense/l0.bias", "idx/l0.weight", "idx/l1.weight",
                             "val/l0.weight", "val/l1.weight"]


@pytest.mark.parametrize("n", [0, 1, 100_000])
def test_experience_batch_sizes(n: int, pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    msg = Experience(transitions(n), OBS, ACT, env_steps=n)
    got = from_envelope(decode(as_zmq_frames(pair, to_frames(msg, Encoder("s")))))
    assert isinstance(got, Experience) and got.transitions.shape == (n, LAYOUT.width)
    assert_same(msg, got)


def test_experience_is_zero_copy_both_ways(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    m = transitions(4096)
    frames = to_frames(Experience(m, OBS, ACT, 1), Encoder("s"))
    assert frames[1] is m
    received = as_zmq_frames(pair, frames)
    got = from_envelope(decode(received))
    assert isinstance(got, Experience)
    assert np.shares_memory(got.transitions, np.frombuffer(received[1].buffer, np.uint8))


def test_transition_layout_pack_and_columns() -> None:
    n = 5
    obs, nxt = RNG.standard_normal((n, OBS)), RNG.standard_normal((n, OBS))
    act, rew, done = RNG.standard_normal((n, ACT)), RNG.standard_normal(n), np.array([0, 1, 0, 0, 1])
    m = LAYOUT.pack(obs, act, rew, nxt, done)
    assert m.shape == (n, 2 * OBS + ACT + 2) and m.dtype == np.float32
    cols = LAYOUT.columns(m)
    for name, want in (("obs", obs), ("action", act), ("reward", rew), ("next_obs", nxt), ("done", done)):
        np.testing.assert_allclose(cols[name], want.astype(np.float32))
        assert np.shares_memory(cols[name], m)


# ------------------------------------------------------------------ schema errors

def env_of(msg: Message, **body: Any) -> Any:
    env = decode(as_bytes(to_frames(msg, Encoder("peer-1"))))
    env.body.update(body)
    return env


def test_unknown_type_names_type_and_sender() -> None:
    env = decode(as_bytes(Encoder("peer-1").encode("telepathy", {})))
    with pytest.raises(UnknownTypeError, match="'telepathy' from 'peer-1'"):
        from_envelope(env)


def test_missing_required_field() -> None:
    env = env_of(SampleRequest(1, 2))
    del env.body["batch_size"]
    with pytest.raises(SchemaError, match="'batch_size' is missing"):
        from_envelope(env)


@pytest.mark.parametrize("field,value", [("batch_size", "256"), ("batch_size", True),
                                         ("batch_size", 2.5), ("request_id", [1])])
def test_wrong_field_type_names_the_value(field: str, value: Any) -> None:
    with pytest.raises(SchemaError, match=re.escape(f"{field}={value!r}")):
        from_envelope(env_of(SampleRequest(1, 2), **{field: value}))


def test_int_is_accepted_for_float_fields() -> None:
    got = from_envelope(env_of(SAMPLES["eval_result"](), return_mean=7))
    assert isinstance(got, EvalResult) and got.return_mean == 7


def test_missing_required_array() -> None:
    env = env_of(SampledBatch(1, transitions(4), OBS, ACT))
    env.arrays.clear()
    with pytest.raises(SchemaError, match="required array 'transitions'"):
        from_envelope(env)


@pytest.mark.parametrize("bad", [np.zeros((4, 41), np.float32), np.zeros((4, 42), np.float64),
                                 np.zeros(42, np.float32)], ids=["width", "dtype", "ndim"])
def test_transitions_must_match_the_layout(bad: np.ndarray) -> None:
    with pytest.raises(SchemaError, match="transitions has"):
        from_envelope(decode(as_bytes(to_frames(Experience(bad, OBS, ACT, 0), Encoder("s")))))


def test_dims_must_be_positive() -> None:
    m = np.zeros((1, 2), np.float32)
    with pytest.raises(SchemaError, match="obs_dim=0"):
        from_envelope(decode(as_bytes(to_frames(Experience(m, 0, 0, 0), Encoder("s")))))


def test_unknown_body_fields_and_arrays_are_ignored() -> None:
    env = env_of(SampleRequest(1, 2), future_knob=3)
    env.arrays["future/array"] = np.zeros(1)
    assert from_envelope(env) == SampleRequest(1, 2)


@pytest.mark.parametrize("value", [2.0, 0.5, -1.0, np.nan])
def test_done_other_than_zero_or_one_is_refused_by_value(value: float) -> None:
    m = np.zeros((4, 2 * OBS + ACT + 2), np.float32)
    m[1:, -1] = 1.0
    m[2, -1] = value
    with pytest.raises(SchemaError, match=rf"done={value!r} in row 2"):
        from_envelope(decode(as_bytes(to_frames(Experience(m, OBS, ACT, 4), Encoder("s")))))


@pytest.mark.parametrize("random_steps, actor_version, rows", [(-1, -1, 4), (-1, 3, 0), (2, 3, 2), (4, -1, 4)])
def test_random_steps_default_and_range(random_steps: int, actor_version: int, rows: int) -> None:
    m = np.zeros((4, 2 * OBS + ACT + 2), np.float32)
    msg = from_envelope(decode(as_bytes(to_frames(Experience(m, OBS, ACT, 4, actor_version,
                                                             random_steps=random_steps), Encoder("s")))))
    assert isinstance(msg, Experience) and msg.random_rows == rows
    for bad in (5, -2):
        with pytest.raises(SchemaError, match=f"random_steps={bad} must be in 0..4"):
            from_envelope(decode(as_bytes(to_frames(Experience(m, OBS, ACT, 4, random_steps=bad), Encoder("s")))))


@pytest.mark.parametrize(("stats", "match"), [
    ({"mean": np.zeros(OBS, np.float32)}, "obs_stats/var must be float32"),
    ({"mean": np.zeros(OBS + 1, np.float32), "var": np.ones(OBS, np.float32)}, "obs_stats/mean must be float32"),
    ({"mean": np.zeros(OBS, np.float64), "var": np.ones(OBS, np.float32)}, "obs_stats/mean must be float32"),
    ({"mean": np.zeros(OBS, np.float32), "var": -np.ones(OBS, np.float32)}, "var must be >= 0"),
])
def test_sampled_batch_obs_stats_are_checked(stats: dict[str, np.ndarray], match: str) -> None:
    with pytest.raises(SchemaError, match=match):
        SampledBatch(1, transitions(4), OBS, ACT, obs_count=4, obs_stats=stats).check()
