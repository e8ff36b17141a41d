"""Tests for common/transport.py: real processes over ipc:// and tcp://, bad peers, errors.

Child processes use the 'spawn' start method and run the functions below (importable as
tests.test_transport); a child reports failure through its exit code and stderr.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from multiprocessing.process import BaseProcess
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
import zmq.asyncio

from spreeze.proto.codec import PROTOCOL_VERSION, Encoder, decode
from spreeze.common.config import MAX_PREFETCH
from spreeze.common.errors import TransportTimeout
from spreeze.common.transport import (
    Channel, ipc_endpoint,
)
from spreeze.proto.messages import (
    Control, ControlReply, Error, Experience, Heartbeat, SampledBatch, SampleRequest,
    TransitionLayout, from_envelope,
)

OBS, ACT = 3, 2
WIDTH = TransitionLayout(OBS, ACT).width
SPAWN = mp.get_context("spawn")
CHILD_TIMEOUT = 30.0  # generous: spawning a child on a loaded 2-core machine takes seconds


# ------------------------------------------------------------------ child processes

def run_sample_client(endpoint: str, n: int) -> None:
    """Child: send n pipelined SampleRequests, check every SampledBatch, then shut the server down."""
    asyncio.run(_sample_client(endpoint, n))


async def _sample_client(endpoint: str, n: int) -> None:
    ctx = zmq.asyncio.Context()
    ch = Channel(ctx, "sample", endpoint, binding=False, encoder=Encoder("learner-1"))
    try:
        # pipelined like a learner, never more in flight than the sockets queue (MAX_PREFETCH):
        # beyond the HWM the server would wait on this client's pipe
        window = MAX_PREFETCH

        def request(i: int) -> SampleRequest:  # batch i has 8 + i rows, every value i
            return SampleRequest(request_id=i, batch_size=8 + i)

        for i in range(min(n, window)):
            await ch.send(request(i))
        seen = set()
        for k in range(n):
            _, msg = await ch.recv(timeout=CHILD_TIMEOUT)
            assert isinstance(msg, SampledBatch), msg
            assert msg.transitions.shape == (8 + msg.request_id, WIDTH)
            assert (msg.transitions == msg.request_id).all()
            seen.add(msg.request_id)
            if k + window < n:  # a reply freed a slot: keep the window full
                await ch.send(request(k + window))
        assert seen == set(range(n)), seen
        await ch.send(Control("shutdown", request_id=n))
        _, reply = await ch.recv(timeout=CHILD_TIMEOUT)
        assert isinstance(reply, ControlReply) and reply.ok and reply.request_id == n, reply
    finally:
        ch.close()
        ctx.destroy(linger=0)


def run_good_sampler(endpoint: str, n: int, batch: int) -> None:
    """Child: push n Experience batches; every value of batch i is i."""
    asyncio.run(_good_sampler(endpoint, n, batch))


async def _good_sampler(endpoint: str, n: int, batch: int) -> None:
    ctx = zmq.asyncio.Context()
    ch = Channel(ctx, "experience", endpoint, binding=False, encoder=Encoder("good-sampler"))
    try:
        for i in range(1, n + 1):
            m = np.full((batch, WIDTH), i, np.float32)
            m[:, -1] = 0.0  # done: 0 or 1 only
            await ch.send(Experience(m, OBS, ACT, env_steps=i * batch))
            await asyncio.sleep(0.002)  # spread out, so good and bad messages interleave
    finally:
        ch.close()  # PUSH lingers (ROLES) until its queue is flushed
        ctx.term()


def garbage_messages() -> list[tuple[str, list[bytes]]]:
    """(expected error code, frames) for each message a misbehaving peer sends."""
    rng = np.random.default_rng(1)
    head = {"v": PROTOCOL_VERSION, "type": "experience", "sender": "bad", "session": "x", "seq": 1,
            "ts": 0.0, "arrays": [["transitions", "float32", [1, WIDTH]]],
            "body": {"obs_dim": OBS, "act_dim": ACT, "env_steps": 1}}
    row = np.zeros((1, WIDTH), np.float32).tobytes()
    out: list[tuple[str, list[bytes]]] = []
    for i in range(5):
        junk = b"\xc1" + rng.bytes(int(rng.integers(0, 200)))  # 0xc1 is never valid msgpack
        out.append(("header", [junk, rng.bytes(8)]))
        out.append(("version", [msgpack.packb({**head, "v": 99 + i}), row]))
        bad_dtype = {**head, "arrays": [["transitions", "float128", [1, WIDTH]]]}
        out.append(("array", [msgpack.packb(bad_dtype), row + row]))
    return out


def run_bad_sampler(endpoint: str) -> None:
    """Child: a misbehaving peer sending raw frames that break the protocol."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)  # the connecting end of ROLES["experience"]
    sock.connect(endpoint)
    for _, frames in garbage_messages():
        sock.send_multipart(frames)
        time.sleep(0.002)
    sock.close(linger=5000)
    ctx.term()


# ------------------------------------------------------------------ helpers

def start(target: Any, *args: Any) -> BaseProcess:
    proc = SPAWN.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


async def join(proc: BaseProcess, timeout: float = CHILD_TIMEOUT) -> int | None:
    """Wait for a child without blocking the event loop; kill it if it overstays."""
    deadline = time.monotonic() + timeout
    while proc.is_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
    return proc.exitcode


def endpoint_for(kind: str, ipc_dir: str) -> str:
    return ipc_endpoint(ipc_dir, "sample") if kind == "ipc" else "tcp://127.0.0.1:*"


def bound(ch: Channel) -> str:
    """The endpoint a channel actually bound (resolves tcp port '*')."""
    return ch.sock.getsockopt(zmq.LAST_ENDPOINT).decode()


# ------------------------------------------------------------------ real processes

async def _serve_samples(ch: Channel, client: BaseProcess) -> int:
    served = 0
    while True:
        try:
            peer, msg = await ch.recv(timeout=CHILD_TIMEOUT)
        except TransportTimeout:
            if client.is_alive() and served == 0:  # still starting (spawn + imports under load)
                continue
            raise AssertionError(f"the client went quiet after {served} batches "
                                 f"(alive {client.is_alive()}, exit code {client.exitcode})") from None
        if isinstance(msg, SampleRequest):
            m = np.full((msg.batch_size, WIDTH), msg.request_id, np.float32)
            await ch.send(SampledBatch(msg.request_id, m, OBS, ACT), to=peer)
            served += 1
        elif isinstance(msg, Control) and msg.command == "shutdown":
            await ch.send(ControlReply(msg.request_id, True), to=peer)
            return served


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["ipc", "tcp"])
def test_request_reply_between_processes(kind: str, ipc_dir: str) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        server = Channel(ctx, "sample", endpoint_for(kind, ipc_dir), binding=True, encoder=Encoder("replay"))
        # hundreds of round trips: enough that under CPU load a ROUTER that dropped replies would
        # lose one (libzmq does, with one in flight, unless ROUTER_MANDATORY)
        proc = start(run_sample_client, bound(server), 400)
        try:
            assert await _serve_samples(server, proc) == 400
            assert await join(proc) == 0
            assert not server.errors
        finally:
            server.close()
            ctx.destroy(linger=0)
            if proc.is_alive():
                proc.kill()
    asyncio.run(main())


@pytest.mark.timeout(60)
def test_bad_peer_does_not_stop_good_peer(ipc_dir: str) -> None:
    n, batch = 40, 64
    bad = garbage_messages()

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        # a deep receive queue: every garbage frame must arrive while the test joins the children
        pull = Channel(ctx, "experience", ipc_endpoint(ipc_dir, "exp"), binding=True,
                       encoder=Encoder("replay"), hwm=1000)
        procs = [start(run_good_sampler, pull.endpoint, n, batch), start(run_bad_sampler, pull.endpoint)]
        try:
            got = [await pull.recv(timeout=CHILD_TIMEOUT) for _ in range(n)]
            assert [await join(p) for p in procs] == [0, 0]
            with pytest.raises(TransportTimeout):  # the rest of the garbage, then nothing
                await pull.recv(timeout=0.5)
        finally:
            pull.close()
            ctx.destroy(linger=0)
            for p in procs:
                if p.is_alive():
                    p.kill()
        msgs = [m for _, m in got]
        assert all(isinstance(m, Experience) for m in msgs)
        assert [m.env_steps for m in msgs] == [i * batch for i in range(1, n + 1)]  # type: ignore[attr-defined]
        assert all((m.transitions[:, :-1] == i).all() for i, m in enumerate(msgs, 1))  # type: ignore[attr-defined]
        want: dict[str, int] = {}
        for code, _ in bad:
            want[code] = want.get(code, 0) + 1
        assert dict(pull.errors) == want
        # counted per sender too: by the header's sender where it could be read, "?" where not
        assert dict(pull.sender_errors) == {("?", "header"): 5, ("bad", "version"): 5, ("bad", "array"): 5}
        assert pull.error_metrics()["errors/bad/version"] == 5 and pull.error_metrics()["errors/header"] == 5
    asyncio.run(main())


@pytest.mark.timeout(20)
def test_error_replies_name_the_refused_message_whenever_its_header_is_readable(ipc_dir: str) -> None:
    """`ref_type` and `ref_seq` come from the bad message's header whenever it decodes that far
    (a wrong version, a bad array, a bad body); "" and -1 only when frame 0 is not a map."""
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router = Channel(ctx, "sample", ipc_endpoint(ipc_dir, "r"), binding=True, encoder=Encoder("replay"))
        rogue = ctx.socket(zmq.DEALER)
        rogue.connect(router.endpoint)
        head = {"v": PROTOCOL_VERSION, "type": "sample_request", "sender": "rogue", "session": "s", "seq": 7,
                "ts": 0.0, "arrays": [], "body": {"request_id": 3, "batch_size": 4}}
        cases = [([b"\xc1"], "header", "", -1),
                 ([msgpack.packb({**head, "v": 2})], "version", "sample_request", 7),
                 ([msgpack.packb({**head, "seq": 8, "arrays": [["x", "float128", [1]]]}), b"12345678"],
                  "array", "sample_request", 8),
                 ([msgpack.packb({**head, "seq": 9, "body": {"request_id": 3, "batch_size": 0}})],
                  "schema", "sample_request", 9),
                 ([msgpack.packb({**head, "seq": 10, "body": {"request_id": "three", "batch_size": 4}})],
                  "schema", "sample_request", 10)]
        try:
            for frames, code, ref_type, ref_seq in cases:
                await rogue.send_multipart(frames)
                with pytest.raises(TransportTimeout):
                    await router.recv(timeout=0.2)
                assert await rogue.poll(5000)
                reply = from_envelope(decode(await rogue.recv_multipart(copy=False)))
                assert isinstance(reply, Error), reply
                assert (reply.code, reply.ref_type, reply.ref_seq) == (code, ref_type, ref_seq), reply
            assert router.sender_errors[("rogue", "schema")] == 2 and router.sender_errors[("?", "header")] == 1
        finally:
            rogue.close(linger=0)
            ctx.destroy(linger=0)
    asyncio.run(main())


# ------------------------------------------------------------------ in-process sockets

@pytest.mark.timeout(20)
def test_router_answers_a_bad_request_with_an_error(ipc_dir: str) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        router = Channel(ctx, "sample", ipc_endpoint(ipc_dir, "s"), binding=True, encoder=Encoder("replay"))
        good = Channel(ctx, "sample", router.endpoint, binding=False, encoder=Encoder("good"))
        rogue = ctx.socket(zmq.DEALER)
        rogue.connect(router.endpoint)
        try:
            await rogue.send_multipart([b"\xc1not msgpack"])
            with pytest.raises(TransportTimeout):
                await router.recv(timeout=0.5)  # the bad request is dropped, never returned
            assert await rogue.poll(5000)
            reply = from_envelope(decode(await rogue.recv_multipart(copy=False)))
            assert isinstance(reply, Error) and reply.code == "header", reply
            assert "msgpack" in reply.detail
            assert dict(router.errors) == {"header": 1}
            await good.send(SampleRequest(1, 4))  # the router still serves everyone
            peer, msg = await router.recv(timeout=5)
            assert msg == SampleRequest(1, 4) and peer is not None
            await router.send(SampledBatch(1, np.zeros((4, WIDTH), np.float32), OBS, ACT), to=peer)
            _, batch = await good.recv(timeout=5)
            assert isinstance(batch, SampledBatch) and batch.request_id == 1
            assert not await rogue.poll(100)  # the answer went to the good peer only
        finally:
            rogue.close(linger=0)
            ctx.destroy(linger=0)
    asyncio.run(main())


@pytest.mark.timeout(20)
def test_unknown_message_type_is_counted_and_skipped(ipc_dir: str) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        pull = Channel(ctx, "experience", ipc_endpoint(ipc_dir, "e"), binding=True, encoder=Encoder("r"))
        push = ctx.socket(zmq.DEALER)
        push.connect(pull.endpoint)
        try:
            enc = Encoder("future-sampler")
            await push.send_multipart(enc.encode("teleport", {"x": 1}))
            await push.send_multipart(enc.encode("heartbeat", {"service_id": "s", "state": "running"}))
            _, msg = await pull.recv(timeout=5)
            assert msg == Heartbeat("s", "running")
            assert dict(pull.errors) == {"unknown_type": 1}
        finally:
            push.close(linger=0)
            ctx.destroy(linger=0)
    asyncio.run(main())


@pytest.mark.timeout(20)
def test_recv_many_drains_queued_messages(ipc_dir: str) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        pull = Channel(ctx, "experience", ipc_endpoint(ipc_dir, "e"), binding=True, encoder=Encoder("r"),
                       hwm=100)
        push = Channel(ctx, "experience", pull.endpoint, binding=False, encoder=Encoder("s"), hwm=100)
        try:
            for i in range(5):
                await push.send(Heartbeat(f"s{i}", "running"))
            deadline = time.monotonic() + 5  # until all five are queued at the receiver
            while time.monotonic() < deadline and pull.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN == 0:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            got = await pull.recv_many(3, timeout=5)
            assert [m.service_id for _, m in got] == ["s0", "s1", "s2"]  # type: ignore[attr-defined]
            got = await pull.recv_many(10, timeout=5)
            assert [m.service_id for _, m in got] == ["s3", "s4"]  # type: ignore[attr-defined]
        finally:
            ctx.destroy(linger=0)
    asyncio.run(main())


@pytest.mark.timeout(20)
def test_send_nowait_reports_a_full_queue(ipc_dir: str) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        push = Channel(ctx, "experience", ipc_endpoint(ipc_dir, "nobody"), binding=False,
                       encoder=Encoder("s"), hwm=2)
        try:  # nobody receives: the queue fills at the HWM and PUSH must not block or drop
            results = [push.send_nowait(Heartbeat("s", "running")) for _ in range(10)]
            assert results[0] is True
            assert results[-1] is False, results
        finally:
            ctx.destroy(linger=0)
    asyncio.run(main())


@pytest.mark.timeout(30)
def test_a_router_never_drops_a_reply_silently() -> None:
    """A ROUTER's pipe to a peer that does not read fills up: send_nowait says so, an awaited
    send waits for room (then gives up, saying so), and every reply reported sent arrives.
    A peer that is gone: both say False and nothing raises."""
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        server = Channel(ctx, "sample", "inproc://router-full", binding=True, encoder=Encoder("replay"))
        client = Channel(ctx, "sample", "inproc://router-full", binding=False, encoder=Encoder("learner-1"))
        try:
            await client.send(SampleRequest(request_id=1, batch_size=1))
            peer, _ = await server.recv(timeout=5)
            assert peer is not None

            def reply(i: int) -> SampledBatch:
                return SampledBatch(i, np.full((1, WIDTH), i, np.float32), OBS, ACT)

            queued = 0
            while server.send_nowait(reply(queued), to=peer):
                queued += 1
                assert queued < 1000, "the pipe never filled"
            waiting = asyncio.ensure_future(server.send(reply(queued), to=peer))
            await asyncio.sleep(0.2)
            assert not waiting.done()  # full: waits instead of dropping
            got = [(await client.recv(timeout=5))[1] for _ in range(queued)]
            assert await asyncio.wait_for(waiting, 5) is True  # reading made room: sent
            got.append((await client.recv(timeout=5))[1])
            assert [m.request_id for m in got] == list(range(queued + 1))  # type: ignore[attr-defined]
            with pytest.raises(TransportTimeout):
                await client.recv(timeout=0.2)

            while server.send_nowait(reply(0), to=peer):  # full again; nobody reads now
                pass
            t0 = time.monotonic()
            assert await server.send(reply(0), to=peer) is False  # waited its patience, then dropped
            assert time.monotonic() - t0 >= 1.0

            assert server.send_nowait(reply(0), to=b"nobody") is False
            assert await server.send(reply(0), to=b"nobody") is False
        finally:
            ctx.destroy(linger=0)
    asyncio.run(main())


@pytest.mark.timeout(10)
def test_recv_timeout_raises_transport_timeout(ipc_dir: str) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        pull = Channel(ctx, "experience", ipc_endpoint(ipc_dir, "e"), binding=True, encoder=Encoder("r"))
        try:
            t0 = time.monotonic()
            with pytest.raises(TransportTimeout, match=r"experience .*within 0.2s"):
                await pull.recv(timeout=0.2)
            assert 0.15 <= time.monotonic() - t0 < 2.0
        finally:
            ctx.destroy(linger=0)
    asyncio.run(main())


@pytest.mark.timeout(20)
def test_reconnected_reports_a_restarted_peer_once(ipc_dir: str) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        endpoint = ipc_endpoint(ipc_dir, "s")
        try:
            first = Channel(ctx, "sample", endpoint, binding=True, encoder=Encoder("replay"))
            dealer = Channel(ctx, "sample", endpoint, binding=False, encoder=Encoder("learner"))
            await dealer.send(SampleRequest(1, 4))
            await first.recv(timeout=5)  # connected before anyone watches (as in the services)
            dealer.watch_connects()
            await asyncio.sleep(0.2)
            assert not dealer.reconnected()
            first.close()
            second = Channel(ctx, "sample", endpoint, binding=True, encoder=Encoder("replay-2"))
            deadline = time.monotonic() + 10
            while not dealer.reconnected():
                assert time.monotonic() < deadline, "the reconnection was not seen"
                await asyncio.sleep(0.05)
            assert not dealer.reconnected()  # reported once
            await dealer.send(SampleRequest(2, 4))
            _, msg = await second.recv(timeout=5)
            assert msg == SampleRequest(2, 4)
        finally:
            ctx.destroy(linger=0)
    asyncio.run(main())
