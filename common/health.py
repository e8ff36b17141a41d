"""Health endpoint: a service answers `ping` on a local socket from its own event loop.

A container's health check must ask the service itself, not look for a process: a
service started with SPREEZE_HEALTH=ipc:///tmp/spreeze-health binds a small ROUTER there
after it registered, and answers each `control` ping with a `control_reply` whose
`detail` is its state. The answer comes from the same event loop as the service's work
and heartbeats, so a stuck loop fails the check. `spreeze health` is the client.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import zmq
import zmq.asyncio

from proto.codec import Encoder
from common.errors import TransportTimeout
from common.transport import Channel
from proto.messages import Control, ControlReply

ENV_HEALTH = "SPREEZE_HEALTH"  # endpoint of the health socket (container-local ipc://)
PROBE_TIMEOUT = 3.0  # seconds `spreeze health` waits for the answer


async def serve_health(ctx: zmq.asyncio.Context, endpoint: str, encoder: Encoder,
                       state: Callable[[], str]) -> None:
    """Task: answer every ping on `endpoint` with ControlReply(ok, detail=state())."""
    if endpoint.startswith("ipc://") and os.path.exists(endpoint[len("ipc://"):]):
        os.unlink(endpoint[len("ipc://"):])  # left by a killed predecessor in the same container
    ch = Channel(ctx, "health", endpoint, binding=True, encoder=encoder)
    try:
        while True:
            peer, msg = await ch.recv()
            if isinstance(msg, Control):
                now = state()
                ok = msg.command == "ping" and now in ("running", "paused")
                ch.send_nowait(ControlReply(msg.request_id, ok, now if msg.command == "ping"
                                            else f"health socket answers ping only, not {msg.command!r}"), to=peer)
    finally:
        ch.close()


async def ask(endpoint: str, timeout: float = PROBE_TIMEOUT) -> ControlReply:
    """One ping to a health endpoint; TransportTimeout when nothing answers in time."""
    ctx = zmq.asyncio.Context()
    try:
        ch = Channel(ctx, "health", endpoint, binding=False, encoder=Encoder("health-probe"))
        await ch.send(Control("ping", 1))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            _, msg = await ch.recv(timeout=max(deadline - loop.time(), 0.001))
            if isinstance(msg, ControlReply) and msg.request_id == 1:
                return msg
    finally:
        ctx.destroy(linger=0)


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT) -> tuple[bool, str]:
    """(healthy, what was heard) for `spreeze health`."""
    try:
        reply = asyncio.run(asyncio.wait_for(ask(endpoint, timeout), timeout + 1.0))
    except (TransportTimeout, asyncio.TimeoutError):
        return False, f"no answer from {endpoint} within {timeout:.0f}s"
    return reply.ok, reply.detail
