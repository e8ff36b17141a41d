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
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from spreeze.common.errors import ConfigError


ZAP_DOMAIN = "spreeze"  # the ZAP domain of every CURVE server socket; start_authenticator serves it


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
