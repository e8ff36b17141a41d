"""What every service process shares: registration, heartbeats, control, metrics.

A service is started with SPREEZE_CONTROL (the supervisor's control endpoint) and
SPREEZE_SERVICE_ID in its environment. It registers, receives its endpoints and the
run config in the Welcome, then runs `serve()` beside two small tasks on the SAME event
loop: heartbeats (so a stuck loop looks dead) and control handling. Crash-only: an
unrecoverable error is logged and the process exits non-zero; the supervisor restarts it
(or, for a service it did not start, the service's owner: a compose restart policy).

Optional environment: SPREEZE_KEYS (CURVE key directory: the sockets that also face
tcp:// are secured), SPREEZE_HEALTH (an endpoint answering health pings, common/health.py).
A service whose control endpoint is tcp:// is remote: it is given tcp endpoints and waits
out a silent supervisor for supervisor.remote_patience seconds (network loss) before exiting.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import zmq
import zmq.asyncio

from spreeze.proto.codec import Encoder
from spreeze.common.config import Config, from_dict
from spreeze.common.curve_auth import (CurveKeys, Refusals, client_keys, server_keys, start_authenticator,
                                      watch_refusals)
from spreeze.common.disk import DiskWrites
from spreeze.common import heap
from spreeze.common.errors import ConfigError, PeerError, RunFinished, TransportTimeout
from spreeze.common.health import serve_health
from spreeze.common.health_probe import ENV_HEALTH
from spreeze.common.transport import Channel, tcp_host, transport_seconds
from spreeze.proto.messages import (FINISHED, UNREGISTERED, Control, ControlReply, Error, Event, Heartbeat, Metrics,
                                    Register, Welcome)

log = logging.getLogger(__name__)

ENV_CONTROL = "SPREEZE_CONTROL"  # supervisor control endpoint
ENV_SERVICE_ID = "SPREEZE_SERVICE_ID"  # this process's service id
ENV_KEYS = "SPREEZE_KEYS"  # CURVE key directory made by `spreeze keys` (a run with supervisor.keys needs it)
ENV_KEY_NAME = "SPREEZE_KEY_NAME"  # which client pair of that directory to use (default "client")
ENV_REGISTER_TIMEOUT = "SPREEZE_REGISTER_TIMEOUT"  # overrides REGISTER_TIMEOUT (seconds)
REGISTER_TIMEOUT = 30.0  # seconds to wait for the supervisor's Welcome
WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]", "")  # bind-all addresses, not reachable as such


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
        self.tcp = welcome.tcp  # sockets that also face tcp:// (CURVE-secured when the run has keys)
        self.remote = control.endpoint.startswith("tcp://")
        self.keys = run_keys(self.cfg)
        self.authenticator: Any = None
        self.stopping = asyncio.Event()
        self.paused = False
        self.rejoined_at = 0.0  # when it last registered again with a restarted supervisor (0: not now)
        self.started = time.monotonic()
        self.supervisor_seen = time.monotonic()
        self.channels: list[Channel] = [control]  # every socket of this service: their error counts go out as metrics
        self.refusals = Refusals()  # clients its CURVE-secured tcp sockets refused
        self.watches: list[asyncio.Task[None]] = []  # one per such socket: each refusal is said
        self.metrics_out = self.channel("metrics_in", binding=False)
        self.disk = DiskWrites(self.notify)  # writes into the run directory that a full disk may refuse

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
        """The socket `name` (default: the role's name); a binder also binds its tcp endpoint."""
        name = name or role
        endpoint = self.endpoint(name)
        also = (self.tcp[name],) if binding and name in self.tcp and self.tcp[name] != endpoint else ()
        curve = self.curve(binding) if name in self.tcp else None
        ch = Channel(self.ctx, role, endpoint, binding=binding, encoder=self.encoder, also=also,
                     curve=curve, **kw)
        self.channels.append(ch)
        if binding and curve is not None:
            watch = asyncio.get_running_loop().create_task(
                watch_refusals(ch.sock, ch.tcp_endpoints, self.refusals, self.client_refused))
            watch.add_done_callback(watch_ended)
            self.watches.append(watch)
        return ch

    def error_metrics(self) -> dict[str, int]:
        """Refused messages by code and by sender over all of this service's sockets (SPEC §5)."""
        out: dict[str, int] = {}
        for ch in self.channels:
            for key, n in ch.error_metrics().items():
                out[key] = out.get(key, 0) + n
        if self.refusals.total:
            out["refused_clients"] = self.refusals.total  # CURVE handshakes refused (watch_refusals)
        return out

    def curve(self, server: bool) -> CurveKeys | None:
        """Key pair for a tcp-facing socket (None in a run without keys); servers start the ZAP handler."""
        if self.keys is None:
            return None
        if not server:
            return client_keys(self.keys, os.environ.get(ENV_KEY_NAME, "client"))
        if self.authenticator is None:
            self.authenticator = start_authenticator(self.ctx, self.keys)
        return server_keys(self.keys)

    def health_state(self) -> str:
        return "stopping" if self.stopping.is_set() else "paused" if self.paused else "running"

    def health_detail(self) -> str:
        """What `spreeze health` shows after the state ("" = nothing)."""
        return ""

    def publish(self, values: dict[str, Any]) -> None:
        """Metrics are best effort: a full PUB queue drops them. Every record also carries the
        process's CPU seconds, the seconds of it spent in transport (codec and sockets) and the
        counts of refused messages (`errors/<code>`, `errors/<sender>/<code>`)."""
        values = {**values, "cpu_s": time.process_time(), "transport_s": transport_seconds(),
                  **self.error_metrics()}
        self.metrics_out.send_nowait(Metrics(service=self.service_id, values=values))

    def notify(self, kind: str, reason: str) -> None:
        """An event the console and the dashboard show (and the log keeps)."""
        log.warning("%s: %s", kind, reason)
        self.metrics_out.send_nowait(Event(kind, reason, {"service": self.service_id, "notify": True}))

    def client_refused(self, text: str) -> None:
        """A client that one of its CURVE-secured sockets refused (watch_refusals says why)."""
        self.notify("refused_client", f"{self.service_id} {text}")

    @property
    def running(self) -> bool:
        return not self.stopping.is_set()

    # ------------------------------------------------------------ background tasks
    async def heartbeats(self) -> None:
        # remote: the network may drop for a while; ZeroMQ reconnects and heartbeats resume
        liveness = (self.cfg.supervisor.remote_patience if self.remote
                    else self.cfg.supervisor.liveness * self.heartbeat_interval)
        trimmed = time.monotonic()
        while self.running:
            await self.control.send(Heartbeat(self.service_id, "paused" if self.paused else "running",
                                              self.counters()))
            if time.monotonic() - trimmed > heap.TRIM_EVERY_S:  # freed memory back to the system (heap.py:
                trimmed = time.monotonic()  # without it a sampler grew at each replay restart)
                heap.trim()
            if time.monotonic() - self.supervisor_seen > liveness and not self.control.has_input():
                # (queued input: the supervisor spoke while this loop was busy; control_loop reads it next)
                raise PeerError(f"no word from the supervisor for {liveness:.1f}s: exiting")
            await asyncio.sleep(self.heartbeat_interval)

    async def closing_heartbeats(self) -> None:
        """While close() flushes (final checkpoint, last acks): heartbeats with state `stopping`,
        so a supervisor waiting for this service's goodbye keeps waiting."""
        while True:
            self.control.send_nowait(Heartbeat(self.service_id, "stopping", self.counters()))
            await asyncio.sleep(self.heartbeat_interval)

    async def control_loop(self) -> None:
        while self.running:
            _, msg = await self.control.recv()
            self.supervisor_seen = time.monotonic()
            if isinstance(msg, Control):
                await self.control.send(self.on_control(msg))
            elif isinstance(msg, Error) and msg.code == UNREGISTERED:
                await self.rejoin()
            elif isinstance(msg, Error) and msg.code == FINISHED and self.rejoined_at:
                log.info("the restarted supervisor's run has finished (%s): stopping", msg.detail)
                self.stopping.set()  # a clean stop: close() keeps what this service holds
            elif isinstance(msg, Error) and self.rejoined_at:
                raise PeerError(f"the restarted supervisor refused the registration: {msg.detail}")
            elif isinstance(msg, Welcome) and self.rejoined_at:
                self.rejoined(msg)

    async def rejoin(self) -> None:
        """Register again with a supervisor that does not know this service (it restarted); again
        if no Welcome came within the liveness time (the first try may be lost with a connection
        the restart broke)."""
        now = time.monotonic()
        if self.rejoined_at and now - self.rejoined_at < self.cfg.supervisor.liveness * self.heartbeat_interval:
            return  # asked already: its Welcome may be on the way
        log.warning("the supervisor does not know this service (it restarted): registering %s",
                    "again" if not self.rejoined_at else "again (no Welcome yet)")
        self.rejoined_at = now
        await self.control.send(registration(self.ROLE, self.service_id, self.remote))


    def rejoined(self, welcome: Welcome) -> None:
        """The welcome of a restarted supervisor: go on where its endpoints are the same (PeerError
        otherwise: this process exits, for its owner to start it again)."""
        self.rejoined_at = 0.0
        endpoints = reachable(welcome.endpoints, self.control.endpoint) if self.remote else welcome.endpoints
        if endpoints != self.endpoints:
            raise PeerError(f"the restarted supervisor gave other endpoints ({endpoints}, were {self.endpoints}): "
                            "exiting, to be started again")
        log.info("registered again with the restarted supervisor")

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

def watch_ended(task: asyncio.Task[None]) -> None:
    """A refusal watch ends when cancelled; anything else is a fault worth a log line."""
    if not task.cancelled() and task.exception() is not None:
        log.error("watching a CURVE socket for refused clients failed", exc_info=task.exception())


def run_keys(cfg: Config | None) -> str | None:
    """The CURVE key directory of this process (SPREEZE_KEYS), checked against the run's config."""
    keys = os.environ.get(ENV_KEYS) or None
    if keys is None and cfg is not None and cfg.supervisor.keys:
        raise ConfigError(f"the run requires CURVE keys (supervisor.keys={cfg.supervisor.keys!r}): "
                          f"set {ENV_KEYS} to a key directory (spreeze sampler --keys DIR)")
    return keys


def register_timeout() -> float:
    raw = os.environ.get(ENV_REGISTER_TIMEOUT) or str(REGISTER_TIMEOUT)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{ENV_REGISTER_TIMEOUT}={raw!r} must be a number of seconds > 0")
    return value


def reachable(endpoints: dict[str, str], control: str) -> dict[str, str]:
    """tcp endpoints bound on a wildcard address, rewritten to the host we reached control on."""
    host = tcp_host(control)
    out = {}
    for name, ep in endpoints.items():
        if ep.startswith("tcp://") and tcp_host(ep) in WILDCARD_HOSTS:
            ep = f"tcp://{host}:{ep.rpartition(':')[2]}"
        out[name] = ep
    return out


def registration(role: str, service_id: str, remote: bool) -> Register:
    """This process's `register` message."""
    return Register(role=role, pid=os.getpid(), host=socket.gethostname(), service_id=service_id, remote=remote)


async def _register(ctx: zmq.asyncio.Context, role: str, service_id: str,
                    encoder: Encoder) -> tuple[Channel, Welcome]:
    endpoint = os.environ.get(ENV_CONTROL)
    if not endpoint:
        raise ConfigError(f"{ENV_CONTROL} is not set: a service needs the supervisor's control endpoint")
    keys = run_keys(None)
    curve = client_keys(keys, os.environ.get(ENV_KEY_NAME, "client")) if keys else None
    control = Channel(ctx, "control", endpoint, binding=False, encoder=encoder, identity=service_id, curve=curve)
    remote = endpoint.startswith("tcp://")
    await control.send(registration(role, service_id, remote))
    timeout = register_timeout()
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, msg = await control.recv(timeout=max(deadline - time.monotonic(), 0.001))
        except TransportTimeout:
            hint = "" if keys or not remote else " (a run with CURVE keys refuses clients without them: --keys)"
            raise TransportTimeout(f"no Welcome from the supervisor at {endpoint} within {timeout:g}s{hint}") from None
        if isinstance(msg, Error) and msg.code == FINISHED:
            raise RunFinished(msg.detail)
        if isinstance(msg, Error):
            raise PeerError(f"the supervisor at {endpoint} refused the registration: {msg.detail}")
        if isinstance(msg, Welcome):
            if remote:
                msg.endpoints = reachable(msg.endpoints, endpoint)
                msg.tcp = reachable(msg.tcp, endpoint)
            return control, msg


async def _main(cls: type[Service]) -> None:
    service_id = os.environ.get(ENV_SERVICE_ID) or f"{cls.ROLE}-{socket.gethostname()}-{os.getpid()}"
    ctx = zmq.asyncio.Context()
    encoder = Encoder(service_id)
    control, welcome = await _register(ctx, cls.ROLE, service_id, encoder)
    svc = cls(welcome.service_id or service_id, welcome, ctx, control, encoder)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, svc.stopping.set)
    jobs = [svc.serve(), svc.heartbeats(), svc.control_loop()]
    if os.environ.get(ENV_HEALTH):
        jobs.append(serve_health(ctx, os.environ[ENV_HEALTH], encoder, svc.health_state, svc.health_detail))
    tasks = [asyncio.create_task(t) for t in jobs]
    stop = asyncio.create_task(svc.stopping.wait())
    done, _ = await asyncio.wait([*tasks, stop], return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is not stop and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    svc.stopping.set()
    for task in (*tasks, *svc.watches):
        task.cancel()
    await asyncio.gather(*tasks, *svc.watches, return_exceptions=True)
    beating = asyncio.create_task(svc.closing_heartbeats())  # close() may take a while: say so
    try:
        await svc.close()
    finally:
        beating.cancel()
    # the last heartbeat: a supervisor that did not start us cannot see us exit otherwise
    control.send_nowait(Heartbeat(svc.service_id, "stopped", svc.counters()))
    if svc.authenticator is not None:
        svc.authenticator.stop()
    ctx.destroy(linger=1000)


def run_service(cls: type[Service]) -> None:
    """`python -m spreeze.services.<name>` entry: run until shutdown, exit 1 on a crash."""
    logging.basicConfig(level=os.environ.get("SPREEZE_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s {cls.ROLE} %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    try:
        asyncio.run(_main(cls))
    except RunFinished as done:  # started after the run ended (compose starts every container at once)
        log.info("nothing to do: %s", done)
    except Exception:
        log.exception("%s crashed", cls.ROLE)
        leave(1)
    leave(0)


ABANDONED: list[threading.Thread] = []  # daemon threads a stopping service need not wait for


def abandonable_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start ``target`` in a daemon thread that the process may leave behind when it stops
    (a learner's background compile): `leave` then exits without joining it."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    ABANDONED.append(thread)
    thread.start()
    return thread


def leave(code: int) -> None:
    """Exit with ``code``. An abandonable thread still working (a compile stopped mid-way)
    would make the interpreter's finalisation abort in its native code (SIGABRT), so then
    the process leaves without finalising, its logs and streams flushed first."""
    if any(t.is_alive() for t in ABANDONED):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
