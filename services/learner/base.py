"""The parts every learner service shares: model parts, batches, publishing, checkpoints.

A learner checkpoints its full state (networks, optimizers, temperature, noise RNGs,
update counters, weight versions) into checkpoints/<role>.pt every checkpoint_every_s
and on shutdown (SIGTERM included), and restores it at start when it exists: after a
crash the supervisor's restart continues from there, and so does `spreeze train --resume`.

With `learner.compile` (the default) each part's update is a compiled step
(common/algorithms/steps.py). It compiles in a worker thread on dummy batches as soon as
the parts exist, while replay still fills with random warm-up steps and the learner has
nothing else to do; the event loop keeps heartbeating meanwhile, and the first update waits
for it. Compiled kernels are cached on disk (`learner.compile_cache`), so a second run
compiles in a fraction of the time. `compile_s` and `compiles` go out with the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import torch
# torch.optim imports torch._dynamo on the first optimizer: seconds on a small, busy machine.
# Import it here, before the service registers, not inside the event loop where it would
# silence the heartbeats long enough for the supervisor to declare the learner dead.
import torch._dynamo  # noqa: F401

from common.algorithms.base import ActorPart, CriticPart
from common.algorithms.build import make_parts
from common.algorithms.compiled import CompileOptions, check_guards, compile_cache_dir, use_compile_cache
from common.config import with_learner_setting
from common.errors import ConfigError
from common.envs import env_spec
from common.learner_io import BatchStream, atomic_save, checkpoint_dir, device_of
from common.service import Service
from common.weights import WeightsPublisher, weights_message

log = logging.getLogger(__name__)

METRICS_EVERY = 1.0  # seconds between metrics messages
LOSS_EVERY = 50  # updates between loss read-outs (each forces a device sync)


class LearnerBase(Service):
    """Subclasses build their parts in `__init__` with `parts(shared)`, restore their
    checkpoint at the start of `serve()`, set `ready`, and run their own update loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        lc = self.cfg.learner
        torch.set_num_threads(lc.threads)
        self.layout, self.action_low, self.action_high = env_spec(self.cfg.env)
        self.device = device_of(self.device_name())
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # streams and CUDA graphs default to this device
        self.batches = BatchStream(self.channel("sample", binding=False), self.layout, lc.batch_size,
                                   lc.prefetch, self.device, lc.batches_per_request)
        self.last_metrics = self.last_checkpoint = time.monotonic()
        self.metrics_updates = 0
        self.losses: dict[str, float] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        self.ready = False  # restored from the run's checkpoint (if any): only then may close() checkpoint
        self.fast: list[Any] = []  # the compiled steps of the parts this learner trains
        self.compiled_parts: tuple[ActorPart | CriticPart, ...] = ()
        self.compiling: asyncio.Task[float] | None = None  # a compile in a worker thread
        self.compiling_for = lc.batch_size  # the batch size it compiles for

    def device_name(self) -> str:
        """This learner's torch device (the fused learner and the actor-learner: the actor's)."""
        return self.cfg.learner.actor_device

    def parts(self, shared: bool) -> tuple[ActorPart, CriticPart]:
        """Freshly built actor and critic parts on this learner's device."""
        return make_parts(self.cfg.algo, self.layout.obs_dim, self.layout.act_dim, self.action_low,
                          self.action_high, self.cfg.algo_config, self.device, shared, self.cfg.seed,
                          sparse=self.cfg.sparse, total_updates=self.cfg.total_updates)

    def start_compile(self, *parts: ActorPart | CriticPart) -> None:
        """Switch ``parts`` to compiled steps and compile them in a worker thread on dummy
        batches of the configured size (no state changes); `until_compiled` awaits it."""
        lc = self.cfg.learner
        options = CompileOptions(lc.compile, lc.cuda_graphs)
        if not options.enabled:
            return
        cache = use_compile_cache(compile_cache_dir(lc.compile_cache, self.cfg.run_dir))
        self.compiled_parts = parts
        for part in parts:
            part.compile(options)
        self.fast = [part.fast for part in parts]
        log.info("compiling the update steps (cache %s)", cache)
        self.warm_up(lc.batch_size)

    def warm_up(self, batch_size: int) -> None:
        """Compile the steps for ``batch_size`` in a worker thread on a dummy batch;
        `until_compiled` awaits it, then makes ``batch_size`` the one requested from replay."""
        dummy = self.layout.columns(torch.randn((batch_size, self.layout.width), device=self.device))
        steps = list(self.fast)
        check_guards(True)  # the new graphs are made with guards; off again once they are done
        self.compiling = asyncio.create_task(asyncio.to_thread(
            lambda: sum(fast.warm_up(dummy) for fast in steps)))
        self.compiling_for = batch_size

    async def until_compiled(self) -> None:
        """Wait for a compile started by `warm_up` (at once if none or done). If it failed
        (no C++ compiler, an unsupported op), the parts fall back to eager updates."""
        if self.compiling is None:
            return
        try:
            seconds = await self.compiling
            log.info("update steps compiled for batch size %d in %.1f s", self.compiling_for, seconds)
            check_guards(False)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: train eagerly instead
            log.warning("compiling the update steps failed, updating eagerly: %s: %s",
                        type(exc).__name__, exc)
            for part in self.compiled_parts:
                part.fast = None
            self.fast = []
        finally:
            self.compiling = None
        self.batches.batch_size = self.compiling_for

    @property
    def settled(self) -> bool:
        """False while the warm-up compile runs: it moves the trained weights (and puts them
        back), so nothing may read them for publishing or checkpoints until it is done."""
        return self.compiling is None or self.compiling.done()

    def compile_metrics(self) -> dict[str, float]:
        """Seconds spent compiling (and capturing) the steps, and graphs compiled so far."""
        if not self.fast:
            return {}
        return {"compile_s": sum(f.step.compile_s for f in self.fast),
                "compiles": float(sum(f.step.compiles for f in self.fast))}

    def publisher(self, endpoint_name: str) -> WeightsPublisher:
        pub = WeightsPublisher(self.channel("weights", binding=True, name=endpoint_name))
        self.tasks.append(asyncio.create_task(pub.serve_joins()))
        return pub

    def publish_actor(self, pub: WeightsPublisher, actor: ActorPart, net: str = "actor") -> None:
        """Version = actor updates; `updates` in critic updates (the run's update count).

        Sparse networks send their masked weights as (index, value) pairs where that is smaller.
        """
        if not self.settled:
            return  # the initial publish happened before the compile; updates wait for it
        extras = {**actor.extras(), "env_steps": float(self.batches.inserted)}
        state = actor.actor_state() if net == "actor" else actor.target_actor_state()
        assert state is not None
        sparse = actor.sparse.names if actor.sparse is not None else None
        pub.publish(weights_message(net, actor.updates, actor.updates * actor.policy_delay, state,
                                    sparse, extras))

    def set_param(self, key: str, value: Any) -> None:
        """`batch_size`: requests sent from now on ask for this many transitions (with compiled
        steps: once they are compiled for it, in a worker thread while updates pause).
        `batches_per_request`: requests sent from now on ask for this many batches at once."""
        cfg = with_learner_setting(self.cfg, key, value, self.ROLE)  # names a bad key or value
        if key == "batches_per_request":
            self.cfg = cfg
            self.batches.per_request = value
            return
        if not self.settled:
            raise ConfigError(f"{self.ROLE}: not ready for batch_size={value} yet (still compiling)")
        self.cfg = cfg
        if self.fast:
            self.warm_up(value)  # compiled off the event loop; `until_compiled` switches to it when done
        else:
            self.batches.batch_size = value

    def tick(self, updates: int, extra: dict[str, Any]) -> None:
        """Metrics about once a second; learner checkpoints every checkpoint_every_s."""
        now = time.monotonic()
        dt = now - self.last_metrics
        if dt >= METRICS_EVERY:
            rate = (updates - self.metrics_updates) / dt
            self.publish({"updates": updates, "update_hz": rate,
                          "update_frame_rate": rate * self.batches.batch_size,
                          "batch_size": self.batches.batch_size, "batches_per_request": self.batches.per_request,
                          "batch_wait_s": self.batches.wait_s, "env_steps": self.batches.inserted,
                          **self.compile_metrics(), **self.losses, **extra})
            self.last_metrics, self.metrics_updates = now, updates
        if now - self.last_checkpoint >= self.cfg.learner.checkpoint_every_s:
            self.checkpoint()
            self.last_checkpoint = now

    @property
    def checkpoint_path(self) -> Path:
        return checkpoint_dir(self.cfg.run_dir) / f"{self.ROLE}.pt"

    def checkpoint(self) -> None:
        if not self.settled:
            log.info("not checkpointing while the update steps compile (no update happened yet)")
            return
        atomic_save({**self.state(), "torch_rng": torch.get_rng_state()}, self.checkpoint_path)

    def restored(self) -> dict[str, Any] | None:
        """This learner's own checkpoint, if the run has one (restart after a crash, resume)."""
        path = self.checkpoint_path
        if not path.is_file():
            return None
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
        torch.set_rng_state(state["torch_rng"])
        log.info("restoring %s: %d updates, versions %s", path, state["updates"], state.get("versions"))
        return state

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.ready:
            self.checkpoint()
