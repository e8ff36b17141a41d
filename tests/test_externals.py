"""The pieces under remote samplers and containers: the registry of services the supervisor
did not start, the health socket, sockets on several endpoints, tcp endpoint maps, config."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq.asyncio

from spreeze.proto.codec import Encoder
from spreeze.common.errors import ConfigError
from spreeze.common.health import serve_health
from spreeze.common.health_probe import probe
from spreeze.common.service import reachable
from spreeze.common.transport import Channel, tcp_port
from spreeze.proto.messages import Experience, Heartbeat, Register
from spreeze.services.supervisor.externals import Externals
from spreeze.services.supervisor.endpoints import tcp_endpoints
from tests.helpers import config, run

pytestmark = pytest.mark.timeout(20)


# ------------------------------------------------------------------ registry

def test_registry_join_beat_gone_back_and_rejoin() -> None:
    reg = Externals()
    ext = reg.join("sampler-h-1", Register("sampler", 1, "h", "sampler-h-1", remote=True), now=0.0)
    assert (ext.state, ext.joins, ext.remote) == ("running", 1, True)
    assert reg.sweep(now=4.0, silence=5.0) == []
    assert reg.beat("sampler-h-1", Heartbeat("sampler-h-1", "running", {"env_steps": 64}), now=4.0) is ext
    assert [e.service_id for e in reg.sweep(now=9.5, silence=5.0)] == ["sampler-h-1"]
    assert ext.state == "gone" and reg.live() == []
    assert reg.sweep(now=20.0, silence=5.0) == []  # reported once
    reg.beat("sampler-h-1", Heartbeat("sampler-h-1", "running"), now=21.0)  # the network healed
    assert ext.state == "running" and reg.live() == [ext]
    again = reg.join("sampler-h-1", Register("sampler", 2, "h", "sampler-h-1", remote=True), now=30.0)
    assert again.joins == 2 and again.pid == 2
    row = reg.rows()["sampler-h-1"]
    # unix time of its last heartbeat, as for the services the supervisor started
    assert row.pop("last_heartbeat") == pytest.approx(time.time() - (time.monotonic() - 30.0), abs=1.0)
    assert row == {"role": "sampler", "pid": 2, "host": "h", "state": "running", "restarts": 1,
                   "external": True, "remote": True}
    reg.beat("sampler-h-1", Heartbeat("sampler-h-1", "stopped"), now=31.0)
    assert reg.live() == [] and reg.beat("nobody", Heartbeat("nobody", "running"), now=31.0) is None


@pytest.mark.parametrize("msg, named", [
    (Register("miner", 1, "h", "x"), "'miner'"),
    (Register("replay", 1, "h", "x", remote=True), "'replay'"),
    (Register("sampler", 1, "h", "sampler-7"), "'sampler-7' differs from the DEALER identity 'x'"),
])
def test_registry_refuses_by_name(msg: Register, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Externals().join("x", msg, now=0.0)


# ------------------------------------------------------------------ endpoints

def test_tcp_endpoints_from_listen_and_wildcards_rewritten() -> None:
    eps = tcp_endpoints("tcp://0.0.0.0:6000")
    assert eps == {"control": "tcp://0.0.0.0:6000", "metrics_in": "tcp://0.0.0.0:6001",
                   "experience": "tcp://0.0.0.0:6002", "actor_weights": "tcp://0.0.0.0:6003"}
    seen = reachable({**eps, "sample": "ipc:///tmp/x/sample"}, "tcp://trainer.lan:6000")
    assert seen["experience"] == "tcp://trainer.lan:6002" and seen["sample"] == "ipc:///tmp/x/sample"
    assert reachable({"experience": "tcp://10.0.0.5:6002"}, "tcp://x:1")["experience"] == "tcp://10.0.0.5:6002"
    assert tcp_endpoints("") == {}
    for bad in ("tcp://host", "tcp://host:0", "tcp://:5555", "ipc:///x:5", "tcp://h:99999"):
        with pytest.raises(ConfigError, match="tcp://HOST:PORT"):
            tcp_port(bad)


@pytest.mark.parametrize("overrides, named", [
    (["supervisor.listen=tcp://localhost"], "tcp://localhost"),
    (["supervisor.listen=tcp://0.0.0.0:65534"], "65534"),
    (["supervisor.keys=/k"], "supervisor.keys='/k'"),
    (["sampler.num_samplers=0"], "sampler.num_samplers=0"),
    (["supervisor.mode=swarm"], "supervisor.mode='swarm'"),
])
def test_config_refuses_by_name(tmp_path: Path, overrides: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(".", r"\.")):
        config(tmp_path, *overrides)


def test_remote_only_and_hub_configs_are_valid(tmp_path: Path) -> None:
    cfg = config(tmp_path, "sampler.num_samplers=0", "supervisor.listen=tcp://127.0.0.1:5555")
    assert cfg.sampler.num_samplers == 0
    assert config(tmp_path, "sampler.num_samplers=0", "supervisor.mode=hub").supervisor.mode == "hub"


def test_one_socket_serves_ipc_and_tcp_peers(tmp_path: Path) -> None:
    async def body() -> None:
        ctx = zmq.asyncio.Context()
        try:
            ipc = f"ipc://{tmp_path}/exp"
            pull = Channel(ctx, "experience", ipc, binding=True, encoder=Encoder("replay"),
                           also=("tcp://127.0.0.1:*",))
            assert pull.endpoints == (ipc, "tcp://127.0.0.1:*")
            tcp = pull.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
            assert tcp.startswith("tcp://127.0.0.1:")
            rows = np.zeros((4, 2 * 3 + 1 + 2), np.float32)
            for endpoint, name in ((ipc, "local"), (tcp, "remote")):
                push = Channel(ctx, "experience", endpoint, binding=False, encoder=Encoder(name))
                await push.send(Experience(rows, 3, 1, 4))
            senders = set()
            for _ in range(2):
                await pull.recv(timeout=5)
                senders.add(pull.last_sender)
            assert senders == {"local", "remote"}
        finally:
            ctx.destroy(linger=0)
    run(body())


# ------------------------------------------------------------------ health

def test_health_socket_answers_with_the_state(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/health"
    state = {"now": "running", "detail": ""}

    async def body() -> None:
        ctx = zmq.asyncio.Context()
        task = asyncio.create_task(serve_health(ctx, endpoint, Encoder("svc"), lambda: state["now"],
                                                lambda: state["detail"]))
        try:
            assert await asyncio.to_thread(probe, endpoint, 5) == (True, "running")
            state["detail"] = "compiled update steps"  # a learner's addition
            assert await asyncio.to_thread(probe, endpoint, 5) == (True, "running; compiled update steps")
            state["now"] = "stopping"
            assert await asyncio.to_thread(probe, endpoint, 5) == (False, "stopping; compiled update steps")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            ctx.destroy(linger=0)
    run(body(), timeout=15)
    ok, detail = probe(f"ipc://{tmp_path}/nobody", timeout=0.5)
    assert not ok and "no answer" in detail


@pytest.mark.parametrize("raw", ["soon", "0", "-3"])
def test_register_timeout_refused_by_name(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from spreeze.common.service import ENV_REGISTER_TIMEOUT, register_timeout

    monkeypatch.setenv(ENV_REGISTER_TIMEOUT, raw)
    with pytest.raises(ConfigError, match=f"{ENV_REGISTER_TIMEOUT}='{raw}'"):
        register_timeout()
    monkeypatch.setenv(ENV_REGISTER_TIMEOUT, "2.5")
    assert register_timeout() == 2.5


# ------------------------------------------------------------------ a supervisor that restarted or finished

def service_process(endpoint: str, sid: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SPREEZE_CONTROL": endpoint, "SPREEZE_SERVICE_ID": sid}
    return subprocess.Popen([sys.executable, "-m", "tests.idle_service"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(60)
def test_a_service_told_the_run_finished_exits_0_and_one_unknown_to_a_restarted_supervisor_registers_again(
        tmp_path: Path) -> None:
    from spreeze.common.config import to_dict
    from spreeze.proto.messages import FINISHED, UNREGISTERED, Error, Welcome

    endpoint = f"ipc://{tmp_path}/control"

    async def body() -> tuple[int, int, str]:
        ctx = zmq.asyncio.Context()
        control = Channel(ctx, "control", endpoint, binding=True, encoder=Encoder("supervisor"))
        late = service_process(endpoint, "late-0")
        peer, msg = await control.recv(timeout=30)
        assert isinstance(msg, Register) and msg.service_id == "late-0"
        await control.send(Error(FINISHED, "the run in 'runs/x' has finished (budget reached)", msg.TYPE), to=peer)
        finished = await asyncio.to_thread(late.wait, 30)

        known = service_process(endpoint, "idle-0")
        peer, msg = await control.recv(timeout=30)
        assert isinstance(msg, Register)
        welcome = Welcome("idle-0", {"control": endpoint, "metrics_in": f"ipc://{tmp_path}/metrics"},
                          to_dict(config(tmp_path)), 0.2)
        await control.send(welcome, to=peer)
        peer, msg = await control.recv(timeout=30)  # its heartbeats
        assert isinstance(msg, Heartbeat)
        # as a restarted supervisor: it does not know idle-0, and asks it to register again
        await control.send(Error(UNREGISTERED, "'idle-0' is not registered (it restarted)", msg.TYPE), to=peer)
        while True:
            peer, msg = await control.recv(timeout=30)
            if isinstance(msg, Register):
                break
        assert msg.service_id == "idle-0" and msg.role == "idle"
        # that registration is lost (as with a connection the restart broke): no Welcome; it asks
        # again once its liveness time (5 heartbeats) has passed without one
        asked = time.monotonic()
        while True:
            peer, msg = await control.recv(timeout=30)
            if isinstance(msg, Register):
                break
            await control.send(Error(UNREGISTERED, "'idle-0' is not registered (it restarted)", msg.TYPE), to=peer)
        assert time.monotonic() - asked >= 0.9
        await control.send(welcome, to=peer)
        peer, msg = await control.recv(timeout=30)
        assert isinstance(msg, Heartbeat) and msg.state == "running"  # goes on with the new supervisor
        known.terminate()
        rejoined = await asyncio.to_thread(known.wait, 30)
        out = (late.stdout.read() if late.stdout else "") + (known.stdout.read() if known.stdout else "")
        control.close()
        ctx.destroy(linger=0)
        return finished, rejoined, out

    finished, rejoined, out = run(body(), timeout=60)
    assert finished == 0 and "nothing to do: the run in 'runs/x' has finished" in out, out
    assert rejoined == 0 and "registered again with the restarted supervisor" in out, out
