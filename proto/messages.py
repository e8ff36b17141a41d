"""Typed Python definitions of every message in proto/SPEC.md.

Each message is a frozen dataclass with a wire `TYPE`. Field kinds follow from the
annotation: `np.ndarray` fields travel as array frames named after the field,
`ArrayMap` fields as array frames named "<field>/<key>", everything else in the
header's `body` map. `to_frames` and `from_envelope` are the only conversions.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from spreeze.proto.codec import Encoder, Envelope
from spreeze.proto.errors import SchemaError, UnknownTypeError

SPEC_VERSION = "1.6"  # proto/SPEC.md document version; wire major version is codec.PROTOCOL_VERSION

ArrayMap = dict[str, np.ndarray]


class Message:
    """Base of all messages; subclasses are dataclasses registered by TYPE.

    Not frozen: construction sits on the hot path and frozen dataclasses cost a
    setattr call per field. Treat received messages as read-only all the same.
    """

    TYPE: ClassVar[str] = ""

    def check(self) -> None:
        """Cross-field checks run on every received message; raise SchemaError."""


@dataclass(frozen=True)
class TransitionLayout:
    """Columns of a transition matrix row: obs | action | reward | next_obs | done.

    One float32 matrix per batch means one frame, one copy into replay, one gather per
    sample and one host-to-device transfer per learner batch.
    """

    obs_dim: int
    act_dim: int

    @property
    def width(self) -> int:
        return 2 * self.obs_dim + self.act_dim + 2

    def columns(self, m: Any) -> dict[str, Any]:
        """Named column views (no copies) of an [n, width] matrix (numpy or torch)."""
        o, a = self.obs_dim, self.act_dim
        return {"obs": m[:, :o], "action": m[:, o:o + a], "reward": m[:, o + a],
                "next_obs": m[:, o + a + 1:2 * o + a + 1], "done": m[:, 2 * o + a + 1]}

    def pack(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
             next_obs: np.ndarray, done: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Write the five fields into rows of a float32 matrix (new or `out`)."""
        n = len(obs)
        m = np.empty((n, self.width), np.float32) if out is None else out
        cols = self.columns(m)
        cols["obs"][:] = obs
        cols["action"][:] = action
        cols["reward"][:] = reward
        cols["next_obs"][:] = next_obs
        cols["done"][:] = done
        return m


def _check_transitions(msg: Any) -> None:
    m = msg.transitions
    width = 2 * msg.obs_dim + msg.act_dim + 2
    if msg.obs_dim <= 0 or msg.act_dim <= 0:
        raise SchemaError(f"{msg.TYPE}: obs_dim={msg.obs_dim}, act_dim={msg.act_dim} must be > 0")
    if m.dtype != np.float32 or m.ndim != 2 or m.shape[1] != width:
        raise SchemaError(f"{msg.TYPE}.transitions has {m.dtype} shape {list(m.shape)}, expected "
                          f"float32 [n, {width}] for obs_dim={msg.obs_dim}, act_dim={msg.act_dim}")


@dataclass(slots=True)
class Experience(Message):
    """A batch of transitions, sampler -> replay (DEALER/ROUTER), one row per transition."""

    TYPE: ClassVar[str] = "experience"
    transitions: np.ndarray  # float32 [n, 2*obs_dim+act_dim+2], see TransitionLayout
    obs_dim: int
    act_dim: int
    env_steps: int  # env steps taken by this sender incarnation so far, this batch included
    actor_version: int = -1  # version of the actor that chose the actions (-1: random warm-up)
    episode_returns: list[float] = field(default_factory=list)  # episodes finished in this batch
    episode_lengths: list[int] = field(default_factory=list)
    batch: int = 0  # per-session batch number, 1, 2, ... (0: not numbered, never deduplicated)
    random_steps: int = -1  # rows whose actions were uniformly random (-1: all if actor_version == -1, else none)

    def check(self) -> None:
        _check_transitions(self)
        if self.batch < 0:
            raise SchemaError(f"experience.batch={self.batch} must be >= 0")
        n = len(self.transitions)
        if not -1 <= self.random_steps <= n:
            raise SchemaError(f"experience.random_steps={self.random_steps} must be in 0..{n} (rows of the batch)")
        done = self.transitions[:, -1]
        bad = np.flatnonzero((done != 0.0) & (done != 1.0))
        if len(bad):
            raise SchemaError(f"experience: done={float(done[bad[0]])!r} in row {int(bad[0])} must be 0.0 or 1.0 "
                              f"({len(bad)} rows)")

    @property
    def random_rows(self) -> int:
        """Rows acted uniformly at random (warm-up), `random_steps` or its default."""
        if self.random_steps >= 0:
            return self.random_steps
        return len(self.transitions) if self.actor_version == -1 else 0


ACK_STATUSES = frozenset({"stored", "duplicate", "rejected", "gap", "snapshot"})


@dataclass(slots=True)
class ExperienceAck(Message):
    """Replay -> sampler (ROUTER/DEALER): the fate of one Experience batch, and watermarks.

    `stored` and `durable` are per (sender, session): every batch numbered <= `stored` is
    in replay's memory (or was rejected), every batch <= `durable` is in a complete
    snapshot on disk. A sampler may forget a batch once it is durable.
    """

    TYPE: ClassVar[str] = "experience_ack"
    batch: int  # the batch answered (0 for a "snapshot" notice)
    status: str  # stored | duplicate | rejected | gap | snapshot
    stored: int  # highest batch of this session stored (or rejected), all lower ones too
    durable: int  # highest batch of this session in a complete snapshot
    warmup: int = 0  # random env steps this session may take in all (granted by replay, never decreases)

    def check(self) -> None:
        if self.status not in ACK_STATUSES:
            raise SchemaError(f"experience_ack.status={self.status!r:.40} is not one of {sorted(ACK_STATUSES)}")


@dataclass(slots=True)
class SampleRequest(Message):
    """Learner -> replay (DEALER/ROUTER): ask for one batch of `batch_size` transitions."""

    TYPE: ClassVar[str] = "sample_request"
    request_id: int
    batch_size: int
    obs_stats: bool = False  # also send the statistics of every observation stored (learner.obs_norm)

    def check(self) -> None:
        if self.batch_size <= 0:
            raise SchemaError(f"sample_request.batch_size={self.batch_size} must be > 0")


@dataclass(slots=True)
class SampledBatch(Message):
    """Replay -> learner (ROUTER/DEALER): the answer to one SampleRequest."""

    TYPE: ClassVar[str] = "sampled_batch"
    request_id: int
    transitions: np.ndarray  # float32 [batch_size, width], same layout as Experience
    obs_dim: int
    act_dim: int
    replay_size: int = 0  # transitions stored when sampled
    inserted: int = 0  # transitions ever inserted (env steps seen by replay)
    obs_count: int = 0  # observations the statistics are over (when the request asked for them)
    obs_stats: ArrayMap = field(default_factory=dict)  # "mean", "var": float32 [obs_dim] of every observation stored

    def check(self) -> None:
        _check_transitions(self)
        if self.obs_stats:
            for key in ("mean", "var"):
                arr = self.obs_stats.get(key)
                if arr is None or arr.shape != (self.obs_dim,) or arr.dtype != np.float32:
                    raise SchemaError(f"sampled_batch.obs_stats/{key} must be float32 [{self.obs_dim}], got "
                                      f"{None if arr is None else (arr.dtype.name, arr.shape)}")
            if self.obs_count < 0 or not np.all(self.obs_stats["var"] >= 0):
                raise SchemaError("sampled_batch.obs_stats: obs_count and var must be >= 0")


@dataclass(slots=True)
class Weights(Message):
    """Network weights with a version, learner -> subscribers (XPUB/SUB, last value cached).

    Dense tensors ride in `dense`; a sparse tensor of shape `shapes[k]` rides as flat
    C-order int32 indices `idx[k]` (ascending) and float32 values `val[k]`.
    """

    TYPE: ClassVar[str] = "weights"
    net: str  # "actor" | "actor_target" | "critic"
    version: int  # never decreases per (sender, net); Spreeze learners use their update count
    updates: int  # gradient updates done by the publishing learner
    dense: ArrayMap = field(default_factory=dict)
    idx: ArrayMap = field(default_factory=dict)
    val: ArrayMap = field(default_factory=dict)
    shapes: dict[str, list[int]] = field(default_factory=dict)
    extras: dict[str, float] = field(default_factory=dict)  # e.g. SAC's {"alpha": 0.2}
    policy: dict[str, Any] = field(default_factory=dict)  # net = actor: its acting-policy description (SPEC §4.4)

    def check(self) -> None:
        if set(self.idx) != set(self.shapes) or set(self.val) != set(self.shapes):
            raise SchemaError(f"weights {self.net}: sparse tensors {sorted(self.shapes)} need idx and val "
                              f"each (idx: {sorted(self.idx)}, val: {sorted(self.val)})")
        for name, shape in self.shapes.items():
            idx, val = self.idx[name], self.val[name]
            size = 1
            for d in shape:
                if type(d) is not int or d < 0:
                    raise SchemaError(f"weights {self.net}: shape of {name!r} is {shape!r:.60}")
                size *= d
            if idx.dtype != np.int32 or val.dtype != np.float32 or idx.shape != val.shape or idx.ndim != 1:
                raise SchemaError(f"weights {self.net}: {name!r} needs int32 idx and float32 val of one "
                                  f"length, got {idx.dtype}{list(idx.shape)} and {val.dtype}{list(val.shape)}")
            if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= size):
                raise SchemaError(f"weights {self.net}: {name!r} has indices outside its {size} elements")


@dataclass(slots=True)
class Metrics(Message):
    """Scalars from one service (PUB -> supervisor's XSUB/XPUB proxy -> SUB). May be dropped."""

    TYPE: ClassVar[str] = "metrics"
    service: str
    values: dict[str, Any]  # name -> int | float | str


@dataclass(slots=True)
class EvalResult(Message):
    """Evaluator -> metrics bus: deterministic evaluation of one actor version."""

    TYPE: ClassVar[str] = "eval_result"
    actor_version: int
    env_steps: int
    updates: int
    return_mean: float
    return_std: float
    length_mean: float
    episodes: int
    returns: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Event(Message):
    """Something that happened, with its reason: a restart, a tuning decision, a give-up."""

    TYPE: ClassVar[str] = "event"
    kind: str
    reason: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Register(Message):
    """Service -> supervisor (DEALER/ROUTER), first message of every incarnation."""

    TYPE: ClassVar[str] = "register"
    role: str  # sampler | replay | actor_learner | critic_learner | learner | evaluator | visualizer
    pid: int
    host: str
    service_id: str = ""  # requested id ("" = let the supervisor choose)
    remote: bool = False  # reached the supervisor over tcp://: wants tcp endpoints in the Welcome


@dataclass(slots=True)
class Welcome(Message):
    """Supervisor -> service: the answer to Register."""

    TYPE: ClassVar[str] = "welcome"
    service_id: str
    endpoints: dict[str, str]
    config: dict[str, Any]
    heartbeat_interval: float  # seconds between heartbeats the supervisor expects
    tcp: dict[str, str] = field(default_factory=dict)  # socket name -> tcp endpoint its binder also binds


@dataclass(slots=True)
class Heartbeat(Message):
    """Service -> supervisor, sent from the service's own event loop."""

    TYPE: ClassVar[str] = "heartbeat"
    service_id: str
    state: str  # "running" | "paused" | "stopped" (the last one, sent on a clean exit)
    counters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Control(Message):
    """Supervisor -> service: set | pause | resume | shutdown | ping."""

    TYPE: ClassVar[str] = "control"
    command: str
    request_id: int
    key: str = ""
    value: Any = None


@dataclass(slots=True)
class ControlReply(Message):
    """Service -> supervisor: the outcome of one Control."""

    TYPE: ClassVar[str] = "control_reply"
    request_id: int
    ok: bool
    detail: str = ""


@dataclass(slots=True)
class Error(Message):
    """Sent back on request/reply sockets when a request is refused."""

    TYPE: ClassVar[str] = "error"
    code: str  # the ProtocolError code or an application code
    detail: str
    ref_type: str = ""
    ref_seq: int = -1


UNREGISTERED = "unregistered"  # error code: a heartbeat from an id a (restarted) supervisor does not know
FINISHED = "finished"  # error code: a registration after the run ended (the registrant exits 0)

CONTROL_COMMANDS = frozenset({"set", "pause", "resume", "shutdown", "ping"})

# ---------------------------------------------------------------- conversions

_PY_TYPES: dict[Any, frozenset[type]] = {
    int: frozenset({int}), float: frozenset({int, float}), str: frozenset({str}),
    bool: frozenset({bool}), list: frozenset({list}), dict: frozenset({dict}),
}


@dataclass(frozen=True)
class _Schema:
    """Per-class field split, computed once: which fields are arrays, maps, body values."""

    arrays: tuple[tuple[str, bool], ...]  # (name, required)
    maps: tuple[str, ...]
    body: tuple[tuple[str, frozenset[type] | None, bool], ...]  # (name, accepted types | any, required)
    body_names: tuple[str, ...]
    omit_empty: frozenset[str]  # optional list/dict fields left out of the header when empty


def _schema(cls: type) -> _Schema:
    hints = typing.get_type_hints(cls)
    arrays, maps, body, omit = [], [], [], []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if hint is np.ndarray:
            arrays.append((f.name, required))
        elif hint == ArrayMap:
            maps.append(f.name)
        else:
            body.append((f.name, _PY_TYPES.get(typing.get_origin(hint) or hint), required))
            if f.default_factory in (list, dict):
                omit.append(f.name)
    return _Schema(tuple(arrays), tuple(maps), tuple(body), tuple(b[0] for b in body), frozenset(omit))


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (Experience, ExperienceAck, SampleRequest, SampledBatch, Weights, Metrics, EvalResult,
                              Event, Register, Welcome, Heartbeat, Control, ControlReply, Error)
}
_SCHEMAS: dict[type, _Schema] = {cls: _schema(cls) for cls in MESSAGE_TYPES.values()}


def to_frames(msg: Message, encoder: Encoder) -> list[Any]:
    """Encode a message into multipart frames (arrays not copied)."""
    schema = _SCHEMAS[type(msg)]
    omit = schema.omit_empty
    body = {}
    for name in schema.body_names:
        value = getattr(msg, name)
        if value or name not in omit:
            body[name] = value
    arrays = {name: getattr(msg, name) for name, _ in schema.arrays}
    for name in schema.maps:
        for key, arr in getattr(msg, name).items():
            arrays[f"{name}/{key}"] = arr
    return encoder.encode(msg.TYPE, body, arrays)


def from_envelope(env: Envelope) -> Message:
    """Check a decoded envelope against its message schema and build the typed message."""
    cls = MESSAGE_TYPES.get(env.type)
    if cls is None:
        raise UnknownTypeError(f"unknown message type {env.type!r:.60} from {env.sender!r:.60}")
    schema = _SCHEMAS[cls]
    kwargs: dict[str, Any] = {}
    body = env.body
    for name, accepts, required in schema.body:
        value = body.get(name)
        if value is None:
            if required:
                raise SchemaError(f"{env.type}: required field {name!r} is missing")
        elif accepts is None or type(value) in accepts:
            kwargs[name] = value
        else:
            raise SchemaError(f"{env.type}.{name}={value!r:.60} is a {type(value).__name__}, "
                              f"expected {'/'.join(sorted(t.__name__ for t in accepts))}")
    arrays = env.arrays
    for name, required in schema.arrays:
        value = arrays.get(name)
        if value is not None:
            kwargs[name] = value
        elif required:
            raise SchemaError(f"{env.type}: required array {name!r} is missing")
    if schema.maps:
        kwargs.update(_collect_maps(arrays, schema.maps))
    msg = cls(**kwargs)
    msg.check()
    return msg


def _collect_maps(arrays: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, ArrayMap]:
    maps: dict[str, ArrayMap] = {name: {} for name in names}
    for full, arr in arrays.items():
        prefix, sep, key = full.partition("/")
        if sep and prefix in maps:
            maps[prefix][key] = arr
    return maps
