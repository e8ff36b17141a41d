"""CURVE authentication for tcp:// endpoints, with key files made by pyzmq's zmq.auth.

Layout of a key directory (made by `make_keys`):
    server.key / server.key_secret      the supervisor's (and binding services') pair
    client.key / client.key_secret      a pair for clients (samplers, learners)
    authorized/                         public keys of the clients a server accepts
A server accepts only clients whose public key is in `authorized/`; a client must know
the server's public key. IPC endpoints rely on the run directory's 0700 permissions.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import parse_monitor_message

from spreeze.common.errors import ConfigError


ZAP_DOMAIN = "spreeze"  # the ZAP domain of every CURVE server socket; start_authenticator serves it
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
REFUSALS_SAID_EVERY_S = 60.0  # a refused client retries every few 100 ms: said once, then counted


def _fail_closed(sock: zmq.Socket) -> None:
    """Refuse every client while no authenticator runs (libzmq otherwise accepts anyone who
    knows the server's public key). ZAP_ENFORCE_DOMAIN is a draft option in some builds."""
    try:
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    except (AttributeError, zmq.ZMQError):
        pass  # libzmq < 4.3 or without draft options: safe only with start_authenticator running


@dataclass(frozen=True)
class CurveKeys:
    """Key material of one process: its own pair, and the server's public key (clients)."""

    public: bytes
    secret: bytes
    server_public: bytes | None = None

    def apply(self, sock: zmq.Socket, server: bool) -> None:
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        if server:
            sock.zap_domain = ZAP_DOMAIN.encode()
            _fail_closed(sock)
            sock.curve_server = True
        else:
            if self.server_public is None:
                raise ConfigError("CURVE client keys need the server's public key (server.key)")
            sock.curve_serverkey = self.server_public


def make_keys(directory: str | Path, client_name: str = "client") -> Path:
    """Create a server pair and a client pair, and authorize the client. Returns the dir."""
    d = Path(directory)
    (d / "authorized").mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    if not (d / "server.key_secret").exists():
        os.chmod(zmq.auth.create_certificates(d, "server")[1], 0o600)
    public, secret = zmq.auth.create_certificates(d, client_name)
    os.chmod(secret, 0o600)  # pyzmq writes it with the umask's mode (often 0644)
    shutil.copy(public, d / "authorized" / Path(public).name)
    return d


def _load(path: Path) -> tuple[bytes, bytes | None]:
    if not path.exists():
        raise ConfigError(f"CURVE key file {str(path)!r} does not exist (make one with `spreeze keys`)")
    try:
        return zmq.auth.load_certificate(path)
    except Exception as exc:
        raise ConfigError(f"CURVE key file {str(path)!r} is not a valid certificate: {exc}") from None


def server_keys(directory: str | Path) -> CurveKeys:
    path = Path(directory) / "server.key_secret"
    public, secret = _load(path)
    if secret is None:
        raise ConfigError(f"{str(path)!r} holds no secret key")
    return CurveKeys(public, secret)


def client_keys(directory: str | Path, client_name: str = "client") -> CurveKeys:
    d = Path(directory)
    public, secret = _load(d / f"{client_name}.key_secret")
    server_public, _ = _load(d / "server.key")
    if secret is None:
        raise ConfigError(f"{str(d / (client_name + '.key_secret'))!r} holds no secret key")
    return CurveKeys(public, secret, server_public)


def start_authenticator(ctx: zmq.Context, directory: str | Path) -> ThreadAuthenticator:
    """Accept CURVE clients whose public keys lie in <directory>/authorized (any address)."""
    allowed = Path(directory) / "authorized"
    if not allowed.is_dir():
        raise ConfigError(f"CURVE authorized-keys directory {str(allowed)!r} does not exist")
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain=ZAP_DOMAIN, location=str(allowed))
    return auth


def why_refused(event: int, value: int) -> str:
    """A CURVE server's failed handshake (a socket monitor's event and value), in words."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "its client key is not authorized (not in the key directory's authorized/)"
    if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "it has no CURVE keys (this run admits clients with keys only: --keys DIR)"
    if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "it knows another server key than this run's server.key"
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        # a client without keys sees the mismatch too and may hang up before this side does
        return "it hung up in the handshake (most often a client without CURVE keys: --keys DIR)"
    return f"its handshake failed ({zmq.Event(event).name}, value {value})"


@dataclass
class Refusals:
    """Refused clients by reason: each reason is said at once, then at most every `every` s,
    with how often it happened in between."""

    every: float = REFUSALS_SAID_EVERY_S
    total: int = 0
    since_said: dict[str, int] = field(default_factory=dict)
    said_at: dict[str, float] = field(default_factory=dict)

    def add(self, why: str, now: float) -> str | None:
        self.total += 1
        self.since_said[why] = self.since_said.get(why, 0) + 1
        if now - self.said_at.get(why, -self.every) < self.every:
            return None
        count, self.since_said[why], self.said_at[why] = self.since_said[why], 0, now
        return why if count == 1 else f"{why} ({count} refusals since this was last said)"


async def watch_refusals(sock: zmq.asyncio.Socket, where: str, refusals: Refusals,
                         say: Callable[[str], None]) -> None:
    """Until cancelled: say each client that a CURVE server socket refuses (rate limited by
    `refusals`). libzmq drops such a peer silently; without this a sampler holding no key, or
    a wrong one, is invisible to the run it tries to join."""
    monitor = sock.get_monitor_socket(HANDSHAKE_FAILED)
    try:
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            text = refusals.add(why_refused(int(event["event"]), int(event["value"])), time.monotonic())
            if text is not None:
                say(f"refused a client at {where}: {text}")
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
