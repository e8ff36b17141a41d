"""common/weights.py: dense and sparse messages over the wire, publisher cache, follower."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.asyncio

from spreeze.proto.codec import Encoder, decode
from spreeze.common.errors import TransportTimeout
from spreeze.common.transport import Channel
from spreeze.common.weights import WeightsFollower, WeightsPublisher, dense_message, sparse_message, to_state
from spreeze.proto.messages import Weights, from_envelope, to_frames
from tests.helpers import Harness, config, run

pytestmark = pytest.mark.timeout(10)
RNG = np.random.default_rng(0)


def wire(msg: Weights) -> Weights:
    """Encode, copy every frame to bytes (as the socket does), decode."""
    frames = [bytes(memoryview(f)) for f in to_frames(msg, Encoder("learner"))]
    out = from_envelope(decode(frames))
    assert isinstance(out, Weights)
    return out


def state() -> dict[str, np.ndarray]:
    w = RNG.standard_normal((8, 5)).astype(np.float32)
    w[RNG.random((8, 5)) < 0.8] = 0.0
    return {"w": w, "b": RNG.standard_normal(8).astype(np.float32), "z": np.zeros((2, 3), np.float32)}


def test_dense_message_round_trips() -> None:
    s = state()
    got = wire(dense_message("actor", 3, 6, s, {"alpha": 0.25}))
    assert (got.net, got.version, got.updates, got.extras) == ("actor", 3, 6, {"alpha": 0.25})
    back = to_state(got)
    assert back.keys() == s.keys()
    for k in s:
        np.testing.assert_array_equal(back[k], s[k])


def test_sparse_message_round_trips_as_zeros_plus_idx_val() -> None:
    s = state()
    msg = sparse_message("critic", 2, 2, s, sparse={"w", "z"})
    assert set(msg.dense) == {"b"} and msg.shapes == {"w": [8, 5], "z": [2, 3]}
    nz = np.flatnonzero(s["w"])
    assert msg.idx["w"].dtype == np.int32 and msg.idx["w"].tolist() == nz.tolist()
    assert msg.val["w"].tolist() == s["w"].reshape(-1)[nz].tolist()
    assert len(msg.idx["z"]) == 0
    back = to_state(wire(msg))
    for k in s:
        assert back[k].shape == s[k].shape and back[k].dtype == np.float32
        np.testing.assert_array_equal(back[k], s[k])


def test_sparse_tensor_without_values_is_refused() -> None:
    msg = Weights("actor", 1, 1, idx={"w": np.zeros(1, np.int32)}, shapes={"w": [2]})
    with pytest.raises(ValueError, match="'w' lacks idx or val"):
        to_state(msg)


def published(*specs: tuple[str, int]) -> list[Weights]:
    return [dense_message(net, v, v, {"x": np.full(2, v, np.float32)}) for net, v in specs]


def test_follower_poll_keeps_the_newest_per_net() -> None:
    """inproc delivers at send time, so every message is queued before poll()."""
    ctx = zmq.asyncio.Context()
    try:
        pub = Channel(ctx, "weights", "inproc://w-poll", binding=True, encoder=Encoder("learner"))
        follower = WeightsFollower(Channel(ctx, "weights", "inproc://w-poll", binding=False,
                                           encoder=Encoder("sampler")))
        assert pub.now.recv()[:1] == b"\x01"  # the subscription reached the XPUB
        for msg in published(("actor", 1), ("actor", 3), ("critic", 5), ("actor", 2), ("critic", 4)):
            assert pub.send_nowait(msg)
        newest = follower.poll()
        assert {k: m.version for k, m in newest.items()} == {"actor": 3, "critic": 5}
        assert follower.received == 5 and follower.poll() == {}
        pub.send_nowait(published(("actor", 7))[0])
        assert follower.poll()["actor"].version == 7
    finally:
        ctx.destroy(linger=0)


def test_late_subscriber_gets_the_newest_of_every_net(tmp_path: Path) -> None:
    """The last-value cache: a (re)joining subscriber gets actor AND actor_target at once."""
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            pub = WeightsPublisher(h.channel("weights", binding=True, name="actor_sync", sender="actor_learner"))
            h.start(pub.serve_joins())
            for msg in published(("actor", 1), ("actor_target", 1), ("actor", 2), ("actor_target", 2)):
                pub.publish(msg)
            follower = WeightsFollower(h.channel("weights", binding=False, name="actor_sync"))
            seen: dict[str, int] = {}
            deadline = time.monotonic() + 3
            while len(seen) < 2 and time.monotonic() < deadline:
                await follower.channel.sock.poll(100, zmq.POLLIN)
                seen.update({k: m.version for k, m in follower.poll().items()})
            assert seen == {"actor": 2, "actor_target": 2}
            assert pub.published == 4
    run(body())


def test_follower_wait_times_out(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            h.channel("weights", binding=True, name="actor_weights")
            follower = WeightsFollower(h.channel("weights", binding=False, name="actor_weights"))
            with pytest.raises(TransportTimeout, match="no actor weights"):
                await follower.wait("actor", 0.1)
    run(body())
