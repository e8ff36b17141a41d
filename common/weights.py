"""Weights over the wire: last-value-cached publishing and newest-only following.

The publisher binds an XPUB socket with XPUB_VERBOSE: every (re)subscription reaches
it, and it answers by re-sending its newest message of each net, so a late joiner (a restarted or
remote sampler) gets current weights at once (zguide's last-value cache). Followers
drain their SUB socket and keep only the newest version.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import numpy as np
import zmq

from spreeze.common.errors import TransportTimeout
from spreeze.common.transport import Channel
from spreeze.proto.messages import Weights

if TYPE_CHECKING:
    from spreeze.common.algorithms.base import State

log = logging.getLogger(__name__)


def dense_message(net: str, version: int, updates: int, state: State,
                  extras: dict[str, float] | None = None) -> Weights:
    return Weights(net=net, version=version, updates=updates, dense=state, extras=extras or {})


def sparse_message(net: str, version: int, updates: int, state: State, sparse: set[str],
                   extras: dict[str, float] | None = None) -> Weights:
    """Tensors named in `sparse` travel as (int32 flat indices, float32 values)."""
    dense, idx, val, shapes = {}, {}, {}, {}
    for name, arr in state.items():
        if name in sparse:
            flat = arr.reshape(-1)
            nz = np.flatnonzero(flat).astype(np.int32)
            idx[name], val[name], shapes[name] = nz, flat[nz].astype(np.float32), list(arr.shape)
        else:
            dense[name] = arr
    return Weights(net=net, version=version, updates=updates, dense=dense, idx=idx, val=val,
                   shapes=shapes, extras=extras or {})


def weights_message(net: str, version: int, updates: int, state: State,
                    sparse: list[str] | set[str] | None = None,
                    extras: dict[str, float] | None = None) -> Weights:
    """A sparse message for the tensors named in `sparse` that are smaller that way, else dense.

    A non-zero costs 8 bytes sparse (int32 index + float32 value) against 4 bytes per entry
    dense, so only tensors less than half full travel sparse.
    """
    names = {n for n in sparse or () if n in state and 2 * np.count_nonzero(state[n]) < state[n].size}
    if not names:
        return dense_message(net, version, updates, state, extras)
    return sparse_message(net, version, updates, state, names, extras)


def to_state(msg: Weights) -> State:
    """Dense tensors of a Weights message (sparse ones scattered into zeros)."""
    state = dict(msg.dense)
    for name, shape in msg.shapes.items():
        if name not in msg.idx or name not in msg.val:
            raise ValueError(f"weights {msg.net}: sparse tensor {name!r} lacks idx or val")
        out = np.zeros(int(np.prod(shape)), np.float32)
        out[msg.idx[name]] = msg.val[name]
        state[name] = out.reshape(shape)
    return state


class WeightsPublisher:
    """Publishes weights; re-sends the newest of each net to every new subscriber."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.latest: dict[str, Weights] = {}  # newest per net: one publisher may carry several
        self.published = 0

    def publish(self, msg: Weights) -> None:
        self.latest[msg.net] = msg
        self.channel.send_nowait(msg)  # XPUB drops for slow subscribers: only the newest matters
        self.published += 1

    async def serve_joins(self) -> None:
        """Task: answer each subscription with the cached newest message of every net."""
        sock = self.channel.sock
        while True:
            frame = await sock.recv()
            if frame[:1] == b"\x01":
                for msg in self.latest.values():
                    self.channel.send_nowait(msg)


class WeightsFollower:
    """Keeps the newest Weights per net seen on a SUB socket."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.received = 0

    def poll(self) -> dict[str, Weights]:
        """Drain without blocking; newest message per net (empty if nothing new)."""
        newest: dict[str, Weights] = {}
        while True:
            try:
                got = self.channel.recv_nowait()
            except zmq.Again:
                return newest
            if got is None or not isinstance(got[1], Weights):
                continue
            msg = got[1]
            self.received += 1
            old = newest.get(msg.net)
            if old is None or msg.version >= old.version:
                newest[msg.net] = msg

    async def wait(self, net: str, timeout: float) -> Weights:
        """Block (with timeout) until a message of `net` arrives."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            got = self.poll().get(net)
            if got is not None:
                return got
            left = deadline - asyncio.get_running_loop().time()
            await self.channel.sock.poll(max(1, int(min(left, 0.1) * 1000)), zmq.POLLIN)
            if left <= 0:
                raise TransportTimeout(f"no {net} weights on {self.channel.endpoint} within {timeout}s")

