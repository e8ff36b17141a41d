"""Tests for common/curve_auth.py: CURVE over tcp:// admits authorized clients and nobody else.

ThreadAuthenticator works on a zmq.asyncio.Context as well as a sync one: pyzmq creates
its ZAP and pipe sockets with socket_class=zmq.Socket, so both are tested.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from spreeze.proto.codec import Encoder
from spreeze.common.curve_auth import (CurveKeys, Refusals, client_keys, make_keys, server_keys, start_authenticator,
                                      watch_refusals)
from spreeze.common.errors import ConfigError, TransportTimeout
from spreeze.common.transport import Channel
from spreeze.proto.messages import Heartbeat

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.skipif(not zmq.has("curve"), reason="libzmq built without CURVE")]
REFUSED_WITHIN = 0.7  # seconds a refused client is given to get a message through (it never does)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_keys(tmp_path_factory.mktemp("curve") / "keys")


@pytest.fixture(scope="module")
def intruder(tmp_path_factory: pytest.TempPathFactory, keys: Path) -> CurveKeys:
    """A well-formed key pair that knows the server key but is not in authorized/."""
    public, secret = zmq.curve_keypair()
    return CurveKeys(public, secret, server_keys(keys).public)


@pytest.fixture
def server(keys: Path) -> Iterator[tuple[zmq.asyncio.Context, Channel]]:
    """An authenticated PULL channel on a random tcp port, and its context."""
    ctx = zmq.asyncio.Context()
    auth = start_authenticator(ctx, keys)
    ch = Channel(ctx, "experience", "tcp://127.0.0.1:*", binding=True, encoder=Encoder("replay"),
                 curve=server_keys(keys))
    yield ctx, ch
    auth.stop()
    ctx.destroy(linger=0)


def endpoint_of(ch: Channel) -> str:
    return ch.sock.getsockopt(zmq.LAST_ENDPOINT).decode()


async def deliver(server: Channel, curve: CurveKeys | None, timeout: float) -> bool:
    """Whether one Heartbeat from a fresh client (own context) reaches the server in time."""
    ctx = zmq.asyncio.Context()
    client = Channel(ctx, "experience", endpoint_of(server), binding=False, encoder=Encoder("sampler"),
                     curve=curve)
    try:
        await client.send(Heartbeat("sampler-1", "running"))
        try:
            _, msg = await server.recv(timeout=timeout)
        except TransportTimeout:
            return False
        assert msg == Heartbeat("sampler-1", "running")
        return True
    finally:
        ctx.destroy(linger=0)


def test_authorized_client_is_served(server: tuple[zmq.asyncio.Context, Channel], keys: Path) -> None:
    assert asyncio.run(deliver(server[1], client_keys(keys), timeout=10))


def test_plain_client_gets_nothing_through(server: tuple[zmq.asyncio.Context, Channel], keys: Path) -> None:
    assert not asyncio.run(deliver(server[1], None, timeout=REFUSED_WITHIN))
    assert asyncio.run(deliver(server[1], client_keys(keys), timeout=10))  # the server still serves


def test_unauthorized_key_pair_gets_nothing_through(server: tuple[zmq.asyncio.Context, Channel],
                                                    intruder: CurveKeys, keys: Path) -> None:
    assert not asyncio.run(deliver(server[1], intruder, timeout=REFUSED_WITHIN))
    assert asyncio.run(deliver(server[1], client_keys(keys), timeout=10))


def test_client_with_the_wrong_server_key_gets_nothing_through(
        server: tuple[zmq.asyncio.Context, Channel], keys: Path) -> None:
    good = client_keys(keys)
    wrong = CurveKeys(good.public, good.secret, zmq.curve_keypair()[0])
    assert not asyncio.run(deliver(server[1], wrong, timeout=REFUSED_WITHIN))


def test_each_refused_client_is_said_with_why_once_then_counted(server: tuple[zmq.asyncio.Context, Channel],
                                                                  intruder: CurveKeys, keys: Path) -> None:
    """libzmq drops a refused peer silently; the socket's monitor names each kind of refusal."""
    good = client_keys(keys)
    wrong_server = CurveKeys(good.public, good.secret, zmq.curve_keypair()[0])
    said: list[str] = []
    refusals = Refusals(every=60.0)

    async def body() -> None:
        watch = asyncio.create_task(watch_refusals(server[1].sock, "tcp://here", refusals, said.append))
        await asyncio.sleep(0.1)
        for curve in (None, intruder, wrong_server, None):
            assert not await deliver(server[1], curve, timeout=REFUSED_WITHIN)
        assert await deliver(server[1], good, timeout=10)  # the server still serves
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)

    asyncio.run(body())
    assert all(s.startswith("refused a client at tcp://here: ") for s in said), said
    reasons = {s.split(": ", 1)[1] for s in said}
    assert len(said) == len(reasons), said  # each reason once: the second keyless client is counted, not said
    assert "its client key is not authorized (not in the key directory's authorized/)" in reasons, said
    assert "it knows another server key than this run's server.key" in reasons, said
    # a keyless client: the server sees the mechanism mismatch, or the client hanging up first on seeing it
    assert {"it has no CURVE keys (this run admits clients with keys only: --keys DIR)",
            "it hung up in the handshake (most often a client without CURVE keys: --keys DIR)"} & reasons, said
    assert refusals.total >= 4


def test_refusals_say_a_reason_again_after_the_quiet_time_with_the_count() -> None:
    r = Refusals(every=60.0)
    assert r.add("no keys", 0.0) == "no keys"
    assert [r.add("no keys", t) for t in (1.0, 2.0, 30.0)] == [None, None, None]
    assert r.add("bad key", 31.0) == "bad key"  # another reason is said at once
    assert r.add("no keys", 61.0) == "no keys (4 refusals since this was last said)"
    assert r.total == 6


def test_sync_context_works_too(keys: Path) -> None:
    ctx = zmq.Context()
    auth = start_authenticator(ctx, keys)
    try:
        pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        server_keys(keys).apply(pull, server=True)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        client_keys(keys).apply(push, server=False)
        push.connect(f"tcp://127.0.0.1:{port}")
        push.send(b"hello")
        assert pull.poll(10_000) and pull.recv() == b"hello"
    finally:
        auth.stop()
        ctx.destroy(linger=0)


# ------------------------------------------------------------------ key files

def test_make_keys_layout_and_permissions(keys: Path) -> None:
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o700
    names = {p.name for p in keys.iterdir()}
    assert {"server.key", "server.key_secret", "client.key", "client.key_secret", "authorized"} <= names
    assert [p.name for p in (keys / "authorized").iterdir()] == ["client.key"]
    for secret in keys.glob("*.key_secret"):
        assert stat.S_IMODE(os.stat(secret).st_mode) & 0o077 == 0, secret


def test_make_keys_keeps_the_server_pair(tmp_path: Path) -> None:
    d = make_keys(tmp_path / "k")
    first = server_keys(d)
    make_keys(d, client_name="sampler-2")
    assert server_keys(d) == first
    assert client_keys(d, "sampler-2").server_public == first.public
    assert len(list((d / "authorized").iterdir())) == 2


def test_missing_client_key_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=str(tmp_path / "client.key_secret")):
        client_keys(tmp_path)


def test_missing_server_key_names_the_path(tmp_path: Path, keys: Path) -> None:
    with pytest.raises(ConfigError, match=str(tmp_path / "server.key_secret")):
        server_keys(tmp_path)
    d = tmp_path / "client-only"
    d.mkdir()
    for name in ("client.key", "client.key_secret"):
        (d / name).write_bytes((keys / name).read_bytes())
    with pytest.raises(ConfigError, match=str(d / "server.key")):
        client_keys(d)


def test_public_only_file_is_not_a_secret_key(tmp_path: Path, keys: Path) -> None:
    (tmp_path / "server.key_secret").write_bytes((keys / "server.key").read_bytes())
    with pytest.raises(ConfigError, match="no secret key"):
        server_keys(tmp_path)


def test_corrupt_key_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "server.key_secret").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="not a valid certificate"):
        server_keys(tmp_path)


def test_authenticator_needs_the_authorized_dir(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    try:
        with pytest.raises(ConfigError, match=str(tmp_path / "authorized")):
            start_authenticator(ctx, tmp_path)
    finally:
        ctx.destroy(linger=0)


def test_client_keys_require_the_server_key() -> None:
    public, secret = zmq.curve_keypair()
    ctx = zmq.Context()
    try:
        with pytest.raises(ConfigError, match="server's public key"):
            CurveKeys(public, secret).apply(ctx.socket(zmq.PUSH), server=False)
    finally:
        ctx.destroy(linger=0)


def test_server_without_authenticator_refuses_everyone(keys: Path) -> None:
    """Fail closed: a CURVE server whose context runs no authenticator admits nobody."""
    async def main() -> bool:
        ctx = zmq.asyncio.Context()
        try:
            ch = Channel(ctx, "experience", "tcp://127.0.0.1:*", binding=True, encoder=Encoder("r"),
                         curve=server_keys(keys))
            return await deliver(ch, client_keys(keys), timeout=REFUSED_WITHIN)
        finally:
            ctx.destroy(linger=0)
    assert not asyncio.run(main())
