"""Health endpoint: a service answers `ping` on a local socket from its own event loop.

A container's health check must ask the service itself, not look for a process: a
service started with SPREEZE_HEALTH=ipc:///tmp/spreeze-health binds a small ROUTER there
after it registered, and answers each `control` ping with a `control_reply` whose
`detail` is its state (a learner adds whether its update steps run compiled). The answer
comes from the same event loop as the service's work and heartbeats, so a stuck loop fails
the check. `spreeze health` (common/health_probe.py) is the client.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import zmq
import zmq.asyncio

from spreeze.proto.codec import Encoder
from spreeze.common.transport import Channel
from spreeze.proto.messages import Control, ControlReply



async def serve_health(ctx: zmq.asyncio.Context, endpoint: str, encoder: Encoder,
                       state: Callable[[], str], detail: Callable[[], str] | None = None) -> None:
    """Task: answer every ping on `endpoint` with ControlReply(ok, detail): the state, then what
    `detail()` adds (a learner: whether it runs compiled update steps)."""
    if endpoint.startswith("ipc://") and os.path.exists(endpoint[len("ipc://"):]):
        os.unlink(endpoint[len("ipc://"):])  # left by a killed predecessor in the same container
    ch = Channel(ctx, "health", endpoint, binding=True, encoder=encoder)
    try:
        while True:
            peer, msg = await ch.recv()
            if not isinstance(msg, Control):
                continue
            if msg.command != "ping":
                reply = ControlReply(msg.request_id, False, f"health socket answers ping only, not {msg.command!r}")
            else:
                now, extra = state(), detail() if detail is not None else ""
                reply = ControlReply(msg.request_id, now in ("running", "paused"), f"{now}; {extra}" if extra else now)
            ch.send_nowait(reply, to=peer)
    finally:
        ch.close()
