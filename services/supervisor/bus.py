"""The metrics bus: the supervisor's XSUB <-> XPUB proxy.

Services publish metrics, evaluation results and events into `metrics_in` (XSUB); the
visualizer and the supervisor itself subscribe to `metrics_out` (XPUB). Messages flow out
unparsed and subscriptions flow in. Beyond PROXY_HWM queued messages it drops (PUB semantics:
metrics are best effort).
"""

from __future__ import annotations

import zmq
import zmq.asyncio

from spreeze.common.curve_auth import CurveKeys
from spreeze.common.transport import bind_address

PROXY_HWM = 10_000  # metrics messages queued in the proxy before it drops (PUB semantics)


async def metrics_proxy(ctx: zmq.asyncio.Context, binds: dict[str, tuple[str, ...]],
                        server_keys: CurveKeys | None) -> None:
    """Run the proxy until cancelled; `binds`: the endpoints of metrics_in and metrics_out."""
    xsub, xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
    if server_keys is not None:
        server_keys.apply(xsub, server=True)  # metrics_in faces tcp: remote samplers publish there
    for sock, name in ((xsub, "metrics_in"), (xpub, "metrics_out")):
        sock.setsockopt(zmq.SNDHWM, PROXY_HWM)
        sock.setsockopt(zmq.RCVHWM, PROXY_HWM)
        sock.setsockopt(zmq.LINGER, 0)
        for endpoint in binds[name]:
            sock.bind(bind_address(endpoint))
    poller = zmq.asyncio.Poller()
    poller.register(xsub, zmq.POLLIN)
    poller.register(xpub, zmq.POLLIN)
    try:
        while True:
            events = dict(await poller.poll())
            if xsub in events:
                await xpub.send_multipart(await xsub.recv_multipart(copy=False), copy=False)
            if xpub in events:
                await xsub.send_multipart(await xpub.recv_multipart())
    finally:
        xsub.close()
        xpub.close()
