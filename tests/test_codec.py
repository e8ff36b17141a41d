"""Tests for proto/codec.py: header fields, zero-copy encode and decode, limits, errors."""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import zmq

from spreeze.proto.codec import (
    DEFAULT_LIMITS, PROTOCOL_VERSION, WIRE_DTYPES, Encoder, Limits, decode, new_session_id,
)
from spreeze.proto.errors import ArrayError, FramingError, HeaderError, LimitError, VersionError

pytestmark = pytest.mark.timeout(20)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A connected inproc PAIR: real zmq.Frame objects without any process."""
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://codec-test")
    b.connect("inproc://codec-test")
    yield a, b
    ctx.destroy(linger=0)


def through_zmq(pair: tuple[zmq.Socket, zmq.Socket], frames: list) -> list[zmq.Frame]:
    a, b = pair
    a.send_multipart(frames, copy=False)
    assert b.poll(5000), "message did not arrive"
    return b.recv_multipart(copy=False)


def wire(frames: list) -> list[bytes]:
    """Frames as a receiver gets them: bytes, never the sender's numpy arrays."""
    return [bytes(memoryview(f)) for f in frames]


def header(**fields: object) -> bytes:
    head = {"v": PROTOCOL_VERSION, "type": "t", "sender": "s", "session": "x", "seq": 1,
            "ts": 0.0, "arrays": [], "body": {}}
    head.update(fields)
    return msgpack.packb(head)


# ------------------------------------------------------------------ header fields

def test_header_fields_seq_session_sender() -> None:
    enc = Encoder("sampler-3")
    before = time.time()
    envs = [decode(wire(enc.encode("metrics", {"i": i}))) for i in range(5)]
    assert [e.seq for e in envs] == [1, 2, 3, 4, 5]
    assert {e.session for e in envs} == {enc.session}
    assert all(e.sender == "sampler-3" and e.type == "metrics" for e in envs)
    assert all(before <= e.ts <= time.time() for e in envs)
    assert [e.body["i"] for e in envs] == list(range(5))


def test_sessions_differ_per_encoder_and_can_be_given() -> None:
    assert Encoder("a").session != Encoder("a").session
    assert Encoder("a", session="fixed").session == "fixed"
    assert len(new_session_id()) == 16


def test_seq_is_per_encoder() -> None:
    a, b = Encoder("a"), Encoder("b")
    a.encode("x", {})
    a.encode("x", {})
    assert decode(wire(b.encode("x", {}))).seq == 1
    assert decode(wire(a.encode("x", {}))).seq == 3


def test_header_carries_version_and_descriptors() -> None:
    frames = Encoder("s").encode("t", {"k": [1, "a"]}, {"m": np.zeros((2, 3), np.int16)})
    head = msgpack.unpackb(frames[0])
    assert head["v"] == PROTOCOL_VERSION
    assert head["arrays"] == [["m", "int16", [2, 3]]]
    assert head["body"] == {"k": [1, "a"]}


def test_numpy_scalars_in_body_travel_as_python_scalars() -> None:
    body = decode(wire(Encoder("s").encode("t", {"f": np.float32(1.5), "i": np.int64(7),
                                                 "b": np.bool_(True)}))).body
    assert body == {"f": 1.5, "i": 7, "b": True}
    assert [type(body[k]) for k in "fib"] == [float, int, bool]


def test_unencodable_body_value_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="object"):
        Encoder("s").encode("t", {"x": object()})


def test_descriptor_cache_is_bounded() -> None:
    enc = Encoder("s")
    for n in range(1000):
        enc.encode("t", {}, {"a": np.zeros(n, np.uint8)})
    assert len(enc._descs) <= 256
    assert decode(wire(enc.encode("t", {}, {"a": np.zeros(5, np.uint8)}))).arrays["a"].shape == (5,)


# ------------------------------------------------------------------ zero copy

def test_encode_does_not_copy_contiguous_little_endian() -> None:
    arr = np.arange(12, dtype="<f4").reshape(3, 4)
    frames = Encoder("s").encode("t", {}, {"a": arr, "b": arr[1:]})
    assert frames[1] is arr
    assert np.shares_memory(frames[2], arr)


@pytest.mark.parametrize("make", [
    lambda a: a.astype(">f4"),  # big-endian
    lambda a: a.T,  # Fortran order
    lambda a: a[:, ::2],  # strided
], ids=["big-endian", "transposed", "strided"])
def test_encode_converts_big_endian_and_non_contiguous(make) -> None:
    src = np.arange(24, dtype="<f4").reshape(4, 6)
    arr = make(src)
    out = Encoder("s").encode("t", {}, {"a": arr})[1]
    assert out is not arr
    assert out.flags.c_contiguous and out.dtype == np.dtype("<f4") and out.dtype.byteorder in "=<"
    np.testing.assert_array_equal(decode(wire(Encoder("s").encode("t", {}, {"a": arr})))
                                  .arrays["a"], arr)


def test_decoded_array_shares_memory_with_bytearray() -> None:
    arr = np.arange(1000, dtype=np.float64)
    frames = Encoder("s").encode("t", {}, {"a": arr})
    buf = bytearray(arr.tobytes())
    got = decode([frames[0], buf]).arrays["a"]
    assert np.shares_memory(got, np.frombuffer(buf, np.uint8))
    assert got.flags.writeable
    got[0] = 42.0
    assert np.frombuffer(buf, np.float64)[0] == 42.0


def test_decoded_array_is_a_view_of_the_zmq_frame(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    arr = np.random.default_rng(0).standard_normal((4096, 42)).astype(np.float32)
    frames = through_zmq(pair, Encoder("s").encode("t", {}, {"a": arr}))
    got = decode(frames).arrays["a"]
    np.testing.assert_array_equal(got, arr)
    assert got.base is frames[1]
    assert np.shares_memory(got, np.frombuffer(frames[1].buffer, np.uint8))


def test_decode_bytes_frames_gives_readonly_view() -> None:
    arr = np.arange(10, dtype=np.int32)
    frames = Encoder("s").encode("t", {}, {"a": arr})
    payload = arr.tobytes()
    got = decode([frames[0], payload]).arrays["a"]
    assert got.base is payload and not got.flags.writeable


# ------------------------------------------------------------------ dtypes and shapes

@pytest.mark.parametrize("name", sorted(WIRE_DTYPES))
def test_every_wire_dtype_round_trips(name: str) -> None:
    arr = (np.arange(6) % 2).astype(WIRE_DTYPES[name]).reshape(2, 3)
    got = decode(wire(Encoder("s").encode("t", {}, {"a": arr}))).arrays["a"]
    assert got.dtype == arr.dtype and got.shape == (2, 3)
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("shape", [(), (0,), (0, 42), (3, 0, 2), (1,) * 8])
def test_edge_shapes_round_trip(shape: tuple[int, ...]) -> None:
    arr = np.ones(shape, np.float32)
    got = decode(wire(Encoder("s").encode("t", {}, {"a": arr}))).arrays["a"]
    assert got.shape == shape


@pytest.mark.parametrize("bad", [np.zeros(2, np.complex64), np.array(["a"]), np.zeros(2, "M8[s]"),
                                 np.array([object()])], ids=["complex", "unicode", "datetime", "object"])
def test_encode_rejects_non_wire_dtypes(bad: np.ndarray) -> None:
    with pytest.raises(ArrayError, match="'a'.*not a wire dtype"):
        Encoder("s").encode("t", {}, {"a": bad})


def test_encode_rejects_non_arrays() -> None:
    with pytest.raises(ArrayError, match="'a' is a list"):
        Encoder("s").encode("t", {}, {"a": [1, 2]})  # type: ignore[dict-item]


# ------------------------------------------------------------------ limits and errors

def test_limits_reject_unknown_dtype_names() -> None:
    with pytest.raises(ValueError, match="complex64"):
        Limits(dtypes=frozenset({"float32", "complex64"}))


def test_limits_restrict_dtypes() -> None:
    frames = wire(Encoder("s").encode("t", {}, {"a": np.zeros(3, np.float64)}))
    decode(frames)
    with pytest.raises(ArrayError, match="'float64' is not allowed"):
        decode(frames, Limits(dtypes=frozenset({"float32"})))


def test_limits_total_bytes_and_frames() -> None:
    frames = wire(Encoder("s").encode("t", {}, {"a": np.zeros(100, np.uint8),
                                                 "b": np.zeros(100, np.uint8)}))
    decode(frames, Limits(max_total_bytes=200))
    with pytest.raises(LimitError, match="200 bytes > max_total_bytes=199"):
        decode(frames, Limits(max_total_bytes=199))
    with pytest.raises(LimitError, match="3 frames exceed max_frames=2"):
        decode(frames, Limits(max_frames=2))


def test_empty_message_is_a_framing_error() -> None:
    with pytest.raises(FramingError, match="empty"):
        decode([])


def test_missing_array_frame_is_a_framing_error() -> None:
    frames = Encoder("s").encode("t", {}, {"a": np.zeros(3, np.uint8)})
    with pytest.raises(FramingError, match="describes 1 arrays but 0"):
        decode(frames[:1])


def test_duplicate_array_names_are_rejected() -> None:
    head = header(arrays=[["a", "uint8", [1]], ["a", "uint8", [1]]])
    with pytest.raises(ArrayError, match="not unique"):
        decode([head, b"\x00", b"\x01"])


def test_version_error_names_the_version() -> None:
    with pytest.raises(VersionError, match="version 2 "):
        decode([header(v=2)])


def test_unknown_header_fields_are_ignored() -> None:
    env = decode([header(future_field={"x": 1}, trace=[1, 2])])
    assert env.type == "t"


def test_header_size_limit() -> None:
    big = header(body={"pad": "x" * DEFAULT_LIMITS.max_header_bytes})
    with pytest.raises(LimitError, match="max_header_bytes"):
        decode([big])


def test_header_body_must_have_string_keys() -> None:
    with pytest.raises(HeaderError, match="b'k'"):
        decode([header(body={"ok": {b"k": 1}})])


def test_huge_dims_of_an_empty_array_are_an_array_error() -> None:
    with pytest.raises(ArrayError, match="not a valid numpy shape"):
        decode([header(arrays=[["a", "float32", [0, 2**63]]]), b""])
