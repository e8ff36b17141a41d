"""What every service process shares: registration, heartbeats, control, metrics.

A service is started with SPREEZE_CONTROL (the supervisor's control endpoint) and
SPREEZE_SERVICE_ID in its environment. It registers, receives its endpoints and the
run config in the Welcome, then runs `serve()` beside two small tasks on the SAME event
loop: heartbeats (so a stuck loop looks dead) and control handling. Crash-only: an
unrecoverable error is logged and the process exits non-zero; the supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from typing import Any, ClassVar

import zmq
import zmq.asyncio

from common.codec import Encoder
from common.config import Config, from_dict
from common.errors import ConfigError, PeerError, TransportTimeout
from common.transport import Channel, transport_seconds
from proto.messages import Control, ControlReply, Heartbeat, Metrics, Register, Welcome

log = logging.getLogger(__name__)

ENV_CONTROL = "SPREEZE_CONTROL"  # supervisor control endpoint
ENV_SERVICE_ID = "SPREEZE_SERVICE_ID"  # this process's service id
REGISTER_TIMEOUT = 30.0  # seconds to wait for the supervisor's Welcome


class Service:
    """Base class: subclasses set ROLE and implement `serve()` (and optionally `close()`)."""

    ROLE: ClassVar[str] = ""

    def __init__(self, service_id: str, welcome: Welcome, ctx: zmq.asyncio.Context,
                 control: Channel, encoder: Encoder) -> None:
        self.service_id = service_id
        self.cfg: Config = from_dict(welcome.config)
        self.endpoints = welcome.endpoints
        self.heartbeat_interval = welcome.heartbeat_interval
        self.ctx, self.control, self.encoder = ctx, control, encoder
        self.stopping = asyncio.Event()
        self.paused = False
        self.started = time.monotonic()
        self.supervisor_seen = time.monotonic()
        self.metrics_out = self.channel("metrics_in", binding=False)

    # ------------------------------------------------------------ for subclasses
    async def serve(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Flush state before exit (final checkpoint, last evaluation...)."""

    def counters(self) -> dict[str, Any]:
        """Small counters sent with each heartbeat."""
        return {}

    def set_param(self, key: str, value: Any) -> None:
        raise ConfigError(f"{self.ROLE} has no runtime parameter {key!r}")

    def endpoint(self, name: str) -> str:
        try:
            return self.endpoints[name]
        except KeyError:
            raise ConfigError(f"{self.ROLE}: the supervisor gave no endpoint {name!r}") from None

    def channel(self, role: str, binding: bool, name: str | None = None, **kw: Any) -> Channel:
        return Channel(self.ctx, role, self.endpoint(name or role), binding=binding,
                       encoder=self.encoder, **kw)

    def publish(self, values: dict[str, Any]) -> None:
        """Metrics are best effort: a full PUB queue drops them. Every record also carries the
        process's CPU seconds and the seconds of it spent in transport (codec and sockets)."""
        values = {**values, "cpu_s": time.process_time(), "transport_s": transport_seconds()}
        self.metrics_out.send_nowait(Metrics(service=self.service_id, values=values))

    @property
    def running(self) -> bool:
        return not self.stopping.is_set()

    # ------------------------------------------------------------ background tasks
    async def heartbeats(self) -> None:
        liveness = self.cfg.supervisor.liveness * self.heartbeat_interval
        while self.running:
            await self.control.send(Heartbeat(self.service_id, "paused" if self.paused else "running",
                                              self.counters()))
            if time.monotonic() - self.supervisor_seen > liveness:
                raise PeerError(f"no word from the supervisor for {liveness:.1f}s: exiting")
            await asyncio.sleep(self.heartbeat_interval)

    async def control_loop(self) -> None:
        while self.running:
            _, msg = await self.control.recv()
            self.supervisor_seen = time.monotonic()
            if isinstance(msg, Control):
                await self.control.send(self.on_control(msg))

    def on_control(self, msg: Control) -> ControlReply:
        try:
            if msg.command == "shutdown":
                self.stopping.set()
            elif msg.command == "pause":
                self.paused = True
            elif msg.command == "resume":
                self.paused = False
            elif msg.command == "set":
                self.set_param(msg.key, msg.value)
            elif msg.command != "ping":
                raise ConfigError(f"unknown control command {msg.command!r}")
        except ConfigError as exc:
            return ControlReply(msg.request_id, False, str(exc))
        return ControlReply(msg.request_id, True)


# ---------------------------------------------------------------- process entry

async def _register(ctx: zmq.asyncio.Context, role: str, service_id: str,
                    encoder: Encoder) -> tuple[Channel, Welcome]:
    endpoint = os.environ.get(ENV_CONTROL)
    if not endpoint:
        raise ConfigError(f"{ENV_CONTROL} is not set: a service needs the supervisor's control endpoint")
    control = Channel(ctx, "control", endpoint, binding=False, encoder=encoder, identity=service_id)
    await control.send(Register(role=role, pid=os.getpid(), host=socket.gethostname(),
                                service_id=service_id))
    deadline = time.monotonic() + REGISTER_TIMEOUT
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TransportTimeout(f"no Welcome from the supervisor at {endpoint} within {REGISTER_TIMEOUT}s")
        _, msg = await control.recv(timeout=left)
        if isinstance(msg, Welcome):
            return control, msg


async def _main(cls: type[Service]) -> None:
    service_id = os.environ.get(ENV_SERVICE_ID) or f"{cls.ROLE}-{socket.gethostname()}-{os.getpid()}"
    ctx = zmq.asyncio.Context()
    encoder = Encoder(service_id)
    control, welcome = await _register(ctx, cls.ROLE, service_id, encoder)
    svc = cls(welcome.service_id or service_id, welcome, ctx, control, encoder)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, svc.stopping.set)
    tasks = [asyncio.create_task(t) for t in (svc.serve(), svc.heartbeats(), svc.control_loop())]
    stop = asyncio.create_task(svc.stopping.wait())
    done, _ = await asyncio.wait([*tasks, stop], return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is not stop and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    svc.stopping.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await svc.close()
    ctx.destroy(linger=1000)


def run_service(cls: type[Service]) -> None:
    """`python -m services.<name>` entry: run until shutdown, exit 1 on a crash."""
    logging.basicConfig(level=os.environ.get("SPREEZE_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s {cls.ROLE} %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    try:
        asyncio.run(_main(cls))
    except Exception:
        log.exception("%s crashed", cls.ROLE)
        sys.exit(1)
