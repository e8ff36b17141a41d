"""The run configuration: frozen dataclasses, loaded from YAML plus key=value overrides.

Every field has a one-line doc (the comment after it), which `spreeze train --help`
prints. `load_config` validates everything at start and names the bad key and value.

Each algorithm's hyperparameters are a section named after it (``td3:``, ``sac:``), held in
`Config.algorithms` rather than a field each: the built-ins' sections are always there, and
the run's algorithm's (a module path, see common/algorithms/__init__.py) joins them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from spreeze.common.algorithms import ALGOS, Algorithm, algorithm
from spreeze.common.config_text import raw_config
from spreeze.common.errors import ConfigError
from spreeze.common.env_source import EnvSource, parse_wrappers
from spreeze.common.sparse_config import SparseConfig
from spreeze.common.transport import ROLES, tcp_port
from spreeze.proto.names import ROLES as SERVICE_ROLES


# socket name -> port offset from supervisor.listen's port: the sockets remote samplers need
# tcp ports of a run's sockets, as offsets from the first: the four a remote sampler uses come first
# (supervisor.listen serves those), then the rest (supervisor.transport=tcp puts every socket on tcp)
TCP_PORT_ORDER = ("control", "metrics_in", "experience", "actor_weights",
                  "metrics_out", "sample", "actor_sync", "critic_sync")
TCP_OFFSETS = {name: i for i, name in enumerate(TCP_PORT_ORDER[:4])}
TRANSPORTS = ("ipc", "tcp")
SECTIONS = "algorithm_sections"  # metadata flag of Config.algorithms: its entries are top-level sections
FLOAT_LITERAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")  # 3e-4, 1.5, .5, 2E3
MAX_PREFETCH = min(r.hwm for r in ROLES["sample"])  # replies beyond the sample sockets' HWM would stall replay
MAX_ACK_WINDOW = min(r.hwm for r in ROLES["experience"]) // 2  # a window plus its re-sent copy always fit the HWM


@dataclass(frozen=True)
class SamplerConfig:
    num_samplers: int = 1  # sampler processes started locally (0: only remote samplers, see supervisor.listen)
    envs_per_sampler: int = 4  # vectorized envs stepped by each sampler process
    steps_per_push: int = 16  # env steps per env between Experience pushes (batch = this x envs)
    warmup_steps: int = 10_000  # total env steps (all samplers) acting uniformly at random
    ack_window: int = 4  # Experience batches in flight before the sampler waits for replay's acks (credit)
    ack_timeout: float = 10.0  # seconds without ack progress before unacknowledged batches are re-sent

    def validate(self) -> None:
        _positive(self, "envs_per_sampler", "steps_per_push", "ack_window", "ack_timeout")
        _non_negative(self, "num_samplers", "warmup_steps")
        if self.ack_window > MAX_ACK_WINDOW:
            raise ConfigError(f"sampler.ack_window={self.ack_window!r} must be <= {MAX_ACK_WINDOW} "
                              "(a window and its re-sent copy must fit the experience socket's HWM)")


@dataclass(frozen=True)
class ReplayConfig:
    capacity: int = 1_000_000  # transitions kept (ring buffer)
    min_size: int = 10_000  # transitions stored before the first sample is served
    update_to_data: float = 1.0  # target gradient updates per env step (0 = no rate limit)
    tolerance: float = 0.25  # allowed drift from the target, as a fraction of min_size updates
    reject_non_finite: bool = True  # refuse batches holding NaN or inf
    snapshot_every_s: float = 30.0  # seconds between incremental snapshots into run_dir/replay (0 = none)

    def validate(self) -> None:
        _positive(self, "capacity")
        _non_negative(self, "min_size", "update_to_data", "snapshot_every_s")
        if not 0 < self.tolerance <= 10:
            raise ConfigError(f"replay.tolerance={self.tolerance!r} must be in (0, 10]")
        if self.min_size > self.capacity:
            raise ConfigError(f"replay.min_size={self.min_size} exceeds replay.capacity={self.capacity}")


@dataclass(frozen=True)
class LearnerConfig:
    mode: str = "fused"  # fused: one process for actor and critics | split: actor_learner + critic_learner
    batch_size: int = 256  # transitions per gradient update
    prefetch: int = 4  # sample requests kept in flight per learner
    batches_per_request: int = 4  # update batches per sample request (one message and one device copy for all; uniform sampling makes them independent)
    sync_every: int = 2  # split mode: updates between actor <-> critic weight exchanges (K)
    max_lag: int = 64  # split mode: critic updates the critic may run ahead of the actor it uses
    publish_interval: float = 0.05  # seconds between actor weight publishes to samplers/evaluator
    actor_device: str = "cpu"  # torch device of the actor (split: actor_learner; fused: both); auto: cuda if seen, else cpu
    critic_device: str = "cpu"  # torch device of the critic_learner (split mode); auto as for actor_device
    threads: int = 1  # torch intra-op threads per learner process
    own_cores: bool = False  # local runs: each learner process on its own `threads` cores, every other service on the rest (off: no gain measured on 2 cores)
    checkpoint_every_s: float = 60.0  # seconds between learner state checkpoints
    compile: bool = True  # torch.compile the update steps (compiled during the random warm-up); false = the eager reference
    cuda_graphs: bool = True  # on CUDA, capture each compiled step as a CUDA graph (one launch per update)
    obs_norm: bool = False  # normalise observations by the running mean and variance of every one stored (replay's); the actor carries them to samplers, checkpoints and exports
    compile_cache: str = "user"  # compiled kernels on disk: user (~/.cache/spreeze, shared by runs) | run (run_dir) | a directory

    def validate(self) -> None:
        _choice(self, "mode", ("fused", "split"))
        _positive(self, "batch_size", "prefetch", "batches_per_request", "sync_every", "max_lag", "threads",
                  "checkpoint_every_s")
        if self.prefetch > MAX_PREFETCH:  # more replies than the sample sockets queue: replay waits on them
            raise ConfigError(f"learner.prefetch={self.prefetch!r} must be <= {MAX_PREFETCH} "
                              "(the sample socket's high-water mark)")
        _non_negative(self, "publish_interval")
        if not isinstance(self.compile_cache, str) or not self.compile_cache.strip():
            raise ConfigError(f"learner.compile_cache={self.compile_cache!r} must be user, run or a directory")
        for name in ("actor_device", "critic_device"):
            value = getattr(self, name)
            if not (value in ("cpu", "cuda", "auto") or value.startswith("cuda:")):
                raise ConfigError(f"learner.{name}={value!r} must be cpu, cuda, cuda:N or auto")


@dataclass(frozen=True)
class EvalConfig:
    every_updates: int = 2_500  # evaluate when the learner has done this many more updates
    every_seconds: float = 0.0  # or when this many seconds passed (0 = off)
    episodes: int = 5  # deterministic episodes per evaluation
    video_every: int = 20  # record an MP4 of one deterministic episode every this many evaluations into run_dir/videos (0 = off)

    def validate(self) -> None:
        _positive(self, "episodes")
        _non_negative(self, "every_updates", "every_seconds", "video_every")
        if self.every_updates == 0 and self.every_seconds == 0:
            raise ConfigError("eval.every_updates and eval.every_seconds are both 0: nothing triggers evaluation")


@dataclass(frozen=True)
class VisualizerConfig:
    enabled: bool = True  # start the visualizer service (live dashboard, TensorBoard event files)
    host: str = "127.0.0.1"  # address the dashboard binds (127.0.0.1: this machine only)
    port: int = 0  # dashboard TCP port (0 = any free port; the URL is printed and written to run_dir/dashboard.url)
    tensorboard: bool = True  # write TensorBoard event files into run_dir/tensorboard
    push_every: float = 1.0  # seconds between live updates pushed to open dashboard pages
    wandb: bool = False  # also log every dashboard series to Weights & Biases (needs the wandb package: spreeze[wandb])
    wandb_project: str = "spreeze"  # the W&B project
    wandb_entity: str = ""  # the W&B entity (user or team; "" = your default)
    wandb_mode: str = "online"  # online (needs WANDB_API_KEY or `wandb login`) | offline (run_dir/wandb; `wandb sync` later)

    def validate(self) -> None:
        if not self.host:
            raise ConfigError("visualizer.host='' must be an address, e.g. 127.0.0.1")
        _choice(self, "wandb_mode", ("online", "offline"))
        if self.wandb and not self.enabled:
            raise ConfigError("visualizer.wandb=true needs visualizer.enabled=true: the visualizer is what logs to W&B")
        if self.wandb and importlib.util.find_spec("wandb") is None:
            raise ConfigError("visualizer.wandb=true needs the wandb package: pip install 'spreeze[wandb]' "
                              "(or pip install wandb) where the visualizer runs")
        if self.wandb and not self.wandb_project:
            raise ConfigError("visualizer.wandb_project='' must name a W&B project")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"visualizer.port={self.port!r} must be in [0, 65535] (0 = any free port)")
        _positive(self, "push_every")


@dataclass(frozen=True)
class SupervisorConfig:
    heartbeat_interval: float = 1.0  # seconds between heartbeats of each service
    liveness: int = 5  # missed heartbeats before a service is declared dead (3-5 is reasonable)
    start_timeout: float = 60.0  # seconds a started service has to register and send its first heartbeat
    max_restarts: int = 5  # restarts of one service within restart_window before the run stops
    restart_window: float = 300.0  # seconds
    backoff: float = 1.0  # first restart delay in seconds, doubled per restart in the window
    progress_every: float = 5.0  # seconds between console progress lines
    auto: bool = True  # pick samplers, envs, batch, learner placement, threads from the hardware (set values kept)
    tune: bool = True  # re-tune samplers, envs per sampler, batches per request while training (set values pinned; learning dynamics unchanged)
    tune_batch: bool = False  # the tuner may change learner.batch_size too (changes what each update learns from: opt-in)
    tune_window: float = 10.0  # seconds of metrics behind each tuning measurement
    tune_settle: float = 4.0  # seconds after a tuning change before its measurement starts
    tune_min_gain: float = 0.05  # relative update-frame-rate gain a tried change must bring to be kept
    tune_cooldown: float = 300.0  # seconds before a rejected change, or undoing a kept one, is tried again
    max_samplers: int = 0  # most sampler processes the tuner may run (0 = the CPU cores found)
    max_envs_per_sampler: int = 64  # most envs per sampler the tuner may set
    min_batch_size: int = 32  # smallest batch size the tuner may set
    max_batch_size: int = 1024  # largest batch size the tuner may set (larger rarely learns faster per step)
    max_batches_per_request: int = 16  # most update batches per sample request the tuner may set
    mode: str = "embedded"  # embedded: start every service as a child | hub: start none, services register (compose)
    socket_dir: str = ""  # directory of the run's ipc:// sockets ("" = a new private one in /tmp)
    listen: str = ""  # tcp://HOST:PORT: control on PORT, metrics_in, experience, actor_weights on PORT+1..3
    keys: str = ""  # CURVE key directory (`spreeze keys`): tcp-facing sockets then admit authorized keys only
    remote_patience: float = 600.0  # seconds a service reached over tcp:// waits out a silent supervisor
    transport: str = "ipc"  # ipc: sockets in a run-private directory (one host) | tcp: every socket on tcp:// (Swarm)
    tcp_port: int = 5555  # transport=tcp: first of 8 ports, one per socket (control first; see docs/containers.md, Multi-host)
    tcp_hosts: str = ""  # transport=tcp: role=HOST pairs, comma separated ("all=HOST": every role); default: the role's name

    def validate(self) -> None:
        _positive(self, "heartbeat_interval", "liveness", "start_timeout", "restart_window", "progress_every",
                  "tune_window", "max_envs_per_sampler", "min_batch_size", "max_batch_size",
                  "max_batches_per_request", "remote_patience")
        _non_negative(self, "max_restarts", "backoff", "tune_settle", "tune_min_gain", "tune_cooldown",
                      "max_samplers")
        _choice(self, "mode", ("embedded", "hub"))
        if self.min_batch_size > self.max_batch_size:
            raise ConfigError(f"supervisor.min_batch_size={self.min_batch_size} exceeds "
                              f"supervisor.max_batch_size={self.max_batch_size}")
        if self.listen:
            if tcp_port(self.listen) > 65535 - len(TCP_OFFSETS):
                raise ConfigError(f"supervisor.listen={self.listen!r}: the port needs "
                                  f"{len(TCP_OFFSETS)} free ports above it")
        _choice(self, "transport", TRANSPORTS)
        if self.transport == "tcp":
            if self.listen:
                raise ConfigError(f"supervisor.listen={self.listen!r} has no use with supervisor.transport=tcp: "
                                  f"every socket is on tcp already (remote samplers connect to the supervisor's "
                                  f"host, port supervisor.tcp_port)")
            if not 0 < self.tcp_port <= 65536 - len(TCP_PORT_ORDER):
                raise ConfigError(f"supervisor.tcp_port={self.tcp_port!r} must leave {len(TCP_PORT_ORDER)} ports "
                                  f"in 1..65535")
            tcp_host_map(self.tcp_hosts)  # names a bad pair
        if self.keys and not (self.listen or self.transport == "tcp"):
            raise ConfigError(f"supervisor.keys={self.keys!r} secures tcp endpoints, but supervisor.listen is not set "
                              f"and supervisor.transport is not tcp")


def tcp_host_map(text: str) -> dict[str, str]:
    """supervisor.tcp_hosts "role=HOST,..." -> {role: HOST} ("all" for every role not named)."""
    hosts: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        role, eq, host = pair.partition("=")
        role, host = role.strip(), host.strip()
        if not eq or not host or role not in (*SERVICE_ROLES, "supervisor", "all"):
            raise ConfigError(f"supervisor.tcp_hosts: {pair!r} must be ROLE=HOST with ROLE one of supervisor, "
                              f"{', '.join(SERVICE_ROLES)} or all")
        hosts[role] = host
    return hosts


@dataclass(frozen=True)
class Config:
    env: str = "HalfCheetah-v5"  # gymnasium environment id (continuous actions), or gymnasium's module:EnvId
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments of gymnasium.make(env, ...), the same in samplers, evaluator and videos
    env_imports: tuple[str, ...] = ()  # modules every process imports before making the env (a package that registers its envs)
    env_wrappers: tuple[Any, ...] = ()  # wrappers around the env, innermost first: a name (gymnasium.wrappers' ClipAction, or module:Class) or {name: {keyword: value}}
    algo: str = "td3"  # td3 | sac | crossq | a module path defining ALGORITHM (unset: the plan may pick crossq)
    seed: int = 0  # base seed; each service derives its own
    total_steps: int = 100_000  # env steps budget; the run stops when replay has seen this many
    time_limit: float = 0.0  # wall-clock budget in seconds (0 = none)
    stop_at_return: float | None = None  # stop once an evaluation's mean return reaches this (None = run the whole budget)
    run_dir: str = ""  # run directory ("" = runs/<env>-<algo>-<seed>-<timestamp>)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    algorithms: dict[str, Any] = field(default_factory=lambda: algorithm_sections("td3", {}),
                                       metadata={SECTIONS: True})  # each algorithm's section, by its name
    sparse: SparseConfig = field(default_factory=SparseConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    visualizer: VisualizerConfig = field(default_factory=VisualizerConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)

    @property
    def env_source(self) -> EnvSource:
        """How every process makes the run's environment (id, env_kwargs, env_imports, env_wrappers)."""
        return EnvSource(self.env, tuple(sorted(self.env_kwargs.items())), self.env_imports,
                         parse_wrappers(self.env_wrappers))

    def validate(self) -> None:
        spec = _algorithm(self.algo)
        if not isinstance(self.algorithms.get(spec.name), spec.config):
            raise ConfigError(f"{spec.name}: the section of algo={self.algo!r} must be a {spec.config.__name__}")
        _positive(self, "total_steps")
        _non_negative(self, "time_limit", "seed")
        if self.stop_at_return is not None and (isinstance(self.stop_at_return, bool) or not isinstance(
                self.stop_at_return, (int, float)) or not math.isfinite(self.stop_at_return)):
            raise ConfigError(f"stop_at_return={self.stop_at_return!r} must be a finite number or null")
        if not self.env:
            raise ConfigError("env='' must name a gymnasium environment id")
        parse_wrappers(self.env_wrappers)
        sections = [getattr(self, f.name) for f in dataclasses.fields(self)] + list(self.algorithms.values())
        for value in sections:
            if dataclasses.is_dataclass(value):
                try:
                    value.validate()  # type: ignore[union-attr]  # every config section has validate()
                except ConfigError:
                    raise
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None
        if self.sampler.num_samplers == 0 and not self.supervisor.listen and self.supervisor.mode == "embedded":
            raise ConfigError("sampler.num_samplers=0 starts no sampler: set supervisor.listen so remote "
                              "samplers can attach, or start at least one")
        lc = self.learner
        if lc.batch_size * lc.batches_per_request > self.replay.capacity:
            raise ConfigError(f"learner.batch_size x learner.batches_per_request = "
                              f"{lc.batch_size * lc.batches_per_request} exceeds replay.capacity="
                              f"{self.replay.capacity}: one sample request could never be answered")
        delay = self.algorithm.policy_delay(self.algo_config)
        if lc.mode == "split" and lc.max_lag < lc.sync_every * delay - 1:
            # the critic stops max_lag updates past the newest actor copy; the actor sends its next
            # copy only after sync_every x delay critic updates: with less lag both wait forever
            raise ConfigError(f"learner.max_lag={lc.max_lag} must be >= learner.sync_every x policy delay - 1 "
                              f"= {lc.sync_every * delay - 1} in split mode, or the learners deadlock")

    @property
    def algorithm(self) -> Algorithm:
        """The descriptor of the run's algorithm."""
        return _algorithm(self.algo)

    @property
    def algo_config(self) -> Any:
        """The run's algorithm's hyperparameters: the config section named after it."""
        return self.algorithms[self.algorithm.name]

    def section(self, name: str) -> Any:
        """The hyperparameters of algorithm ``name`` (td3, sac, ...); ConfigError naming it if absent."""
        try:
            return self.algorithms[name]
        except KeyError:
            raise ConfigError(f"this config has no algorithm section {name!r} "
                              f"(it has {', '.join(self.algorithms)})") from None

    @property
    def total_updates(self) -> int:
        """The run's budget in (critic) gradient updates; 0 when not rate limited (unknown)."""
        return int(self.total_steps * self.replay.update_to_data)


def _algorithm(spec: str) -> Algorithm:
    """`algorithm` with its ValueError as the ConfigError a bad config raises."""
    try:
        return algorithm(spec)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def algorithm_sections(algo: str, data: dict[str, Any]) -> dict[str, Any]:
    """The sections of every built-in algorithm and of ``algo``: built from ``data``'s entry of
    each name where it has one, else the defaults."""
    specs = {spec.name: spec for spec in (_algorithm(a) for a in (*ALGOS, algo))}
    return {name: build(spec.config, data[name], f"{name}.") if name in data else spec.config()
            for name, spec in specs.items()}


def check_budget(cfg: Config) -> None:
    """Refuse a step budget that the learner's warm-up uses up: replay serves its first batch
    once it holds replay.min_size transitions, so with total_steps at or under that the run
    would end before the first update. Checked once the start plan has set min_size."""
    steps, warmup = cfg.total_steps, cfg.replay.min_size
    if steps <= warmup:
        raise ConfigError(f"total_steps={steps} is {'under' if steps < warmup else 'not above'} the {warmup}-step "
                          f"warm-up (replay.min_size={warmup}): the learner would make no update; raise "
                          f"total_steps or lower replay.min_size (and sampler.warmup_steps)")


RUNTIME_LEARNER_KEYS = ("batch_size", "batches_per_request")  # learner.* a running run may change


def with_learner_setting(cfg: Config, key: str, value: Any, who: str) -> Config:
    """`cfg` with learner.<key> = `value` for a key in RUNTIME_LEARNER_KEYS: the one way a running
    run changes them (the supervisor's tuning, and the `set` command in replay and the learners)."""
    settable = ", ".join(RUNTIME_LEARNER_KEYS)
    if key not in RUNTIME_LEARNER_KEYS:
        raise ConfigError(f"{who}: cannot set {key}={value!r} (settable: {settable})")
    bad = ConfigError(f"{who}: cannot set {key}={value!r} (a positive int; batch_size x batches_per_request "
                      f"at most {cfg.replay.capacity}, the replay capacity)")
    if type(value) is not int or value <= 0:
        raise bad
    changes: dict[str, Any] = {key: value}
    lc = dataclasses.replace(cfg.learner, **changes)
    if lc.batch_size * lc.batches_per_request > cfg.replay.capacity:
        raise bad
    return dataclasses.replace(cfg, learner=lc)


# ------------------------------------------------------------------ validation helpers

def _section(obj: Any) -> str:
    return {SamplerConfig: "sampler.", ReplayConfig: "replay.", LearnerConfig: "learner.",
            EvalConfig: "eval.", VisualizerConfig: "visualizer.",
            SupervisorConfig: "supervisor."}.get(type(obj), "")


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value > 0:
            raise ConfigError(f"{_section(obj)}{name}={value!r} must be > 0")


def _non_negative(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value >= 0:
            raise ConfigError(f"{_section(obj)}{name}={value!r} must be >= 0")


def _choice(obj: Any, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in choices:
        raise ConfigError(f"{_section(obj)}{name}={value!r} must be one of {', '.join(choices)}")


# ------------------------------------------------------------------ loading

def build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build a (nested) config dataclass from plain data, checking keys and types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r:.60}")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields if not f.metadata.get(SECTIONS)}
    kwargs: dict[str, Any] = {}
    for f in fields:
        if f.metadata.get(SECTIONS):
            algo = data.get("algo", Config.algo)
            if not isinstance(algo, str):
                raise ConfigError(f"algo={algo!r} must be of type str")
            kwargs[f.name] = sections = algorithm_sections(algo, data)
            names |= set(sections)
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown config key {prefix}{unknown[0]} (known: {', '.join(sorted(names))})")
    kwargs.update({name: _coerce(hints[name], value, f"{prefix}{name}") for name, value in data.items()
                   if name in hints})
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, key: str) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, value, key + ".")
    origin = typing.get_origin(hint)
    if origin is tuple and typing.get_args(hint)[0] is Any:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r:.80} must be a list")
        return tuple(value)
    if origin is tuple:
        return _coerce_tuple(typing.get_args(hint)[0], value, key)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{key}={value!r} must be a mapping of names to values")
        return dict(value)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if value is None else _coerce(args[0], value, key)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str) and FLOAT_LITERAL.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 reads 3e-4 (no dot) as a string; users write it so
    if hint in (int, float, str, bool) and (type(value) is not hint):
        raise ConfigError(f"{key}={value!r} must be of type {hint.__name__}")
    return value


def _coerce_tuple(item: type, value: Any, key: str) -> tuple[Any, ...]:
    """A list of ints (or of numbers, as floats, for a tuple of floats; of names for strings) as a tuple."""
    def number(v: Any) -> bool:
        if item is str:
            return isinstance(v, str) and bool(v)
        return isinstance(v, (int, float) if item is float else int) and not isinstance(v, bool)
    if not isinstance(value, (list, tuple)) or not all(number(v) for v in value):
        what = {float: "numbers", str: "non-empty strings"}.get(item, "integers")
        raise ConfigError(f"{key}={value!r} must be a list of {what}")
    return tuple(float(v) for v in value) if item is float else tuple(value)


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain data (YAML/msgpack friendly) of a config dataclass."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.metadata.get(SECTIONS):
            out.update({name: to_dict(section) for name, section in value.items()})
            continue
        out[f.name] = to_dict(value) if dataclasses.is_dataclass(value) else (
            list(value) if isinstance(value, tuple) else value)
    return out


def from_dict(data: dict[str, Any]) -> Config:
    cfg = build(Config, data)
    cfg.validate()
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> Config:
    """YAML file (optional) + overrides -> a validated Config."""
    return from_dict(raw_config(path, overrides, base))


def given_keys(path: str | Path | None = None, overrides: list[str] | None = None) -> frozenset[str]:
    """Dotted keys the user set in the YAML file or as overrides ('sampler.num_samplers', ...):
    the hardware plan and the tuner keep these values (they are pinned)."""
    def leaves(node: dict[str, Any], prefix: str) -> list[str]:
        return [k for key, value in node.items()
                for k in (leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"])]
    return frozenset(leaves(raw_config(path, overrides), ""))
