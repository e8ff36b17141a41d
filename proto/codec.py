"""The wire codec: msgpack header frame + raw little-endian array frames (proto/SPEC.md §2).

Encoding never copies a C-contiguous little-endian array: its buffer becomes a frame.
Decoding returns numpy views over the received frames, never copies.
Every violation raises a `ProtocolError` subclass that names the bad value.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from spreeze.proto.errors import ArrayError, FramingError, HeaderError, LimitError, ProtocolError, VersionError

PROTOCOL_VERSION = 1  # major version; bumped only on incompatible changes (proto/SPEC.md)

# Wire dtype names (language neutral) -> little-endian numpy dtypes.
WIRE_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(code).newbyteorder("<")
    for name, code in {
        "bool": "b1", "int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2",
        "int32": "i4", "uint32": "u4", "int64": "i8", "uint64": "u8",
        "float16": "f2", "float32": "f4", "float64": "f8",
    }.items()
}
_NAME_OF_DTYPE: dict[np.dtype, str] = {dt: name for name, dt in WIRE_DTYPES.items()}
_SCALARS = (str, int, float, bool, bytes, type(None))
_DESC_CACHE_MAX = 256  # distinct (name, dtype, shape) descriptors an Encoder keeps


@dataclass(frozen=True)
class Limits:
    """Hard limits a receiver enforces before trusting anything in a message."""

    max_header_bytes: int = 64 * 1024  # a header is a few hundred bytes; 64 KiB leaves room for configs
    max_frames: int = 1024  # 1 header + up to 1023 arrays (sparse weights carry 3 arrays per layer)
    max_total_bytes: int = 1 << 30  # 1 GiB: a 4M-transition batch of HalfCheetah is 0.7 GiB
    max_depth: int = 16  # nesting of maps/lists inside the header body
    max_ndim: int = 8  # array rank
    dtypes: frozenset[str] = field(default_factory=lambda: frozenset(WIRE_DTYPES))

    def __post_init__(self) -> None:
        unknown = set(self.dtypes) - set(WIRE_DTYPES)
        if unknown:
            raise ValueError(f"Limits.dtypes has unknown wire dtypes {sorted(unknown)}")
        object.__setattr__(self, "allowed", {n: WIRE_DTYPES[n] for n in self.dtypes})


DEFAULT_LIMITS = Limits()


@dataclass(slots=True)
class Envelope:
    """A decoded message before its body is checked against a message schema."""

    type: str
    sender: str
    session: str
    seq: int
    ts: float
    body: dict[str, Any]
    arrays: dict[str, np.ndarray]


def new_session_id() -> str:
    """A random id for one incarnation of a process (restarts get a new one)."""
    return os.urandom(8).hex()


def _reject_ext(code: int, data: bytes) -> Any:
    raise HeaderError(f"msgpack ext type {code} is not allowed in headers")


def _builtin(obj: Any) -> Any:
    """numpy scalars in a body (np.float32(x), arr.sum()) travel as Python scalars."""
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode a {type(obj).__name__} in a header body: {obj!r:.60}")


class Encoder:
    """Builds frames for one sender; owns the sender's sequence counter."""

    def __init__(self, sender: str, session: str | None = None) -> None:
        self.sender = sender
        self.session = session or new_session_id()
        self.seq = 0
        self._packer = msgpack.Packer(use_bin_type=True, default=_builtin)
        self._descs: dict[tuple[str, np.dtype, tuple[int, ...]], list[Any]] = {}

    def encode(
        self, msg_type: str, body: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None
    ) -> list[Any]:
        """Frames for one message: [header, buf1, ..., bufN]. Arrays are not copied when
        already C-contiguous little-endian with a wire dtype."""
        descs: list[list[Any]] = []
        frames: list[Any] = [b""]
        if arrays:
            for name, arr in arrays.items():
                arr = _wire_array(name, arr)
                key = (name, arr.dtype, arr.shape)
                desc = self._descs.get(key)
                if desc is None:
                    if len(self._descs) >= _DESC_CACHE_MAX:
                        self._descs.clear()  # shapes that vary per message must not leak memory
                    desc = self._descs[key] = [name, _NAME_OF_DTYPE[arr.dtype], list(arr.shape)]
                descs.append(desc)
                frames.append(arr)
        self.seq += 1
        frames[0] = self._packer.pack({
            "v": PROTOCOL_VERSION, "type": msg_type, "sender": self.sender,
            "session": self.session, "seq": self.seq, "ts": time.time(),
            "arrays": descs, "body": body,
        })
        return frames


def _wire_array(name: str, arr: np.ndarray) -> np.ndarray:
    if type(arr) is not np.ndarray:
        raise ArrayError(f"array {name!r} is a {type(arr).__name__}, not a numpy array")
    if not arr.flags.c_contiguous or arr.dtype.byteorder == ">":
        arr = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    if arr.dtype not in _NAME_OF_DTYPE:
        raise ArrayError(f"array {name!r} has dtype {arr.dtype}, not a wire dtype")
    return arr


def decode(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Envelope:
    """Parse and check a received multipart message (bytes or zmq.Frame objects)."""
    n = len(frames)
    if n == 0:
        raise FramingError("empty multipart message: no header frame")
    if n > limits.max_frames:
        raise LimitError(f"{n} frames exceed max_frames={limits.max_frames}")
    head = _unpack_header(frames[0], limits)
    try:
        return _envelope(head, frames, limits)
    except ProtocolError as exc:
        raise _annotated(exc, head) from None


def _annotated(exc: ProtocolError, head: dict[str, Any]) -> ProtocolError:
    """`exc` with what the header says of the bad message (type, seq, sender), where readable."""
    if type(head.get("type")) is str:
        exc.ref_type = head["type"][:64]
    if type(head.get("seq")) is int:
        exc.ref_seq = head["seq"]
    if type(head.get("sender")) is str:
        exc.sender = head["sender"][:128]
    return exc


def _envelope(head: dict[str, Any], frames: Sequence[Any], limits: Limits) -> Envelope:
    n = len(frames)
    descs = head["arrays"]
    if len(descs) != n - 1:
        raise FramingError(f"header describes {len(descs)} arrays but {n - 1} array frames arrived")
    arrays: dict[str, np.ndarray] = {}
    total = 0
    for desc, frame in zip(descs, frames[1:]):
        arr = _array_view(desc, frame, limits)
        total += arr.nbytes
        if total > limits.max_total_bytes:
            raise LimitError(f"arrays total {total} bytes > max_total_bytes={limits.max_total_bytes}")
        arrays[desc[0]] = arr
    if len(arrays) != n - 1:
        raise ArrayError(f"array names {[d[0] for d in descs]!r:.120} are not unique")
    return Envelope(head["type"], head["sender"], head["session"], head["seq"], head["ts"],
                    head["body"], arrays)


def _unpack_header(frame: Any, limits: Limits) -> dict[str, Any]:
    size = len(frame)
    if size > limits.max_header_bytes:
        raise LimitError(f"header of {size} bytes > max_header_bytes={limits.max_header_bytes}")
    try:
        head = msgpack.unpackb(
            frame, raw=False, strict_map_key=True, ext_hook=_reject_ext, use_list=True,
        )
    except HeaderError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise HeaderError(f"frame 0 is not a msgpack map: {type(exc).__name__}: {exc}") from None
    if not isinstance(head, dict):
        raise HeaderError(f"header is a msgpack {type(head).__name__}, not a map")
    try:
        _check_header(head, limits)
    except ProtocolError as exc:
        raise _annotated(exc, head) from None
    return head


def _check_header(head: dict[str, Any], limits: Limits) -> None:
    version = head.get("v")
    if version != PROTOCOL_VERSION or type(version) is not int:  # 1.0 and True are not 1
        raise VersionError(f"protocol version {version!r:.40} != supported {PROTOCOL_VERSION}")
    if (type(head.get("type")) is not str or type(head.get("sender")) is not str
            or type(head.get("session")) is not str or type(head.get("seq")) is not int
            or type(head.get("ts")) not in _NUMBER or type(head.get("arrays")) is not list
            or type(head.get("body")) is not dict):
        _check_types(head)  # the slow path names the bad field
    _check_tree(head["body"], limits.max_depth)


_HEADER_TYPES: tuple[tuple[str, frozenset[type]], ...] = (
    ("type", frozenset({str})), ("sender", frozenset({str})), ("session", frozenset({str})),
    ("seq", frozenset({int})), ("ts", frozenset({int, float})), ("arrays", frozenset({list})),
    ("body", frozenset({dict})),
)
_SCALAR_TYPES = frozenset(_SCALARS)
_NUMBER = frozenset({int, float})


def _check_types(head: dict[str, Any]) -> None:
    for key, kinds in _HEADER_TYPES:
        value = head.get(key)
        if type(value) not in kinds:
            raise HeaderError(f"header field {key!r}={value!r:.80} has the wrong type or is missing")


def _check_tree(node: Any, depth: int) -> None:
    """Only str map keys, only msgpack's plain types, bounded nesting."""
    if depth <= 0:
        raise LimitError("header body nests deeper than max_depth")
    if type(node) is dict:
        for key, value in node.items():
            if type(key) is not str:
                raise HeaderError(f"map key {key!r:.40} is not a string")
            if type(value) not in _SCALAR_TYPES:
                _check_tree(value, depth - 1)
    elif type(node) is list:
        for value in node:
            if type(value) not in _SCALAR_TYPES:
                _check_tree(value, depth - 1)
    else:
        raise HeaderError(f"value of type {type(node).__name__} is not allowed in a header")


def _array_view(desc: Any, frame: Any, limits: Limits) -> np.ndarray:
    if type(desc) is not list or len(desc) != 3:
        raise ArrayError(f"array descriptor {desc!r:.80} is not [name, dtype, shape]")
    name, dtype_name, shape = desc
    dtype = limits.allowed.get(dtype_name) if type(dtype_name) is str else None  # type: ignore[attr-defined]
    if dtype is None or type(name) is not str:
        raise ArrayError(f"array {name!r:.60}: dtype {dtype_name!r:.40} is not allowed")
    if type(shape) is not list or len(shape) > limits.max_ndim:
        raise ArrayError(f"array {name!r}: shape {shape!r:.80} is not a list of at most "
                         f"{limits.max_ndim} ints")
    nbytes = dtype.itemsize
    for d in shape:
        if type(d) is not int or d < 0:
            raise ArrayError(f"array {name!r}: shape {shape!r:.80} has a bad dimension {d!r:.20}")
        nbytes *= d
    if nbytes != len(frame):
        raise ArrayError(f"array {name!r}: shape {shape} x {dtype_name} needs "
                         f"{nbytes} bytes, frame has {len(frame)}")
    try:
        return np.ndarray(shape, dtype, frame)  # a view: writable when the frame's buffer is
    except ValueError as exc:  # a zero-size array whose other dims overflow numpy's size
        raise ArrayError(f"array {name!r}: shape {shape!r:.80} is not a valid numpy shape: {exc}") from None
