"""Typed errors of the shared layer (protocol errors and the base class: proto/errors.py).

Every error names the offending value so that a log line alone says what was wrong.
`ConfigError` is raised at start-up before anything runs.
"""

from __future__ import annotations

from spreeze.proto.errors import SpreezeError


class ConfigError(SpreezeError, ValueError):
    """A configuration value is invalid; the message names the key and the value."""


class EnvArgumentError(ConfigError):
    """An environment refused a keyword argument of gymnasium.make (env_kwargs, or a
    renderer's frame size that a classic-control env does not take)."""


class TransportTimeout(SpreezeError, TimeoutError):
    """A blocking wait on a socket ran past its timeout."""


class PeerError(SpreezeError):
    """A peer answered with an Error message, or is dead."""


class RunFinished(SpreezeError):
    """The supervisor answered a registration: the run has finished (nothing to do: exit 0)."""


class VideoError(SpreezeError):
    """An evaluation video cannot be rendered or written; the message says why and how to enable it."""


class PolicyError(SpreezeError, ValueError):
    """An acting-policy description (proto/SPEC.md §4.4) cannot be run; the message names the op and field."""


class PolicyFormatError(PolicyError):
    """The description itself is malformed: an unknown op, a missing or mistyped field, a bad order."""


class PolicyParamError(PolicyError):
    """An op names a parameter that the weights do not carry."""


class PolicyShapeError(PolicyError):
    """A parameter's shape does not fit the op that uses it (or the weights it replaces)."""


class PolicyExportError(PolicyError):
    """A torch module cannot be described as an acting policy; the message names its path and type."""


class CheckpointError(SpreezeError, ValueError):
    """A checkpoint file (and the one kept before it) cannot be read back whole: truncated, or
    its bytes differ from what was written; the message names each file and what is wrong."""
