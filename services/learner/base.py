"""The parts every learner service shares: model parts, batches, publishing, checkpoints.

A learner checkpoints its full state (networks, optimizers, temperature, noise RNGs,
update counters, weight versions) into checkpoints/<role>.pt every checkpoint_every_s
and on shutdown (SIGTERM included), and restores it at start when it exists: after a
crash the supervisor's restart continues from there, and so does `spreeze train --resume`.

With `learner.compile` (the default) each part's update becomes a compiled step
(common/algorithms/steps.py) without a pause: the steps are compiled in a worker thread on
fresh copies of the parts (the shadows), on dummy batches, while the live parts go on
updating eagerly; once the compile is done, the live state (weights, targets, optimizer
moments, noise generators, masks, counters) is loaded into the shadows, which train from
then on. A new batch size from the tuner compiles the same way. A compile that fails (no
C++ compiler, an unsupported op) leaves the eager updates in place. Compiled kernels are
cached on disk (`learner.compile_cache`, a per-user directory by default), so a second run
on the machine compiles in a fraction of the time; the cache also remembers how long each
network's compile took, which the progress line shows as the expected wait. The metrics
carry `compiled` (1 once the compiled steps train), `compiling` (1 while a compile runs),
`compile_expected_s`, `compile_s`, `compiles` and, once the compiled steps have run a while,
`compile_gain` (compiled over eager updates/s); `spreeze health` says compiled or eager, and why.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
# torch.optim imports torch._dynamo on the first optimizer: seconds on a small, busy machine.
# Import it here, before the service registers, not inside the event loop where it would
# silence the heartbeats long enough for the supervisor to declare the learner dead.
import torch._dynamo  # noqa: F401

from spreeze.common.algorithms.base import ActorPart, CompiledUpdate, CriticPart
from spreeze.common.algorithms.build import make_parts
from spreeze.common.algorithms.compiled import CompileOptions, check_guards, compile_cache_dir, use_compile_cache
from spreeze.common.checkpoint_spec import check_made_for, made_for, write_sidecar
from spreeze.common.config import with_learner_setting
from spreeze.common.errors import ConfigError
from spreeze.common.envs import env_spec
from spreeze.common.checkpoint_files import readable, save_checkpoint
from spreeze.common.learner_io import BatchStream, ObsNormalizer, checkpoint_dir, device_of
from spreeze.common.policy_export import describe_actor, with_obs_norm
from spreeze.common.running_stats import OBS_NORM_KEYS
from spreeze.common.service import Service, abandonable_thread
from spreeze.common.weights import WeightsPublisher, weights_message

log = logging.getLogger(__name__)

METRICS_EVERY = 1.0  # seconds between metrics messages
LOSS_EVERY = 50  # updates between loss read-outs (each forces a device sync)
COLD_COMPILE_S = 30.0  # the expected first compile of a network on a small CPU machine, before one is measured
GAIN_AFTER_S = 5.0  # seconds of compiled updates before their rate is compared with the eager one
TIMES_FILE = "spreeze-compile-times.json"  # in the compile cache: seconds each network's compile took


def in_daemon_thread(work: Callable[[], float]) -> asyncio.Future[float]:
    """Run ``work`` in a daemon thread; its result as a future of the running loop. Not the
    loop's executor: a process that stops (SIGTERM, Ctrl-C) must not wait for a compile."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[float] = loop.create_future()

    def settle(result: float | None, error: BaseException | None) -> None:
        if future.done():  # cancelled: nobody waits for it any more
            return
        if error is not None:
            future.set_exception(error)
        elif result is not None:
            future.set_result(result)

    def run() -> None:
        result: float | None = None
        error: BaseException | None = None
        try:
            result = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, which reports it
            error = exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed meanwhile
            pass

    abandonable_thread(run, "compile")
    return future


class LearnerBase(Service):
    """Subclasses build their parts in `__init__` with `parts(shared)`, restore their
    checkpoint at the start of `serve()`, set `ready`, and run their own update loop."""

    PARTS: tuple[str, ...] = ("actor", "critic")  # the attributes holding the parts it trains (both: shared)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        lc = self.cfg.learner
        torch.set_num_threads(lc.threads)
        self.layout, self.action_low, self.action_high = env_spec(self.cfg.env_source)
        self.device = device_of(self.device_name())
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # streams and CUDA graphs default to this device
        self.normalizer = ObsNormalizer(self.layout.obs_dim, self.device) if lc.obs_norm else None
        self.batches = BatchStream(self.channel("sample", binding=False), self.layout, lc.batch_size,
                                   lc.prefetch, self.device, lc.batches_per_request, self.normalizer)
        self.last_metrics = self.last_checkpoint = time.monotonic()
        self.metrics_updates = 0
        self.losses: dict[str, float] = {}
        self.tasks: list[asyncio.Task[Any]] = []
        self.ready = False  # restored from the run's checkpoint (if any): only then may close() checkpoint
        self.fast: list[CompiledUpdate] = []  # the compiled steps of the parts this learner trains
        self.compiling: asyncio.Future[float] | None = None  # a compile of `shadows` in a worker thread
        self.shadows: tuple[ActorPart | CriticPart, ...] = ()  # the parts it compiles
        self.compiling_for = lc.batch_size  # the batch size it compiles for
        self.compile_expected: float = 0.0  # seconds the running compile is expected to take
        self.compile_cold = True  # the running compile's network was never compiled with this cache
        self.compile_times: Path | None = None  # the cache's record of compile seconds per network
        self.eager_hz = 0.0  # eager updates/s while the first compile ran (0: not measured)
        self.compile_started: tuple[float, int] = (0.0, 0)  # (time, updates) when the running compile began
        self.gain_from: tuple[float, int] | None = None  # (time, updates) at the swap to compiled steps
        self.compile_gain: float | None = None  # compiled over eager updates/s, once measured
        self.compile_error = ""  # why the last compile failed ("" = it did not)
        self.actor_policy: dict[str, Any] | None = None  # the actor's acting-policy description, once built

    def device_name(self) -> str:
        """This learner's torch device (the fused learner and the actor-learner: the actor's)."""
        return self.cfg.learner.actor_device

    def parts(self, shared: bool) -> tuple[ActorPart, CriticPart]:
        """Freshly built actor and critic parts on this learner's device."""
        return make_parts(self.cfg.algo, self.layout.obs_dim, self.layout.act_dim, self.action_low,
                          self.action_high, self.cfg.algo_config, self.device, shared, self.cfg.seed,
                          sparse=self.cfg.sparse, total_updates=self.cfg.total_updates)

    def trained(self) -> tuple[ActorPart | CriticPart, ...]:
        """The parts this learner updates (its `PARTS` attributes)."""
        return tuple(getattr(self, name) for name in self.PARTS)

    def fresh_parts(self) -> tuple[ActorPart | CriticPart, ...]:
        """Newly built parts of the same shape as `trained` (the shadows a compile works on)."""
        actor, critic = self.parts(shared=self.PARTS == ("actor", "critic"))
        built: dict[str, ActorPart | CriticPart] = {"actor": actor, "critic": critic}
        return tuple(built[name] for name in self.PARTS)

    def train_with(self, parts: tuple[ActorPart | CriticPart, ...]) -> None:
        """Update ``parts`` (which hold the live state) from now on instead of `trained`."""
        for name, part in zip(self.PARTS, parts):
            setattr(self, name, part)

    def start_compile(self) -> None:
        """Compile the update steps in the background (see the module's doc); the live parts
        keep updating eagerly, and `swap_compiled` switches to the compiled ones when done."""
        lc = self.cfg.learner
        if not lc.compile:
            return
        cache = use_compile_cache(compile_cache_dir(lc.compile_cache, self.cfg.run_dir))
        self.compile_times = cache / TIMES_FILE
        log.info("compiling the update steps in the background (cache %s); updating eagerly meanwhile", cache)
        self.compile_for(lc.batch_size)

    def compile_for(self, batch_size: int) -> None:
        """Compile shadows of the trained parts for ``batch_size`` in a worker thread."""
        lc = self.cfg.learner
        options = CompileOptions(lc.compile, lc.cuda_graphs)
        shadows = self.fresh_parts()  # built here: seeding them touches the global RNG
        dummy = self.batches.columns(torch.randn((batch_size, self.layout.width), device=self.device))

        def work() -> float:
            for part in shadows:
                part.compile(options)  # an algorithm without a compiled step leaves fast None
            return sum(part.fast.warm_up(dummy) for part in shadows if part.fast is not None)

        # No compiled step may run while dynamo compiles in the worker thread (with guards
        # off, a call then fails as a recompile): the live parts update eagerly meanwhile,
        # on the same tensors (their optimizer owns the compiled step's Adam state).
        for part in self.trained():
            part.fast = None
        self.fast = []
        check_guards(True)  # the new graphs are made with guards; off again once they are in use
        self.shadows, self.compiling_for = shadows, batch_size
        recorded = self.recorded_compile_s()
        self.compile_cold, self.compile_expected = recorded is None, recorded or COLD_COMPILE_S
        self.compiling = in_daemon_thread(work)
        self.compile_started = (time.monotonic(), self.updates_done())

    def swap_compiled(self) -> None:
        """Before taking each batch: once a background compile is done, load the live state into
        the compiled shadows and train those from now on (or, if it failed, go on eagerly)."""
        task = self.compiling
        if task is None or not task.done():
            return
        self.compiling, shadows, self.shadows = None, self.shadows, ()
        try:
            seconds = task.result()
        except Exception as exc:  # noqa: BLE001 - any compiler failure: train eagerly instead
            log.warning("compiling the update steps failed, updating eagerly: %s: %s", type(exc).__name__, exc)
            self.compile_error = type(exc).__name__
            return
        self.compile_error = ""
        for live, shadow in zip(self.trained(), shadows):
            shadow.load(live.save())  # rebinds the compiled step's optimizer state too
        self.train_with(shadows)
        self.fast = [part.fast for part in shadows if part.fast is not None]
        check_guards(False)
        self.batches.batch_size = self.compiling_for
        self.record_compile_s(seconds)
        now, updates = time.monotonic(), self.updates_done()
        started, updates0 = self.compile_started
        if not self.eager_hz and now > started:
            self.eager_hz = (updates - updates0) / (now - started)
        self.gain_from = (now, updates)
        log.info("update steps compiled for batch size %d in %.1f s (%d eager updates meanwhile); "
                 "the compiled steps take over", self.compiling_for, seconds, updates - updates0)

    def updates_done(self) -> int:
        """This learner's update count (what its metrics call `updates`)."""
        return int(self.counters()["updates"])

    def compile_key(self) -> str:
        """What a compiled step depends on: algorithm, its and the sparse settings, sizes, device, role."""
        what = [self.ROLE, self.cfg.algo, repr(self.cfg.algo_config), repr(self.cfg.sparse), self.layout.obs_dim,
                self.layout.act_dim, self.compiling_for, self.device.type, torch.__version__]
        return hashlib.sha256(json.dumps(what, default=str).encode()).hexdigest()[:16]

    def recorded_compile_s(self) -> float | None:
        """Seconds this network's compile took last time on this machine (None: never compiled)."""
        try:
            times = json.loads(self.compile_times.read_text()) if self.compile_times else {}
            return float(times[self.compile_key()])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def record_compile_s(self, seconds: float) -> None:
        if self.compile_times is None:
            return
        try:
            times = json.loads(self.compile_times.read_text()) if self.compile_times.exists() else {}
            if not isinstance(times, dict):
                times = {}
        except (OSError, ValueError):
            times = {}
        times[self.compile_key()] = round(seconds, 2)
        try:
            tmp = self.compile_times.with_suffix(f".{self.ROLE}.tmp")
            tmp.write_text(json.dumps(times))
            tmp.replace(self.compile_times)
        except OSError as exc:
            log.info("could not record the compile time in %s: %s", self.compile_times, exc)

    def health_detail(self) -> str:
        """Whether the updates run compiled, for `spreeze health` (a container's eager learner
        trains at about half the speed: worth seeing without reading its log)."""
        if self.fast:
            gain = f", {self.compile_gain:.1f}x eager" if self.compile_gain is not None else ""
            return f"compiled update steps{gain}"
        if self.compiling is not None:
            return (f"eager update steps while compiling ({time.monotonic() - self.compile_started[0]:.0f}s "
                    f"of ~{self.compile_expected:.0f}s)")
        if not self.cfg.learner.compile:
            return "eager update steps (learner.compile=false)"
        if self.compile_error:
            return f"eager update steps (the compile failed: {self.compile_error}; see the learner's log)"
        return "eager update steps (not compiled yet)"

    def compile_metrics(self, now: float, updates: int) -> dict[str, float]:
        """Whether the steps run compiled and whether a compile runs (and how long it should take),
        the seconds spent compiling (and capturing) the steps in use, their graph count, and what
        they gained over eager."""
        out: dict[str, float] = {"compiled": float(bool(self.fast))}
        if self.compiling is not None:
            out.update(compiling=1.0, compile_cold=float(self.compile_cold), compile_expected_s=self.compile_expected,
                       compile_elapsed_s=now - self.compile_started[0])
        elif self.cfg.learner.compile:
            out["compiling"] = 0.0
        if self.fast:
            out.update(compile_s=sum(f.step.compile_s for f in self.fast),
                       compiles=float(sum(f.step.compiles for f in self.fast)))
        if self.gain_from is not None and self.eager_hz > 0 and now - self.gain_from[0] >= GAIN_AFTER_S:
            t0, u0 = self.gain_from
            self.compile_gain, self.gain_from = (updates - u0) / (now - t0) / self.eager_hz, None
            log.info("compiled steps: %.2fx the eager updates/s", self.compile_gain)
        if self.compile_gain is not None:
            out["compile_gain"] = self.compile_gain
        return out

    def publisher(self, endpoint_name: str) -> WeightsPublisher:
        pub = WeightsPublisher(self.channel("weights", binding=True, name=endpoint_name))
        self.tasks.append(asyncio.create_task(pub.serve_joins()))
        return pub

    def publish_actor(self, pub: WeightsPublisher, actor: ActorPart, net: str = "actor") -> None:
        """Version = actor updates; `updates` in critic updates (the run's update count).

        Sparse networks send their masked weights as (index, value) pairs where that is smaller.
        `net = actor` carries the actor's acting-policy description (built at the first publish,
        with the config's exploration noise), so samplers act without knowing the algorithm.
        """
        extras = {**actor.extras(), "env_steps": float(self.batches.inserted)}
        state = actor.actor_state() if net == "actor" else actor.target_actor_state()
        assert state is not None
        sparse = actor.sparse.names if actor.sparse is not None else None
        if net == "actor" and self.actor_policy is None:
            noise = self.cfg.algorithm.exploration_noise(self.cfg.algo_config)
            self.actor_policy = describe_actor(actor.actor, noise)
            if self.normalizer is not None:  # the actor acts on what the learner trains it on
                self.actor_policy = with_obs_norm(self.actor_policy)
        if net == "actor" and self.normalizer is not None:
            stats = self.normalizer.state()
            state = {**state, OBS_NORM_KEYS[0]: stats["mean"], OBS_NORM_KEYS[1]: stats["var"]}
        pub.publish(weights_message(net, actor.updates, actor.updates * actor.policy_delay, state,
                                    sparse, extras, self.actor_policy if net == "actor" else None))

    def set_param(self, key: str, value: Any) -> None:
        """`batch_size`: requests sent from now on ask for this many transitions (with compiled
        steps: once they are compiled for it, in the background while updates go on).
        `batches_per_request`: requests sent from now on ask for this many batches at once."""
        cfg = with_learner_setting(self.cfg, key, value, self.ROLE)  # names a bad key or value
        if key == "batches_per_request":
            self.cfg = cfg
            self.batches.per_request = value
            return
        if self.compiling is not None:
            raise ConfigError(f"{self.ROLE}: not ready for batch_size={value} yet (still compiling)")
        self.cfg = cfg
        if self.fast:
            self.compile_for(value)  # `swap_compiled` switches to it when done
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
                          **self.compile_metrics(now, updates), **self.losses, **extra})
            self.last_metrics, self.metrics_updates = now, updates
        if now - self.last_checkpoint >= self.cfg.learner.checkpoint_every_s:
            self.checkpoint()
            self.last_checkpoint = now

    @property
    def checkpoint_path(self) -> Path:
        return checkpoint_dir(self.cfg.run_dir) / f"{self.ROLE}.pt"

    def checkpoint(self) -> None:
        """Save this learner's state (a full disk skips it: said once, training goes on)."""
        extra = {"obs_norm": self.normalizer.state()} if self.normalizer is not None else {}
        state = {**self.state(), "torch_rng": torch.get_rng_state(), **extra}
        self.disk.attempt(f"checkpoint {self.checkpoint_path.name}", lambda: self.write_checkpoint(state))

    def write_checkpoint(self, state: dict[str, Any]) -> None:
        save_checkpoint(state, self.checkpoint_path)
        write_sidecar(self.checkpoint_path, self.cfg)

    def restored(self) -> dict[str, Any] | None:
        """This learner's own checkpoint, if the run has one (restart after a crash, resume): the
        newest one that reads back whole (common/checkpoint_files.py)."""
        path = readable(self.checkpoint_path)
        if path is None:
            return None
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
        if isinstance(state.get("config"), dict):
            check_made_for(str(path), made_for(state["config"]), self.cfg)
        torch.set_rng_state(state["torch_rng"])
        if self.normalizer is not None and "obs_norm" in state:
            self.normalizer.load(state["obs_norm"])
        log.info("restoring %s: %d updates, versions %s", path, state["updates"], state.get("versions"))
        return state

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.ready:
            self.checkpoint()
