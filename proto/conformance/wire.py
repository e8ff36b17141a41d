"""Sockets for the kit: blocking pyzmq with the codec and message types of proto/ only."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import zmq

from spreeze.proto.codec import Encoder, Envelope, decode
from spreeze.proto.errors import ProtocolError
from spreeze.proto.messages import Message, from_envelope, to_frames

TCP_PORTS = {"control": 0, "metrics_in": 1, "experience": 2, "actor_weights": 3, "sample": 4}  # PORT + offset


def endpoints_beside(endpoint: str) -> dict[str, str]:
    """Endpoints of the sockets a kit needs: tcp ports after ENDPOINT's, or ipc paths beside it."""
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://"):].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) <= 65535 - max(TCP_PORTS.values()):
            raise ValueError(f"endpoint {endpoint!r} must be tcp://HOST:PORT with room for PORT+4")
        return {name: f"tcp://{host}:{int(port) + off}" for name, off in TCP_PORTS.items()}
    if endpoint.startswith("ipc://"):
        where = os.path.dirname(endpoint[len("ipc://"):]) or "."
        return {name: endpoint if name == "control" else f"ipc://{where}/{name}" for name in TCP_PORTS}
    raise ValueError(f"endpoint {endpoint!r} must be ipc://PATH or tcp://HOST:PORT")


@dataclass
class Got:
    """One received message: valid (`msg`) or refused by the codec (`error`, `env` if decoded)."""

    peer: bytes | None
    msg: Message | None
    error: ProtocolError | None = None
    env: Envelope | None = None


class Sock:
    """One socket speaking the protocol; ROUTER sockets give and take the peer's identity."""

    def __init__(self, ctx: zmq.Context[Any], kind: int, endpoint: str, bind: bool, encoder: Encoder,
                 identity: str | None = None) -> None:
        self.sock = ctx.socket(kind)
        self.kind, self.endpoint, self.encoder = kind, endpoint, encoder
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 1000)
        self.sock.setsockopt(zmq.RCVHWM, 1000)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity.encode())
        if kind == zmq.SUB:
            self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        if kind == zmq.XPUB:
            self.sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        (self.sock.bind if bind else self.sock.connect)(endpoint)

    def send(self, msg: Message, to: bytes | None = None) -> None:
        self.send_raw(to_frames(msg, self.encoder), to)

    def send_raw(self, frames: list[Any], to: bytes | None = None) -> None:
        self.sock.send_multipart(([to] if to is not None else []) + list(frames), flags=zmq.NOBLOCK)

    def recv(self, timeout: float) -> Got | None:
        """The next message within `timeout` seconds, or None."""
        if not self.sock.poll(max(int(timeout * 1000), 0), zmq.POLLIN):
            return None
        frames = self.sock.recv_multipart()
        peer = None
        if self.kind == zmq.ROUTER:
            peer, frames = frames[0], frames[1:]
        if self.kind == zmq.XPUB:
            return Got(peer, None)  # a subscription: the caller re-sends its newest weights
        env = None
        try:
            env = decode(frames)
            return Got(peer, from_envelope(env), None, env)
        except ProtocolError as exc:
            return Got(peer, None, exc, env)

    def recv_until(self, accept: Any, timeout: float) -> Got | None:
        """The first message `accept(got)` takes within `timeout` (others are skipped)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            got = self.recv(left)
            if got is not None and accept(got):
                return got
        return None

    def close(self) -> None:
        self.sock.close(linger=0)
