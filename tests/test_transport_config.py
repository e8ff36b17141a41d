"""Tests for common/transport.py's configuration: endpoints, ipc directories, ports, socket roles.
A bad value is a ConfigError naming it, raised before any socket is used."""

from __future__ import annotations

import os
import socket
import stat

import pytest
import zmq
import zmq.asyncio

from spreeze.proto.codec import Encoder
from spreeze.common.errors import ConfigError
from spreeze.common.transport import IPC_PATH_MAX, ROLES, Channel, check_endpoint, ephemeral_ports, in_use_hint, ipc_endpoint

def test_ipc_dir_is_private_and_short(ipc_dir: str) -> None:
    assert stat.S_IMODE(os.stat(ipc_dir).st_mode) == 0o700
    assert len(ipc_endpoint(ipc_dir, "experience")) < 60


def test_ipc_path_too_long_is_a_config_error(ipc_dir: str) -> None:
    name = "x" * (IPC_PATH_MAX - len(ipc_dir))  # one byte over, counting the '/'
    with pytest.raises(ConfigError, match="longer than 107"):
        ipc_endpoint(ipc_dir, name)
    assert ipc_endpoint(ipc_dir, name[:-1])  # exactly at the limit is fine


@pytest.mark.timeout(10)
def test_channel_rejects_a_too_long_ipc_path(ipc_dir: str) -> None:
    ctx = zmq.asyncio.Context()
    try:
        with pytest.raises(ConfigError, match="ipc"):
            Channel(ctx, "experience", f"ipc://{ipc_dir}/{'x' * 200}", binding=True, encoder=Encoder("r"))
    finally:
        ctx.destroy(linger=0)


@pytest.mark.timeout(10)
def test_a_taken_port_is_a_config_error_and_an_ephemeral_one_says_why_it_may_be_taken() -> None:
    low, high = ephemeral_ports()
    ctx = zmq.asyncio.Context()
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))  # the kernel picks from its ephemeral range, as for a source port
        taken.listen()
        port = taken.getsockname()[1]
        assert low <= port <= high
        with pytest.raises(ConfigError, match=f"cannot bind weights socket to 'tcp://127.0.0.1:{port}'.*"
                                              f"ephemeral range {low}-{high}.*use ports below {low}"):
            Channel(ctx, "weights", f"tcp://127.0.0.1:{port}", binding=True, encoder=Encoder("a"))
        assert in_use_hint(f"tcp://127.0.0.1:{low - 1}") == "" and in_use_hint("ipc:///tmp/x") == ""
    finally:
        taken.close()
        ctx.destroy(linger=0)


@pytest.mark.parametrize("endpoint", ["udp://127.0.0.1:5555", "http://x", "127.0.0.1:5555", "", "IPC:///tmp/x"])
def test_bad_endpoint_scheme_is_a_config_error(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="must start with"):
        check_endpoint(endpoint)
    ctx = zmq.asyncio.Context()
    try:
        with pytest.raises(ConfigError, match=repr(endpoint).replace(".", r"\.")):
            Channel(ctx, "experience", endpoint, binding=True, encoder=Encoder("r"))
    finally:
        ctx.destroy(linger=0)


def test_experience_rides_a_socket_that_never_drops() -> None:
    bind, connect = ROLES["experience"]  # DEALER blocks at its HWM; acks come back on the same pair
    assert (bind.kind, connect.kind) == (zmq.ROUTER, zmq.DEALER)
    for name, (b, c) in ROLES.items():
        assert b.bind and not c.bind, name
