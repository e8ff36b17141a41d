"""common/service.py: control commands, heartbeats, supervisor liveness, registration."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from spreeze.common import service as service_mod
from spreeze.proto.codec import Encoder
from spreeze.common.errors import ConfigError, PeerError, TransportTimeout
from spreeze.common.service import ENV_CONTROL, ENV_SERVICE_ID, Service, _main, _register
from spreeze.proto.messages import Control, ControlReply, Heartbeat, Register, Welcome
from tests.helpers import Harness, config, nothing_on, recv_until, run

pytestmark = pytest.mark.timeout(10)


class Idle(Service):
    """A service that only waits; `x` is settable to a positive int."""

    ROLE = "idle"
    closed = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.x = 1

    async def serve(self) -> None:
        await self.stopping.wait()

    def counters(self) -> dict[str, Any]:
        return {"x": self.x}

    def set_param(self, key: str, value: Any) -> None:
        if key != "x" or type(value) is not int or value <= 0:
            super().set_param(key, value)
        self.x = value

    async def close(self) -> None:
        Idle.closed = True


class Crashing(Idle):
    ROLE = "crashing"

    async def serve(self) -> None:
        raise RuntimeError("boom")


def is_reply(msg: Any) -> bool:
    return isinstance(msg, ControlReply)


def test_on_control_commands(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            svc = h.build(Idle)
            assert svc.on_control(Control("pause", 1)) == ControlReply(1, True)
            assert svc.paused
            assert svc.on_control(Control("resume", 2)).ok and not svc.paused
            assert svc.on_control(Control("set", 3, "x", 7)) == ControlReply(3, True)
            assert svc.x == 7
            bad = svc.on_control(Control("set", 4, "y", 1))
            assert not bad.ok and bad.request_id == 4 and "'y'" in bad.detail and "idle" in bad.detail
            assert svc.x == 7
            assert svc.on_control(Control("ping", 5)) == ControlReply(5, True)
            unknown = svc.on_control(Control("explode", 6))
            assert not unknown.ok and "'explode'" in unknown.detail
            assert svc.running
            assert svc.on_control(Control("shutdown", 8)) == ControlReply(8, True)
            assert not svc.running
    run(body())


def test_control_loop_answers_over_the_router(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            svc = await h.attach(Idle, "idle-1")
            h.start(svc.control_loop())
            for rid, cmd in enumerate(("ping", "explode", "pause")):
                await h.router.send(Control(cmd, rid), to=b"idle-1")
                reply = await recv_until(h.router, is_reply)
                assert isinstance(reply, ControlReply) and reply.request_id == rid
                assert reply.ok == (cmd != "explode"), reply
            assert svc.paused
            await h.router.send(Control("set", 9, "x", 3), to=b"idle-1")
            assert (await recv_until(h.router, is_reply)) == ControlReply(9, True)
            assert svc.x == 3
    run(body())


def test_heartbeats_reach_the_router_with_state_and_counters(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            svc = await h.attach(Idle, "idle-1")
            h.start(svc.heartbeats())
            h.start(svc.control_loop())
            peer, hb = await h.router.recv(timeout=2)
            assert peer == b"idle-1"
            assert hb == Heartbeat("idle-1", "running", {"x": 1})
            await h.router.send(Control("pause", 1), to=b"idle-1")
            paused = await recv_until(h.router, lambda m: isinstance(m, Heartbeat) and m.state == "paused")
            assert isinstance(paused, Heartbeat) and paused.service_id == "idle-1"
    run(body())


def test_silent_supervisor_makes_heartbeats_raise(tmp_path: Path) -> None:
    async def body() -> None:
        cfg = config(tmp_path, "supervisor.liveness=2")  # 2 x 0.05 s
        async with Harness(cfg) as h:
            svc = h.build(Idle)
            with pytest.raises(PeerError, match="no word from the supervisor"):
                await asyncio.wait_for(svc.heartbeats(), 2)
    run(body())


def test_pinged_service_stays_alive(tmp_path: Path) -> None:
    async def body() -> None:
        cfg = config(tmp_path, "supervisor.liveness=2")
        async with Harness(cfg) as h:
            svc = await h.attach(Idle, "idle-1")
            beats = h.start(svc.heartbeats())
            h.start(svc.control_loop())
            for i in range(12):  # 0.6 s, six liveness windows
                await h.router.send(Control("ping", i), to=b"idle-1")
                await asyncio.sleep(0.05)
            assert not beats.done(), beats
    run(body())


def test_a_service_whose_own_loop_was_busy_does_not_take_the_supervisor_for_dead(tmp_path: Path) -> None:
    """Pings queued while the loop was blocked (a long checkpoint write) prove the supervisor alive."""
    async def body() -> None:
        cfg = config(tmp_path, "supervisor.liveness=2")
        async with Harness(cfg) as h:
            svc = await h.attach(Idle, "idle-1")
            await h.router.send(Control("ping", 1), to=b"idle-1")
            time.sleep(0.3)  # the loop is stuck for three liveness windows; the ping waits in the socket
            await asyncio.sleep(0.01)
            beat = h.start(svc.heartbeats())  # wakes before the control loop has read the ping
            await asyncio.sleep(0.02)
            assert not beat.done(), beat
            h.start(svc.control_loop())
            await asyncio.sleep(0.05)
            assert not beat.done() and time.monotonic() - svc.supervisor_seen < 0.1
    run(body())


def test_register_times_out_without_welcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            monkeypatch.setenv(ENV_CONTROL, h.endpoints["control"])
            monkeypatch.setattr(service_mod, "REGISTER_TIMEOUT", 0.3)
            with pytest.raises(TransportTimeout):
                await _register(h.ctx, "idle", "idle-1", Encoder("idle-1"))
            peer, msg = await h.router.recv(timeout=1)  # the Register did arrive
            assert peer == b"idle-1" and isinstance(msg, Register) and msg.role == "idle"
    run(body())


def test_register_skips_other_messages_and_returns_the_welcome(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            monkeypatch.setenv(ENV_CONTROL, h.endpoints["control"])
            reg = asyncio.ensure_future(_register(h.ctx, "idle", "idle-1", Encoder("idle-1")))
            peer, msg = await h.router.recv(timeout=2)
            assert isinstance(msg, Register) and msg.service_id == "idle-1"
            await h.router.send(Control("ping", 1), to=peer)
            await h.router.send(h.welcome("idle-1"), to=peer)
            control, welcome = await asyncio.wait_for(reg, 2)
            assert isinstance(welcome, Welcome) and welcome.endpoints == h.endpoints
            control.close()
    run(body())


def test_missing_control_endpoint_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CONTROL, raising=False)

    async def body() -> None:
        ctx = zmq.asyncio.Context()
        try:
            with pytest.raises(ConfigError, match=ENV_CONTROL):
                await _register(ctx, "idle", "idle-1", Encoder("idle-1"))
        finally:
            ctx.destroy(linger=0)
    run(body())


def test_missing_endpoint_in_welcome_is_named(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            svc = h.build(Idle)
            with pytest.raises(ConfigError, match="'nowhere'"):
                svc.endpoint("nowhere")
    run(body())


async def _serve_main(h: Harness, cls: type[Service], monkeypatch: pytest.MonkeyPatch) -> asyncio.Task[None]:
    monkeypatch.setenv(ENV_CONTROL, h.endpoints["control"])
    monkeypatch.setenv(ENV_SERVICE_ID, "svc-1")
    main = asyncio.ensure_future(_main(cls))
    peer, msg = await h.router.recv(timeout=5)
    assert isinstance(msg, Register) and msg.role == cls.ROLE
    await h.router.send(h.welcome("svc-1"), to=peer)
    return main


def test_main_registers_heartbeats_and_exits_on_shutdown(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            Idle.closed = False
            main = await _serve_main(h, Idle, monkeypatch)
            assert isinstance(await recv_until(h.router, lambda m: isinstance(m, Heartbeat)), Heartbeat)
            await h.router.send(Control("shutdown", 1), to=b"svc-1")
            reply = await recv_until(h.router, is_reply)
            assert reply == ControlReply(1, True)
            await asyncio.wait_for(main, 3)
            assert Idle.closed
    run(body())


def test_main_reraises_a_crash_of_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[zmq.asyncio.Context] = []

    class Recorded(zmq.asyncio.Context):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            monkeypatch.setattr(zmq.asyncio, "Context", Recorded)
            main = await _serve_main(h, Crashing, monkeypatch)
            with pytest.raises(RuntimeError, match="boom"):
                await asyncio.wait_for(main, 3)
            # a crashed process just exits; in-process, free its context while the loop runs
            for ctx in made:
                ctx.destroy(linger=0)
    run(body())


def test_unknown_peer_gets_nothing_on_control(tmp_path: Path) -> None:
    """A control reply goes to the asking service only (ROUTER addressing)."""
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            a, b = await h.attach(Idle, "a"), await h.attach(Idle, "b")
            h.start(a.control_loop())
            h.start(b.control_loop())
            await h.router.send(Control("pause", 1), to=b"a")
            peer, _ = await h.router.recv(timeout=2)
            assert peer == b"a" and a.paused and not b.paused
            await nothing_on(h.router, 0.1)
    run(body())
