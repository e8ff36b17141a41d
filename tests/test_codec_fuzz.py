"""Property-based fuzzing of decode + from_envelope: bad input only ever raises ProtocolError.

Targeted cases assert the specific error subclass and that its message names the bad
value; untargeted ones (random bytes, random msgpack, mutated messages) assert that the
result is either a valid Message or a ProtocolError, never any other exception or a hang.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from spreeze.proto.codec import DEFAULT_LIMITS, PROTOCOL_VERSION, WIRE_DTYPES, Encoder, Limits, decode
from spreeze.proto.errors import ArrayError, FramingError, HeaderError, LimitError, ProtocolError, VersionError
from spreeze.proto.messages import MESSAGE_TYPES, Message, from_envelope, to_frames
from tests.test_messages import SAMPLES

pytestmark = pytest.mark.timeout(60)
FUZZ = settings(max_examples=150, deadline=timedelta(milliseconds=1000),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
KINDS = sorted(SAMPLES)
PLACEHOLDER = b"\x00spreeze-fuzz-placeholder\x00"


def wire(msg: Message) -> list[bytes]:
    return [bytes(memoryview(f)) for f in to_frames(msg, Encoder("fuzzer"))]


WIRE = {kind: wire(SAMPLES[kind]()) for kind in KINDS}


def parse(frames: list[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    return from_envelope(decode(frames, limits))


def parse_or_error(frames: list[Any], limits: Limits = DEFAULT_LIMITS) -> ProtocolError | None:
    """Only a Message or a ProtocolError (with a message) may come out."""
    try:
        msg = parse(frames, limits)
    except ProtocolError as exc:
        assert str(exc)
        return exc
    assert isinstance(msg, Message)
    return None


def header(**fields: Any) -> bytes:
    head: dict[Any, Any] = {"v": PROTOCOL_VERSION, "type": "sample_request", "sender": "s",
                            "session": "x", "seq": 1, "ts": 0.0, "arrays": [],
                            "body": {"request_id": 1, "batch_size": 2}}
    head.update(fields)
    return msgpack.packb(head, use_bin_type=True)


def raises(exc_type: type[ProtocolError], frames: list[Any], names: Any = None,
           limits: Limits = DEFAULT_LIMITS) -> ProtocolError:
    """Assert that parsing raises exactly `exc_type`, whose message names `names`."""
    with pytest.raises(ProtocolError) as info:
        parse(frames, limits)
    assert type(info.value) is exc_type, f"{type(info.value).__name__}: {info.value}"
    if names is not None:
        assert str(names) in str(info.value), (names, str(info.value))
    return info.value


# ------------------------------------------------------------------ strategies

ints = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry
scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
           | st.text(max_size=12) | st.binary(max_size=12))
keys = st.text(max_size=8) | st.integers(-5, 5) | st.binary(max_size=8)
msgpack_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=4),
    max_leaves=20)
str_key_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20)
bad_dtypes = (st.text(max_size=12).filter(lambda s: s not in WIRE_DTYPES) | ints
              | st.none() | st.binary(max_size=8) | st.sampled_from(["float128", "complex64", "<f4",
                                                                      "object", "O", "V8", "U4"]))
ext_codes = st.integers(-128, 127)
ext_data = st.binary(max_size=20)


def ext_bytes(code: int, data: bytes) -> bytes:
    """A msgpack ext value with any code, including the reserved negative ones."""
    fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
    c = code.to_bytes(1, "big", signed=True)
    if len(data) in fixed:
        return bytes([fixed[len(data)]]) + c + data
    return b"\xc7" + bytes([len(data)]) + c + data


def _is_timestamp(data: bytes) -> bool:
    try:
        return isinstance(msgpack.unpackb(ext_bytes(-1, data)), msgpack.Timestamp)
    except ValueError:
        return False


def with_ext(where: str, code: int, data: bytes) -> bytes:
    """A valid header whose field `where` (dotted path) holds an ext value."""
    fields: dict[str, Any] = {}
    if where.startswith("body."):
        fields["body"] = {"request_id": 1, "batch_size": 2, where[5:]: PLACEHOLDER}
    elif where == "arrays":
        fields["arrays"] = [[PLACEHOLDER, "uint8", [0]]]
    else:
        fields[where] = PLACEHOLDER
    packed_placeholder = msgpack.packb(PLACEHOLDER, use_bin_type=True)
    return header(**fields).replace(packed_placeholder, ext_bytes(code, data))


# ------------------------------------------------------------------ untargeted

@FUZZ
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=6))
def test_random_bytes_frames(frames: list[bytes]) -> None:
    assert parse_or_error(frames) is not None


@FUZZ
@given(msgpack_values, st.lists(st.binary(max_size=64), max_size=3))
def test_random_msgpack_object_as_header(obj: Any, rest: list[bytes]) -> None:
    parse_or_error([msgpack.packb(obj, use_bin_type=True), *rest])


@FUZZ
@given(st.dictionaries(st.sampled_from(["v", "type", "sender", "session", "seq", "ts", "arrays",
                                        "body", "extra"]), msgpack_values, max_size=4),
       st.lists(st.binary(max_size=64), max_size=3))
def test_valid_header_with_random_fields(fields: dict[str, Any], rest: list[bytes]) -> None:
    parse_or_error([header(**fields), *rest])


@FUZZ
@given(st.sampled_from(KINDS), st.data())
def test_random_body_values_per_message_type(kind: str, data: st.DataObject) -> None:
    env = decode(WIRE[kind])
    for name in list(env.body):
        if data.draw(st.booleans()):
            env.body[name] = data.draw(str_key_values)
    try:
        from_envelope(env)
    except ProtocolError:
        pass


@FUZZ
@given(st.sampled_from(KINDS), st.data())
def test_mutated_valid_messages(kind: str, data: st.DataObject) -> None:
    frames = [bytearray(f) for f in WIRE[kind]]
    for _ in range(data.draw(st.integers(1, 6))):
        _mutate(frames, data)
    parse_or_error([bytes(f) for f in frames])


def _mutate(frames: list[bytearray], data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(frames) - 1)) if frames else 0
    op = data.draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "extend",
                                    "drop_frame", "dup_frame"]))
    if not frames:
        frames.append(bytearray())
        return
    f = frames[i]
    pos = data.draw(st.integers(0, max(len(f) - 1, 0)))
    if op == "flip" and f:
        f[pos] ^= 1 << data.draw(st.integers(0, 7))
    elif op == "set" and f:
        f[pos] = data.draw(st.integers(0, 255))
    elif op == "insert":
        f[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    elif op == "delete":
        del f[pos:pos + data.draw(st.integers(1, 8))]
    elif op == "truncate":
        del f[pos:]
    elif op == "extend":
        f.extend(data.draw(st.binary(min_size=1, max_size=16)))
    elif op == "drop_frame":
        del frames[i]
    elif op == "dup_frame":
        frames.insert(i, bytearray(f))


# ------------------------------------------------------------------ targeted

@FUZZ
@given(st.sampled_from(KINDS), st.data())
def test_truncated_header_is_a_header_error(kind: str, data: st.DataObject) -> None:
    frames = WIRE[kind]
    cut = data.draw(st.integers(0, len(frames[0]) - 1))
    err = raises(HeaderError, [frames[0][:cut], *frames[1:]])
    assert "frame 0 is not a msgpack map" in str(err)


@FUZZ
@given(st.sampled_from([k for k in KINDS if len(WIRE[k]) > 1]), st.data())
def test_resized_array_frame_is_an_array_error(kind: str, data: st.DataObject) -> None:
    frames = list(WIRE[kind])
    i = data.draw(st.integers(1, len(frames) - 1))
    size = data.draw(st.integers(0, len(frames[i]) + 64).filter(lambda n: n != len(frames[i])))
    frames[i] = (frames[i] + bytes(64))[:size]
    name = msgpack.unpackb(frames[0])["arrays"][i - 1][0]
    err = raises(ArrayError, frames, names=repr(name))
    assert f"frame has {size}" in str(err)


@FUZZ
@given(st.sampled_from(KINDS), st.integers(1, 3), st.booleans())
def test_missing_or_extra_frames_are_framing_errors(kind: str, k: int, drop: bool) -> None:
    frames = WIRE[kind]
    assume(not drop or len(frames) > k)
    bad = frames[:-k] if drop else [*frames, *([b"x"] * k)]
    raises(FramingError, bad, names=f"{len(bad) - 1} array frames arrived")


@FUZZ
@given(st.integers(16, 4096), st.integers(1, 200))
def test_oversized_header_is_a_limit_error(max_header: int, extra: int) -> None:
    head = header(body={"request_id": 1, "batch_size": 2, "pad": "x" * max_header})
    raises(LimitError, [head + bytes(extra)], names=f"{len(head) + extra} bytes",
           limits=Limits(max_header_bytes=max_header))


@FUZZ
@given(st.integers(1, 40), st.integers(1, 40))
def test_too_many_frames_is_a_limit_error(max_frames: int, extra: int) -> None:
    frames = [header()] + [b""] * (max_frames + extra - 1)
    raises(LimitError, frames, names=f"{len(frames)} frames", limits=Limits(max_frames=max_frames))


@FUZZ
@given(st.lists(st.integers(0, 4096), min_size=1, max_size=5), st.data())
def test_total_bytes_over_the_limit(sizes: list[int], data: st.DataObject) -> None:
    total = sum(sizes)
    assume(total > 0)
    limit = data.draw(st.integers(0, total - 1))
    descs = [[f"a{i}", "uint8", [n]] for i, n in enumerate(sizes)]
    frames = [header(arrays=descs), *(bytes(n) for n in sizes)]
    raises(LimitError, frames, names=f"max_total_bytes={limit}", limits=Limits(max_total_bytes=limit))


@FUZZ
@given(str_key_values.filter(lambda v: not (type(v) is int and v == PROTOCOL_VERSION)))
def test_wrong_version_is_a_version_error(version: Any) -> None:
    raises(VersionError, [header(v=version)], names=f"{version!r:.40}")


def test_version_must_be_the_int_itself() -> None:
    for v in (1.0, True, "1", [1], None):
        raises(VersionError, [header(v=v)])
    raises(VersionError, [msgpack.packb({"type": "x"})], names="None")


@FUZZ
@given(bad_dtypes)
def test_disallowed_dtype_is_an_array_error(dtype: Any) -> None:
    frames = [header(arrays=[["m", dtype, [1]]]), b"\x00" * 16]
    raises(ArrayError, frames, names=f"{dtype!r:.40}")


@FUZZ
@given(st.sampled_from(sorted(WIRE_DTYPES)), st.sampled_from(sorted(WIRE_DTYPES)))
def test_dtype_excluded_by_limits(dtype: str, allowed: str) -> None:
    assume(dtype != allowed)
    frames = [header(arrays=[["m", dtype, [2]]]), bytes(2 * WIRE_DTYPES[dtype].itemsize)]
    parse_or_error(frames)  # allowed by default
    raises(ArrayError, frames, names=repr(dtype), limits=Limits(dtypes=frozenset({allowed})))


@FUZZ
@given(st.sampled_from(sorted(WIRE_DTYPES)), st.lists(st.integers(0, 50), max_size=4), st.integers(0, 4096))
def test_shape_and_byte_size_mismatch(dtype: str, shape: list[int], size: int) -> None:
    need = WIRE_DTYPES[dtype].itemsize * int(np.prod(shape, dtype=np.int64))
    assume(size != need)
    err = raises(ArrayError, [header(arrays=[["m", dtype, shape]]), bytes(size)], names="'m'")
    assert f"needs {need} bytes, frame has {size}" in str(err)


@FUZZ
@given(st.lists(st.integers(0, 4), max_size=3),
       st.integers(-(2**63), -1) | st.floats() | st.text(max_size=4) | st.none() | st.booleans()
       | st.lists(ints, max_size=2))
def test_negative_or_non_int_dims(good: list[int], bad: Any) -> None:
    shape = [*good, bad]
    err = raises(ArrayError, [header(arrays=[["m", "float32", shape]]), b""], names="'m'")
    assert f"bad dimension {bad!r:.20}" in str(err)


@FUZZ
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=8), st.integers(0, 7))
def test_huge_dims_never_escape_as_numpy_errors(dims: list[int], zero_at: int) -> None:
    dims.insert(min(zero_at, len(dims)), 0)
    shape = dims[:DEFAULT_LIMITS.max_ndim]
    if 0 not in shape:
        shape[-1] = 0
    err = parse_or_error([header(arrays=[["m", "float32", shape]]), b""])
    assert err is None or isinstance(err, ArrayError)


@FUZZ
@given(st.integers(DEFAULT_LIMITS.max_ndim + 1, 40))
def test_too_many_dims(ndim: int) -> None:
    raises(ArrayError, [header(arrays=[["m", "uint8", [1] * ndim]]), b"\x00"], names="at most 8")


@FUZZ
@given(st.sampled_from([{}, [], "leaf", 1]), st.lists(st.booleans(), min_size=1, max_size=60))
def test_nesting_within_and_over_max_depth(leaf: Any, kinds: list[bool]) -> None:
    node = leaf
    for as_list in kinds:
        node = [node] if as_list else {"k": node}
    containers = len(kinds) + (type(leaf) in (dict, list))
    frames = [header(body={"request_id": 1, "batch_size": 2, "deep": node})]
    if containers < DEFAULT_LIMITS.max_depth:
        parse(frames)
    else:
        err = raises(LimitError, frames)
        assert "max_depth" in str(err)


@pytest.mark.parametrize("depth,error", [(100, LimitError), (1000, LimitError),
                                         (5000, HeaderError), (20000, HeaderError)])
def test_very_deep_nesting_is_rejected_without_recursion(depth: int, error: type) -> None:
    body = b"\x81\xa1k" * depth + b"\xc0"  # {"k": {"k": ... None}}
    raw = header(body=PLACEHOLDER).replace(msgpack.packb(PLACEHOLDER), body)
    err = raises(error, [raw])  # msgpack's own stack limit (1024) stops the deepest ones
    assert re.search("max_depth|StackError", str(err))


@FUZZ
@given(st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=8) | st.floats(allow_nan=False)
       | st.booleans() | st.none(), st.integers(0, 3), st.sampled_from(["top", "body", "nested", "extra"]))
def test_non_string_map_keys(key: Any, depth: int, where: str) -> None:
    inner: Any = {key: 1}
    for _ in range(depth):
        inner = {"k": inner}
    if where == "top":
        raw = msgpack.packb({**msgpack.unpackb(header()), key: 1}, use_bin_type=True)
    elif where == "body":
        raw = header(body={"request_id": 1, "batch_size": 2, **inner})
    elif where == "nested":
        raw = header(body={"request_id": 1, "batch_size": 2, "list": [0, inner]})
    else:
        raw = header(arrays=[["m", "uint8", [0]]], extra=inner)
    frames = [raw, b""] if where == "extra" else [raw]
    if type(key) is bytes and where in ("top", "extra"):
        parse_or_error(frames)  # inside an unknown top-level field: ignored (tolerant reader)
        return
    err = raises(HeaderError, frames)
    if type(key) is bytes:
        assert f"{key!r:.40}" in str(err)


@FUZZ
@given(ext_codes, ext_data, st.sampled_from(["body.x", "type", "seq", "ts", "v", "arrays", "extra"]))
def test_ext_types_are_rejected(code: int, data: bytes, where: str) -> None:
    raw = with_ext(where, code, data)
    frames = [raw, b""] if where == "arrays" else [raw]
    timestamp_ok = code == -1 and _is_timestamp(data)
    if not timestamp_ok:
        raises(HeaderError, frames, names="not a msgpack map" if code == -1 else f"ext type {code}")
    elif where == "extra":
        parse(frames)  # a valid Timestamp in an unknown top-level field is ignored
    else:
        err = parse_or_error(frames)
        assert err is not None and type(err) in (HeaderError, VersionError, ArrayError), err
        assert "Timestamp" in str(err)


def test_timestamp_ext_in_body_names_the_type() -> None:
    raw = with_ext("body.x", -1, b"\x00\x00\x00\x01")
    raises(HeaderError, [raw], names="Timestamp")


def test_every_message_type_is_fuzzed() -> None:
    assert set(KINDS) == set(MESSAGE_TYPES)
