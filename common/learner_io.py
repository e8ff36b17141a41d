"""What the learner services share: the batch stream from replay, and checkpoint files."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any

import torch

from spreeze.common.algorithms.base import Batch
from spreeze.common.errors import ConfigError, PeerError, TransportTimeout
from spreeze.common.running_stats import OBS_NORM_CLIP, OBS_NORM_EPS
from spreeze.common.transport import Channel
from spreeze.proto.messages import Error, SampledBatch, SampleRequest, TransitionLayout

# Frames from the wire may be read-only; the learner never writes into a batch.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class ObsNormalizer:
    """``clip((obs - mean) / sqrt(var + eps), -clip, clip)`` with the newest observation
    statistics replay sent (common/running_stats.py); mean 0 and variance 1 until then."""

    def __init__(self, obs_dim: int, device: torch.device) -> None:
        self.count = 0
        self.mean = torch.zeros(obs_dim, device=device)
        self.var = torch.ones(obs_dim, device=device)
        self.inv_std = torch.ones(obs_dim, device=device)

    def take(self, msg: SampledBatch) -> None:
        """The statistics of a reply, when it carries newer ones."""
        if not msg.obs_stats or msg.obs_count <= self.count:
            return
        self.count = msg.obs_count
        self.mean.copy_(torch.from_numpy(msg.obs_stats["mean"]))
        self.var.copy_(torch.from_numpy(msg.obs_stats["var"]))
        self.inv_std.copy_(torch.rsqrt(self.var + OBS_NORM_EPS))

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        return ((obs - self.mean) * self.inv_std).clamp_(-OBS_NORM_CLIP, OBS_NORM_CLIP)

    def state(self) -> dict[str, Any]:
        """What the actor's weights carry (``obs_norm.mean``, ``obs_norm.var``) and checkpoints keep."""
        return {"count": self.count, "mean": self.mean.cpu().numpy().copy(), "var": self.var.cpu().numpy().copy()}

    def load(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])
        self.mean.copy_(torch.as_tensor(state["mean"]))
        self.var.copy_(torch.as_tensor(state["var"]))
        self.inv_std.copy_(torch.rsqrt(self.var + OBS_NORM_EPS))


class BatchStream:
    """Keeps `prefetch` SampleRequests in flight and yields batches as torch tensors.

    Each request asks for `per_request` batches at once (one message, one gather in
    replay, one device copy); they are yielded one by one. Uniform sampling with
    replacement makes the slices of one big sample independent batches. Replies are sliced
    into batches of the *current* `batch_size` as they are used, so after a change every
    batch has the new size (a reply's rest smaller than a batch is dropped: a sample, not data).
    On CPU the tensor is a view of the received frame (no copy); on CUDA one pinned
    host-to-device copy per request, then the columns are views of the device matrix.
    When replay restarts (the socket reconnects) the requests it held are gone: ask again.
    With `normalizer` the requests ask for replay's observation statistics and each batch's
    ``obs`` and ``next_obs`` are normalised with the newest (new tensors: frames stay as sent).
    """

    def __init__(self, channel: Channel, layout: TransitionLayout, batch_size: int,
                 prefetch: int, device: torch.device, per_request: int = 1,
                 normalizer: ObsNormalizer | None = None) -> None:
        self.channel, self.layout, self.device = channel, layout, device
        self.normalizer = normalizer
        self.batch_size, self.prefetch, self.per_request = batch_size, prefetch, per_request
        self.next_id = 0
        self.in_flight = 0
        self.ready: deque[torch.Tensor] = deque()  # rows of replies not yet used
        self.asked: dict[int, int] = {}  # rows asked for per request in flight
        self.inserted = 0  # env steps replay had seen at the newest batch
        self.wait_s = 0.0  # time spent waiting for batches (transport + rate limiting)
        channel.watch_connects()

    async def request(self) -> None:
        if self.channel.reconnected():
            self.in_flight = 0  # held by a replay that is gone
            self.asked.clear()
        while self.in_flight < self.prefetch:
            self.next_id += 1
            self.asked[self.next_id] = self.batch_size * self.per_request
            await self.channel.send(SampleRequest(self.next_id, self.batch_size * self.per_request,
                                                  obs_stats=self.normalizer is not None))
            self.in_flight += 1

    async def next(self, stop: asyncio.Event) -> Batch | None:
        """Next batch, or None once `stop` is set."""
        await asyncio.sleep(0)  # a ready socket never yields: let heartbeats and control run
        if (batch := self.take()) is not None:
            return batch
        await self.request()
        t0 = time.perf_counter()
        try:
            while not stop.is_set():
                try:
                    _, msg = await self.channel.recv(timeout=0.2)
                except TransportTimeout:
                    await self.request()
                    continue
                if isinstance(msg, Error):
                    raise PeerError(f"replay refused a sample request: {msg.code}: {msg.detail}")
                if isinstance(msg, SampledBatch):
                    self.in_flight = max(0, self.in_flight - 1)
                    self.inserted = msg.inserted
                    if (rows := self.to_rows(msg)) is not None:
                        self.ready.append(rows)
                    if (batch := self.take()) is not None:
                        return batch
            return None
        finally:
            self.wait_s += time.perf_counter() - t0

    def take(self) -> Batch | None:
        """The next `batch_size` rows of the replies received, as columns (None: none left)."""
        while self.ready:
            rows = self.ready.popleft()
            if len(rows) < self.batch_size:
                continue  # the rest of a reply asked for at another batch size
            if len(rows) > self.batch_size:
                self.ready.appendleft(rows[self.batch_size:])
            return self.columns(rows[:self.batch_size])
        return None

    def columns(self, rows: torch.Tensor) -> Batch:
        """Transition rows [n, width] as the columns a batch holds (observations normalised
        where the learner normalises them): what a compiled step is warmed up on, too, so
        it is traced for the strides the real batches have."""
        batch: Batch = self.layout.columns(rows)  # type: ignore[assignment]
        if self.normalizer is not None:
            batch["obs"], batch["next_obs"] = self.normalizer(batch["obs"]), self.normalizer(batch["next_obs"])
        return batch

    def to_rows(self, msg: SampledBatch) -> torch.Tensor | None:
        m = torch.from_numpy(msg.transitions)
        asked = self.asked.pop(msg.request_id, None)
        if asked is None:
            return None  # a reply to a request made before replay restarted: asked again since
        if len(m) != asked:
            raise PeerError(f"replay answered request {msg.request_id} with {len(m)} rows, expected {asked}")
        if self.normalizer is not None:
            self.normalizer.take(msg)
        if self.device.type != "cpu":
            m = m.pin_memory().to(self.device, non_blocking=True)
        return m


def checkpoint_dir(run_dir: str) -> Path:
    return Path(run_dir) / "checkpoints"


def device_of(name: str) -> torch.device:
    """The torch device `name` (cpu, cuda, cuda:N), or for "auto" cuda where this process sees a
    GPU and cpu elsewhere (compose: each learner container sees only its own GPU)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"learner device {name!r} requested but CUDA is not available")
    return device
