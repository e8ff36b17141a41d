"""`spreeze health`: one ping to a service's health socket (common/health.py answers it).

Synchronous and light on purpose: Docker runs it in every container every few seconds, so it
imports no asyncio, torch or gymnasium, only pyzmq and the wire codec.
"""

from __future__ import annotations

import time

import zmq

from spreeze.proto.codec import Encoder, decode
from spreeze.proto.errors import ProtocolError
from spreeze.proto.messages import Control, ControlReply, from_envelope, to_frames

ENV_HEALTH = "SPREEZE_HEALTH"  # endpoint of the health socket (container-local ipc://)
PROBE_TIMEOUT = 3.0  # seconds `spreeze health` waits for the answer


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT) -> tuple[bool, str]:
    """(healthy, what was heard): healthy when the service answers its ping with ok."""
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send_multipart(to_frames(Control("ping", 1), Encoder("health-probe")))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0 and sock.poll(max(1, int(left * 1000))):
            try:
                msg = from_envelope(decode(sock.recv_multipart(copy=False)))
            except ProtocolError:
                continue  # not an answer we can read: keep waiting for one
            if isinstance(msg, ControlReply) and msg.request_id == 1:
                return msg.ok, msg.detail
        return False, f"no answer from {endpoint} within {timeout:g}s"
    finally:
        ctx.destroy(linger=0)
