"""Typed errors of the shared layer (protocol errors and the base class: proto/errors.py).

Every error names the offending value so that a log line alone says what was wrong.
`ConfigError` is raised at start-up before anything runs.
"""

from __future__ import annotations

from spreeze.proto.errors import SpreezeError


class ConfigError(SpreezeError, ValueError):
    """A configuration value is invalid; the message names the key and the value."""


class TransportTimeout(SpreezeError, TimeoutError):
    """A blocking wait on a socket ran past its timeout."""


class PeerError(SpreezeError):
    """A peer answered with an Error message, or is dead."""


class VideoError(SpreezeError):
    """An evaluation video cannot be rendered or written; the message says why and how to enable it."""
