"""asyncio ZeroMQ helpers for the socket roles of proto/SPEC.md §3.

A `Channel` is one socket plus the codec: it sends typed messages and receives typed
messages, counting and logging bad input instead of dying on it. Socket options are set
per role, deliberately (see ROLES). Hot paths drain every queued message per wake-up
(`recv_many`), so the asyncio cost is paid once per burst rather than once per message.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from spreeze.proto.codec import DEFAULT_LIMITS, Encoder, Envelope, Limits, decode
from spreeze.common.errors import ConfigError, TransportTimeout
from spreeze.proto.errors import ProtocolError
from spreeze.common.curve_auth import CurveKeys
from spreeze.proto.messages import Error, Message, from_envelope, to_frames

log = logging.getLogger(__name__)

IPC_PATH_MAX = 107  # sun_path is 108 bytes on Linux, one for the NUL
# How long an awaited send to a ROUTER peer waits for room in that peer's queue before
# dropping the message (the peer is alive but not reading: a stuck or flooding client).
ROUTED_SEND_PATIENCE_S = 2.0

# Seconds this process spent in transport: encoding, decoding and the socket calls
# themselves, not the time spent waiting for a peer or a high-water mark. Services report
# it with their metrics (`transport_s`), so `spreeze bench e2e` can show its share.
_busy_s = 0.0


def transport_seconds() -> float:
    return _busy_s


def _account(since: float) -> None:
    global _busy_s
    _busy_s += time.perf_counter() - since


@dataclass(frozen=True)
class Role:
    """How one end of one socket role is configured."""

    kind: int  # zmq socket type
    bind: bool  # True: this end binds (the stable, well-known end)
    hwm: int  # send and receive high-water mark, in messages
    linger_ms: int  # how long close() may wait to flush queued messages


# name -> (role of the binding end, role of the connecting end). Rationale per line.
ROLES: dict[str, tuple[Role, Role]] = {
    # Experience is acknowledged (DEALER -> ROUTER, acks back): a sampler keeps at most
    # sampler.ack_window unacknowledged batches in flight (credit flow control, which keeps
    # queued data fresh) and re-sends after a replay restart. The HWM only has to hold a
    # window plus one re-sent window (config's MAX_ACK_WINDOW is half of it).
    "experience": (Role(zmq.ROUTER, True, 16, 0), Role(zmq.DEALER, False, 16, 2000)),
    # Request/reply: learners keep a few requests in flight (prefetch); 16 is plenty.
    "sample": (Role(zmq.ROUTER, True, 16, 0), Role(zmq.DEALER, False, 16, 0)),
    # Weights: only the newest matters, so tiny HWMs let stale versions drop at the PUB.
    "weights": (Role(zmq.XPUB, True, 4, 0), Role(zmq.SUB, False, 4, 0)),
    # Metrics may be dropped under load; 1000 messages is minutes of metrics.
    "metrics_in": (Role(zmq.XSUB, True, 1000, 0), Role(zmq.PUB, False, 1000, 0)),
    "metrics_out": (Role(zmq.XPUB, True, 1000, 0), Role(zmq.SUB, False, 1000, 0)),
    # Control: small messages, must not be lost while the peer lives; 1 s to flush a shutdown.
    "control": (Role(zmq.ROUTER, True, 1000, 1000), Role(zmq.DEALER, False, 1000, 1000)),
    # Health: one ping, one reply (`spreeze health`); nothing worth keeping after a close.
    "health": (Role(zmq.ROUTER, True, 16, 0), Role(zmq.DEALER, False, 16, 0)),
}


class _PeerGone(Exception):
    """No peer with this routing id is connected to the ROUTER (internal to Channel)."""


def make_ipc_dir(prefix: str = "spz-") -> str:
    """A private (0700) short directory for a run's ipc:// sockets."""
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    os.chmod(path, 0o700)
    return path


def ipc_endpoint(directory: str, name: str) -> str:
    return check_endpoint(f"ipc://{directory}/{name}")


def check_endpoint(endpoint: str) -> str:
    if not (endpoint.startswith("ipc://") or endpoint.startswith("tcp://")
            or endpoint.startswith("inproc://")):
        raise ConfigError(f"endpoint {endpoint!r} must start with ipc://, tcp:// or inproc://")
    if endpoint.startswith("ipc://") and len(endpoint) - len("ipc://") > IPC_PATH_MAX:
        raise ConfigError(f"ipc path {endpoint!r} is longer than {IPC_PATH_MAX} bytes; "
                          "use a shorter socket directory")
    return endpoint


def tcp_host(endpoint: str) -> str:
    """'tcp://HOST:PORT' -> HOST (brackets of an IPv6 address kept)."""
    return endpoint[len("tcp://"):].rpartition(":")[0]


def tcp_port(endpoint: str) -> int:
    """'tcp://HOST:PORT' -> PORT, or ConfigError naming the endpoint."""
    host, _, port = endpoint[len("tcp://"):].rpartition(":") if endpoint.startswith("tcp://") else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"endpoint {endpoint!r} must be tcp://HOST:PORT with a port in 1..65535")
    return int(port)


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel takes outgoing connections' source ports from (Linux; its default elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:  # closed at once: no leaked handle
            low, high = f.read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def in_use_hint(endpoint: str) -> str:
    """Why a tcp port may be taken when nothing else listens on it: peers reconnecting to a local
    port in the ephemeral range can be given that port as their source and connect to themselves."""
    low, high = ephemeral_ports()
    try:
        port = tcp_port(endpoint)
    except ConfigError:
        return ""
    if not low <= port <= high:
        return ""
    return (f" (port {port} is in this machine's ephemeral range {low}-{high}, which outgoing "
            f"connections take their source ports from: use ports below {low})")


def bind_address(endpoint: str) -> str:
    """Where a binder binds `endpoint`: a tcp:// endpoint named by a host name (a Swarm or compose
    service name, as announced to its peers) binds that port on every interface of the
    binder's own container; IP addresses, `*`, ipc:// and inproc:// bind as given."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host = tcp_host(endpoint).strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host not in ("*", "localhost"):
            return f"tcp://*:{tcp_port(endpoint)}"
    return endpoint


class Channel:
    """One ZeroMQ socket speaking the protocol.

    `also` lists further endpoints the same socket binds (or connects): a binding service
    serves local peers on ipc:// and remote ones on tcp:// with one socket. CURVE keys,
    when given, secure the socket on every endpoint (ZeroMQ's security is per socket).
    """

    def __init__(self, ctx: zmq.asyncio.Context, role: str, endpoint: str, *, binding: bool,
                 encoder: Encoder, identity: str | None = None, limits: Limits = DEFAULT_LIMITS,
                 curve: CurveKeys | None = None, hwm: int | None = None, also: tuple[str, ...] = ()) -> None:
        spec = ROLES[role][0 if binding else 1]
        self.role, self.endpoint, self.encoder, self.limits = role, check_endpoint(endpoint), encoder, limits
        self.endpoints = (self.endpoint, *(check_endpoint(e) for e in also))
        self.is_router = spec.kind == zmq.ROUTER
        self.errors: Counter[str] = Counter()  # bad messages received, by error code
        self.sender_errors: Counter[tuple[str, str]] = Counter()  # by (header sender or "?", code)
        # called for a message whose header decoded but whose body was refused (after the
        # `error` reply): replay answers an experience batch there too, with a `rejected` ack
        self.on_refused: Callable[[bytes | None, Envelope, ProtocolError], None] | None = None
        # header of the last valid message parsed (sender id, session, sequence number)
        self.last_sender, self.last_session, self.last_seq = "", "", -1
        self.sock = ctx.socket(spec.kind)
        # a sync twin of the same socket, for non-blocking calls (asyncio sockets return futures)
        self.now: zmq.Socket[bytes] = zmq.Socket.shadow(self.sock.underlying)
        self.sock.setsockopt(zmq.SNDHWM, spec.hwm if hwm is None else hwm)
        self.sock.setsockopt(zmq.RCVHWM, spec.hwm if hwm is None else hwm)
        # libzmq refuses (and disconnects) peers sending frames over the codec's byte limit
        self.sock.setsockopt(zmq.MAXMSGSIZE, limits.max_total_bytes + limits.max_header_bytes)
        self.sock.setsockopt(zmq.LINGER, spec.linger_ms)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity.encode())
        if spec.kind == zmq.XPUB:
            self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every (re)join is seen: last-value cache
        if spec.kind == zmq.ROUTER:
            self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted peer takes over its identity
            # Without this a ROUTER silently drops a message whenever its pipe to the peer looks
            # full, and under CPU load libzmq (4.3) does that with one message in flight: a lost
            # sample reply stalled a learner for good. With it, a full pipe is EAGAIN (send waits,
            # send_nowait says False) and a gone peer EHOSTUNREACH (the message is dropped).
            self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if spec.kind == zmq.SUB:
            self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        if curve is not None:
            curve.apply(self.sock, server=binding)
        for each in self.endpoints:
            try:
                self.sock.bind(bind_address(each)) if binding else self.sock.connect(each)
            except zmq.ZMQError as exc:
                self.sock.close(linger=0)
                hint = in_use_hint(each) if exc.errno == zmq.EADDRINUSE else ""
                raise ConfigError(f"cannot {'bind' if binding else 'connect'} {role} socket to "
                                  f"{each!r}: {exc}{hint}") from None

    @property
    def tcp_endpoints(self) -> str:
        """The tcp:// endpoints of this socket, comma separated (where remote peers reach it)."""
        return ", ".join(e for e in self.endpoints if e.startswith("tcp://"))

    # ------------------------------------------------------------------ sending
    async def send(self, msg: Message, to: bytes | None = None) -> bool:
        """Send, waiting while the socket (or a ROUTER's pipe to peer `to`) is full.

        False when a ROUTER dropped it: the peer is gone, or stayed full for
        ROUTED_SEND_PATIENCE_S (then a warning is logged)."""
        t0 = time.perf_counter()
        frames = to_frames(msg, self.encoder)
        if to is None:
            sent = self.sock.send_multipart(frames, copy=False)  # sends now unless it would block
            _account(t0)
            await sent
            return True
        frames.insert(0, to)
        _account(t0)
        deadline, pause = time.monotonic() + ROUTED_SEND_PATIENCE_S, 0.0005
        while True:
            t0 = time.perf_counter()
            try:
                if self._send_routed(frames):
                    return True
            except _PeerGone:
                return False
            finally:
                _account(t0)  # the socket call, not the wait for room
            if time.monotonic() >= deadline:
                log.warning("%s: dropped a %s for routing id %r: its queue stayed full for %.1fs",
                            self.role, msg.TYPE, to, ROUTED_SEND_PATIENCE_S)
                return False
            await asyncio.sleep(pause)  # the peer's pipe frees up as its I/O thread drains it
            pause = min(2 * pause, 0.05)

    def send_nowait(self, msg: Message, to: bytes | None = None) -> bool:
        """Send unless the socket would block; False when it would (PUB drops instead) or
        when a ROUTER's peer `to` is gone."""
        t0 = time.perf_counter()
        frames = to_frames(msg, self.encoder)
        try:
            if to is not None:
                return self._send_routed([to, *frames])
            self.now.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            return True
        except (zmq.Again, _PeerGone):
            return False
        finally:
            _account(t0)

    def _send_routed(self, frames: list[Any]) -> bool:
        """One non-blocking ROUTER send: True if queued, False if the peer's pipe is full;
        raises _PeerGone when no peer has that routing id."""
        try:
            self.now.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise _PeerGone(frames[0]) from None
            raise

    # ---------------------------------------------------------------- receiving
    async def recv(self, timeout: float | None = None) -> tuple[bytes | None, Message]:
        """Next valid message (sender identity on ROUTER sockets, else None).

        With a timeout, the message is taken without blocking once poll says one is there:
        another coroutine reading the same socket may take it first, and an unbounded
        receive would then outlive the timeout.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if deadline is None:
                t0 = time.perf_counter()
                received = self.sock.recv_multipart(copy=False)  # done now if a message is queued
                _account(t0)
                frames = await received
            else:
                left = deadline - time.monotonic()
                if left <= 0 or not await self.sock.poll(max(int(left * 1000), 1), zmq.POLLIN):
                    raise TransportTimeout(f"no message on {self.role} {self.endpoint} within {timeout}s")
                t0 = time.perf_counter()
                try:
                    frames = self.now.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    continue  # another reader took it
                finally:
                    _account(t0)
            got = self.parse(frames)
            if got is not None:
                return got

    async def recv_many(self, max_n: int, timeout: float | None = None) -> list[tuple[bytes | None, Message]]:
        """Wait for at least one message, then take every queued one up to max_n."""
        out = [await self.recv(timeout)]
        while len(out) < max_n:
            try:
                got = self.recv_nowait()
            except zmq.Again:
                break
            if got is not None:
                out.append(got)
        return out

    def has_input(self) -> bool:
        """Whether a message is queued for this socket (nothing is read)."""
        return bool(int(self.now.getsockopt(zmq.EVENTS)) & zmq.POLLIN)

    def recv_nowait(self) -> tuple[bytes | None, Message] | None:
        """One queued message; None if it was bad (counted); raises zmq.Again if none is queued."""
        t0 = time.perf_counter()
        try:
            frames = self.now.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        finally:
            _account(t0)
        return self.parse(frames)

    def parse(self, frames: list[Any]) -> tuple[bytes | None, Message] | None:
        t0 = time.perf_counter()
        try:
            return self._parse(frames)
        finally:
            _account(t0)

    def _parse(self, frames: list[Any]) -> tuple[bytes | None, Message] | None:
        peer = None
        if self.is_router:
            peer = frames[0].bytes
            frames = frames[1:]
        elif self.sock.type == zmq.XPUB:  # subscription frames are handled by the owner
            return None
        env = None
        try:
            env = decode(frames, self.limits)
            self.last_sender, self.last_session, self.last_seq = env.sender, env.session, env.seq
            return peer, from_envelope(env)
        except ProtocolError as exc:
            if env is not None:  # the header was fine, the body was not
                exc.ref_type, exc.ref_seq, exc.sender = env.type, env.seq, env.sender
            self.count_error(exc.code, exc.sender, str(exc), peer)
            if peer is not None:
                self.reply_error(peer, Error(exc.code, str(exc)[:500], exc.ref_type, exc.ref_seq))
            if env is not None and self.on_refused is not None:
                self.on_refused(peer, env, exc)
            return None

    def count_error(self, code: str, sender: str, detail: str, peer: bytes | None = None) -> None:
        """Count a refused message by code and by sender (its header's, when readable), and log it."""
        self.errors[code] += 1
        self.sender_errors[(sender or "?", code)] += 1
        who = f" from {sender!r}" if sender else f" from routing id {peer!r}" if peer else ""
        log.warning("%s: refused a message%s (%s): %s", self.role, who, code, detail)

    def error_metrics(self) -> dict[str, int]:
        """`errors/<code>` and `errors/<sender>/<code>`: refused messages so far (SPEC §5)."""
        out = {f"errors/{code}": n for code, n in self.errors.items()}
        out.update({f"errors/{sender}/{code}": n for (sender, code), n in self.sender_errors.items()})
        return out

    def reply_error(self, peer: bytes, err: Error) -> None:
        """Send an `error` to a ROUTER peer without blocking (a gone or slow peer: dropped)."""
        try:
            self.now.send_multipart([peer, *to_frames(err, self.encoder)], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the peer is gone or slow; the error is counted and logged already

    # ---------------------------------------------------------- reconnections
    def watch_connects(self) -> None:
        """Start watching this (connecting) socket's connections with a ZeroMQ socket monitor."""
        self._disconnected = False
        events = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
        self._monitor: zmq.Socket[bytes] = zmq.Socket.shadow(self.sock.get_monitor_socket(events).underlying)

    def reconnected(self) -> bool:
        """Whether a connection was made after a disconnection since the last call: the peer
        restarted, and what was queued to or held by its old incarnation is gone. (A monitor
        attached after the first connection never sees it: only connect-after-disconnect counts.)"""
        again = False
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(flags=zmq.NOBLOCK))["event"]
            except zmq.Again:
                return again
            if event == zmq.EVENT_DISCONNECTED:
                self._disconnected = True
            elif event == zmq.EVENT_CONNECTED and self._disconnected:
                self._disconnected, again = False, True

    def close(self) -> None:
        self.sock.close()
