"""Shared pieces of the service unit tests: a supervisor stand-in with real sockets.

`Harness` owns a real zmq.asyncio.Context, a short private ipc:// directory holding every
endpoint of a run, and a control ROUTER bound where the supervisor's would be. `build()`
makes a service exactly as `spreeze.common.service._main` does after registration (a DEALER with
the service id as identity, and a Welcome carrying the endpoints and the config).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import zmq
import zmq.asyncio

from spreeze.common.algorithms.base import ActorPart, CriticPart
from spreeze.common.algorithms.build import make_parts
from spreeze.proto.codec import Encoder
from spreeze.common.config import Config, load_config, to_dict
from spreeze.common.envs import env_spec
from spreeze.common.errors import TransportTimeout
from spreeze.common.service import Service
from spreeze.common.transport import Channel, ephemeral_ports, ipc_endpoint, make_ipc_dir
from spreeze.proto.messages import Experience, Message, Metrics, Register, TransitionLayout, Welcome
from spreeze.proto.names import SOCKETS as ENDPOINT_NAMES
from spreeze.services.supervisor.probe import CXX_HINT, cxx_compiler

# torch.compile builds C++ kernels: where no compiler runs (a bare Debian), tests of compiled
# steps skip, saying why; training itself plans eager updates there (services/supervisor/probe.py).
needs_cxx = pytest.mark.skipif(not cxx_compiler(), reason=f"no working C++ compiler or no Python headers: {CXX_HINT}")

S = TypeVar("S", bound=Service)
T = TypeVar("T")

SMALL = ["env=Pendulum-v1", "td3.hidden=[32,32]", "sac.hidden=[32,32]", "replay.capacity=5000",
         "replay.min_size=64", "sampler.warmup_steps=0", "sampler.envs_per_sampler=2",
         "sampler.steps_per_push=8", "learner.batch_size=32", "learner.prefetch=2", "learner.compile=false",
         "learner.batches_per_request=1",
         "eval.episodes=1", "eval.video_every=0", "supervisor.heartbeat_interval=0.05",
         "supervisor.liveness=40"]  # 2 s of silence: a busy machine (CI, a bare container) stalls a process for 0.25 s


def free_port_base(count: int = 4) -> int:
    """A port P with P..P+count-1 free right now, below the ephemeral range.

    Below it because a peer that keeps reconnecting to a local port nobody listens on yet
    (a service still starting, or restarting) can be given that very port as its own source
    port: TCP then connects the socket to itself and holds the port, and the service's bind
    fails for as long as that lasts."""
    low = ephemeral_ports()[0]
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(max(1024, low - 12000), low - count)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {count} consecutive free ports below {low}")


def config(run_dir: Path | str, *overrides: str) -> Config:
    """A small Pendulum config (later overrides win) with its run_dir set."""
    return load_config(None, [*SMALL, f"run_dir={run_dir}", *overrides])


def run(coro: Coroutine[Any, Any, T], timeout: float = 8.0) -> T:
    """Run one async test body with an overall deadline."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(probe: Callable[[], T | None], timeout: float = 3.0, what: str = "condition") -> T:
    """Poll `probe` on the event loop until it returns something truthy, or fail."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s")
        await asyncio.sleep(0.01)


async def recv_until(ch: Channel, accept: Callable[[Message], bool], timeout: float = 3.0) -> Message:
    """The first message on `ch` that `accept` takes, skipping others, within `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no accepted message on {ch.role} within {timeout}s")
        try:
            _, msg = await ch.recv(timeout=left)
        except TransportTimeout:
            continue
        if accept(msg):
            return msg


async def nothing_on(ch: Channel, seconds: float) -> None:
    """Assert that no message arrives on `ch` for `seconds`."""
    try:
        _, msg = await ch.recv(timeout=seconds)
    except TransportTimeout:
        return
    raise AssertionError(f"unexpected {msg!r:.200}")


class Harness:
    """A supervisor stand-in: context, endpoints in a short ipc dir, a control ROUTER."""

    def __init__(self, cfg: Config, heartbeat_interval: float | None = None) -> None:
        self.cfg = cfg
        self.heartbeat_interval = heartbeat_interval or cfg.supervisor.heartbeat_interval
        self.dir = make_ipc_dir("spzt-")
        self.endpoints = {name: ipc_endpoint(self.dir, name) for name in ENDPOINT_NAMES}
        self.ctx = zmq.asyncio.Context()
        self.encoder = Encoder("supervisor")
        self.router = Channel(self.ctx, "control", self.endpoints["control"], binding=True,
                              encoder=self.encoder)
        self.services: list[Service] = []
        self.tasks: list[asyncio.Task[Any]] = []

    def welcome(self, service_id: str) -> Welcome:
        return Welcome(service_id, dict(self.endpoints), to_dict(self.cfg), self.heartbeat_interval)

    def build(self, cls: type[S], service_id: str = "") -> S:
        sid = service_id or cls.ROLE
        encoder = Encoder(sid)
        control = Channel(self.ctx, "control", self.endpoints["control"], binding=False,
                          encoder=encoder, identity=sid)
        svc = cls(sid, self.welcome(sid), self.ctx, control, encoder)
        self.services.append(svc)
        return svc

    async def attach(self, cls: type[S], service_id: str = "") -> S:
        """build(), then the Register a real service sends first: a ROUTER drops messages
        to peers it has not heard from, so control tests must start with this."""
        svc = self.build(cls, service_id)
        await svc.control.send(Register(role=cls.ROLE, pid=os.getpid(), host="test",
                                        service_id=svc.service_id))
        await recv_until(self.router, lambda m: isinstance(m, Register) and m.service_id == svc.service_id)
        return svc

    def start(self, aw: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(aw)
        self.tasks.append(task)
        return task

    def channel(self, role: str, binding: bool, name: str | None = None, sender: str = "peer",
                **kw: Any) -> Channel:
        return Channel(self.ctx, role, self.endpoints[name or role], binding=binding,
                       encoder=Encoder(sender), **kw)

    def metrics(self) -> Channel:
        """The bus end services publish to (an XSUB bound on metrics_in), subscribed to all."""
        ch = self.channel("metrics_in", binding=True)
        ch.sock.send(b"\x01")  # XSUB: subscribe to everything by hand
        return ch

    async def stop(self, svc: Service, task: asyncio.Task[Any], timeout: float = 3.0) -> None:
        """Ask a serving service to stop and wait for its serve() to return."""
        svc.stopping.set()
        await asyncio.wait_for(task, timeout)

    async def close(self) -> None:
        for svc in self.services:
            svc.stopping.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for svc in self.services:
            for task in getattr(svc, "tasks", []):
                task.cancel()
        await asyncio.sleep(0)
        self.ctx.destroy(linger=0)
        shutil.rmtree(self.dir, ignore_errors=True)

    async def __aenter__(self) -> Harness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# ------------------------------------------------------------------ data

def layout_of(cfg: Config) -> TransitionLayout:
    return env_spec(cfg.env)[0]


def experience(layout: TransitionLayout, n: int, seed: int = 0, fill: float | None = None) -> Experience:
    """A batch of n plausible transitions (done = 0) in `layout`."""
    rng = np.random.default_rng(seed)
    m = rng.uniform(-1, 1, (n, layout.width)).astype(np.float32)
    layout.columns(m)["done"][:] = 0.0
    if fill is not None:
        m[:] = fill
    return Experience(m, layout.obs_dim, layout.act_dim, env_steps=n)


def parts(cfg: Config, seed: int = 1) -> tuple[ActorPart, CriticPart]:
    """Fresh split (unshared) algorithm parts fitting cfg's env, on CPU."""
    import torch

    layout, low, high = env_spec(cfg.env)
    return make_parts(cfg.algo, layout.obs_dim, layout.act_dim, low, high, cfg.algo_config,
                      torch.device("cpu"), shared=False, seed=seed)


def run_split(actor: ActorPart, critic: CriticPart, batches: list[dict[str, Any]], exchange: bool = True) -> None:
    """The split learners' schedule in one process: a critic step per batch, an actor step every
    `policy_delay` of them; with `exchange`, the two trade their states around each actor step."""
    for b in batches:
        critic.update(b)
        if critic.updates % actor.policy_delay == 0:
            if exchange:
                actor.load_critic(critic.critic_state())
            actor.update(b)
            if exchange:
                critic.load_actor(actor.actor_state(), actor.target_actor_state(), actor.extras())


def actor_policy(cfg: Config, part: ActorPart) -> dict[str, Any]:
    """The acting-policy description a learner publishes with `part`'s actor (its config's noise)."""
    from spreeze.common.policy_export import describe_actor

    return describe_actor(part.actor, cfg.algorithm.exploration_noise(cfg.algo_config))


def metric_from(service: str, key: str, want: Callable[[Any], bool]) -> Callable[[Message], bool]:
    """Accept Metrics of `service` whose `key` satisfies `want`."""
    return lambda m: (isinstance(m, Metrics) and m.service == service and key in m.values
                      and want(m.values[key]))
