"""Typed protocol errors, and the base of every error this project raises on purpose.

Every error names the offending value so that a log line alone says what was wrong.
Receivers catch `ProtocolError` (bad input from a peer), count it, log it, and keep
serving. The base class lives here because proto/ imports nothing of the project; the
other errors (configuration, timeouts, peers) are in common/errors.py.
"""

from __future__ import annotations


class SpreezeError(Exception):
    """Base class of every error this project raises on purpose."""


class ProtocolError(SpreezeError, ValueError):
    """A received message violates the wire protocol (proto/SPEC.md).

    `ref_type`, `ref_seq` and `sender` are what could be read of the bad message's header
    (its `type`, `seq` and `sender`; "" and -1 when unreadable): the `error` reply carries
    the first two (SPEC §4.13), logs and per-sender counters the third.
    """

    code = "protocol"
    ref_type: str = ""
    ref_seq: int = -1
    sender: str = ""


class FramingError(ProtocolError):
    """Wrong number of frames, or a frame of the wrong size."""

    code = "framing"


class LimitError(ProtocolError):
    """A configured hard limit (header size, frame count, total bytes, depth) was exceeded."""

    code = "limit"


class HeaderError(ProtocolError):
    """Frame 0 is not a valid msgpack header map."""

    code = "header"


class VersionError(ProtocolError):
    """The peer speaks a protocol major version we do not."""

    code = "version"


class UnknownTypeError(ProtocolError):
    """A well-formed message of a type this receiver does not know (tolerant reader: count, log, go on)."""

    code = "unknown_type"


class ArrayError(ProtocolError):
    """An array descriptor is invalid: disallowed dtype, bad shape, or size not matching its frame."""

    code = "array"


class SchemaError(ProtocolError):
    """A message body misses a required field or holds a value of the wrong type."""

    code = "schema"
