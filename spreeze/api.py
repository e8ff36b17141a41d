"""The Python API: train a run, follow or stop it, and act with its policy.

    import spreeze
    run = spreeze.train(env="Pendulum-v1", algo="sac", total_steps=20_000, run_dir="runs/p")
    policy = spreeze.load("runs/p")            # best checkpoint; "latest" also works
    action = policy.predict(obs, deterministic=True)
    spreeze.export("runs/p", "policy.pt")      # TorchScript (or format="onnx"), runs without Spreeze

`train` takes the same config as `spreeze train` (a YAML file or a dict, then key=value
overrides, then the named arguments) and runs it in a child process with every service,
exactly as the command does; `wait=False` returns at once with a `Run` to stop or wait on.
`load` needs no running service: the policy acts in numpy, from the run's checkpoint.
The command line is a thin layer on these functions (cli/train.py resolves its config here).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from spreeze.common.config import Config, given_keys, load_config, to_dict
from spreeze.common.config_text import parse_override
from spreeze.common.errors import ConfigError

if TYPE_CHECKING:
    from spreeze.common.policy_torch import Exported

RESUMABLE_KEYS = ("total_steps", "time_limit", "stop_at_return", "supervisor.listen",
                  "supervisor.keys")  # budget and where it listens
INTERRUPTED = 128 + signal.SIGINT  # exit status of a run stopped by Ctrl-C, as a shell reports one


class TrainingError(RuntimeError):
    """A training run ended without reaching its budget (its exit status and why)."""

    def __init__(self, run_dir: Path, returncode: int, why: str) -> None:
        super().__init__(f"training run {str(run_dir)!r} failed (exit status {returncode}): {why}")
        self.run_dir, self.returncode, self.why = run_dir, returncode, why


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A run's config as it will start, and the keys the user set (the plan keeps those)."""

    config: Config
    pinned: frozenset[str]
    resumed: bool


def _flat(node: Mapping[str, Any], prefix: str = "") -> list[str]:
    """A nested config dict as key=value overrides (values written as JSON, which YAML reads)."""
    out: list[str] = []
    for key, value in node.items():
        if isinstance(value, Mapping):
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={json.dumps(value)}")
    return out


def resolve(config: str | Path | Mapping[str, Any] | None = None, overrides: Sequence[str] = (),
            resume: str | Path | None = None, **named: Any) -> Resolved:
    """The config a run starts with: `config` (a YAML file or a dict), then `overrides`
    (key=value), then the `named` keys that are not None (env, algo, seed, total_steps,
    time_limit, run_dir, or any dotted key given with '__' for '.'). With `resume` (a run
    directory) the run's saved config, where only budget keys may change. Raises
    ConfigError naming the bad value."""
    given = list(overrides) + [f"{k.replace('__', '.')}={v}" for k, v in named.items() if v is not None]
    if isinstance(config, Mapping):
        given = _flat(config) + given
        config = None
    if resume is not None:
        return Resolved(_resume_config(Path(resume).resolve(), config, given), frozenset(), True)
    cfg = load_config(config, given)
    pinned = given_keys(config, given)
    cfg = _planned_algo(cfg, pinned)
    if not cfg.run_dir:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        cfg = dataclasses.replace(cfg, run_dir=f"runs/{cfg.env}-{cfg.algo}-s{cfg.seed}-{stamp}")
    cfg = dataclasses.replace(cfg, run_dir=str(Path(cfg.run_dir).resolve()))
    return Resolved(cfg, pinned, False)


def _planned_algo(cfg: Config, pinned: frozenset[str]) -> Config:
    """The config with the algorithm the start plan chooses for its task when the user chose
    none (the run directory is named after it; the supervisor prints the plan's reason)."""
    from spreeze.services.supervisor.probe import apply, planned_algo
    return apply(cfg, planned_algo(cfg, pinned))


def _resume_config(run_dir: Path, config: str | Path | None, overrides: list[str]) -> Config:
    """RUN_DIR/config.yaml with only budget keys overridden; anything else is refused by name."""
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"--resume {str(run_dir)!r}: no config.yaml there, so it is not a run directory")
    if config is not None:
        raise ConfigError(f"--config {str(config)!r} cannot be used with --resume: the run keeps its config")
    for text in overrides:
        keys, value = parse_override(text)
        key = ".".join(keys)
        if key == "run_dir" and Path(str(value)).resolve() == run_dir:
            continue
        if key not in RESUMABLE_KEYS:
            raise ConfigError(f"--resume: {key} cannot change when resuming a run (only "
                              f"{', '.join(RESUMABLE_KEYS)} can); start a new run instead")
    return dataclasses.replace(load_config(saved, overrides), run_dir=str(run_dir))


class Run:
    """A training run started by `train`: its directory, config and child process."""

    def __init__(self, resolved: Resolved, proc: subprocess.Popen[bytes], console: Path | None) -> None:
        self.config, self.run_dir = resolved.config, Path(resolved.config.run_dir)
        self._proc, self._console = proc, console

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once it ended (0: budget reached or stopped by `stop`), else None."""
        return self._proc.poll()

    def stop(self, timeout: float = 120.0) -> int:
        """Stop the run cleanly (services stop, checkpoints are written; `resume` continues it)
        and wait for it; its exit status."""
        if self.running:
            self._proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float | None = None, check: bool = False) -> int:
        """Wait for the run to end (TimeoutError after `timeout` seconds); its exit status.
        `check`: raise TrainingError unless it reached its budget or was stopped."""
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"training run {str(self.run_dir)!r} still running after {timeout} s") from None
        if check and code != 0:
            raise TrainingError(self.run_dir, code, self._why())
        return code

    def _why(self) -> str:
        """The run's last words: its console's last line, else its supervisor log's."""
        for path in (self._console, self.run_dir / "supervisor.log"):
            if path is not None and path.is_file():
                lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
                if lines:
                    return lines[-1].strip()
        return "it said nothing"

    def policy(self, which: str = "best") -> Policy:
        """The run's policy from its best (or latest) checkpoint (see `load`)."""
        return load(self.run_dir, which)

    def __repr__(self) -> str:
        state = "running" if self.running else f"exit {self.returncode}"
        return f"Run({str(self.run_dir)!r}, {self.config.algo} on {self.config.env}, {state})"


def train(env: str | None = None, algo: str | None = None, *, total_steps: int | None = None,
          run_dir: str | Path | None = None, config: str | Path | Mapping[str, Any] | None = None,
          overrides: Sequence[str] = (), seed: int | None = None, network: str | None = None,
          time_limit: float | None = None, stop_at_return: float | None = None,
          resume: str | Path | None = None, quiet: bool = True, wait: bool = True) -> Run:
    """Train as `spreeze train` does (same config, overrides and services) and return the Run.

    `config`: a YAML file or a dict of config sections; `overrides`: "key=value" strings as on
    the command line; the named arguments win over both. `stop_at_return`: end the run once an
    evaluation's mean return reaches it (exit status 0). `resume`: continue a stopped run
    (only budget keys may change). `quiet`: the progress lines go to RUN_DIR/console.log
    instead of this process's stdout. `wait=True` (default) blocks until the budget is spent
    and raises TrainingError if the run failed; `wait=False` returns the running Run.
    A bad config raises ConfigError here, before anything starts."""
    resolved = resolve(config, overrides, resume, env=env, algo=algo, total_steps=total_steps,
                       run_dir=None if run_dir is None else str(run_dir), seed=seed,
                       sparse__network=network, time_limit=time_limit, stop_at_return=stop_at_return)
    from spreeze.common.envs import env_spec
    from spreeze.services.supervisor.start import check_run_dir

    cfg = resolved.config
    env_spec(cfg.env_source)  # an env that cannot be made (id, env_kwargs, env_imports): refused here
    check_run_dir(cfg, resolved.resumed)  # a taken run directory or foreign checkpoints: refused here
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    spec = yaml.safe_dump({"config": to_dict(cfg), "pinned": sorted(resolved.pinned), "resumed": resolved.resumed},
                          sort_keys=False)
    console = Path(cfg.run_dir) / "console.log" if quiet else None
    with open(console if console is not None else os.devnull, "ab") as log:
        out = log if console is not None else None
        proc = subprocess.Popen([sys.executable, "-m", "spreeze.services.supervisor"], stdin=subprocess.PIPE,
                                stdout=out, stderr=subprocess.STDOUT if out else None)
    assert proc.stdin is not None
    with proc.stdin:  # the resolved run, read by services/supervisor/__main__.py
        proc.stdin.write(spec.encode())
    run = Run(resolved, proc, console)
    if wait:
        try:
            run.wait(check=True)
        except KeyboardInterrupt:  # Ctrl-C reached the child too: it stops cleanly
            run.wait()
            raise
    return run


class Policy:
    """A trained actor, acting with numpy (no torch, no service): `predict(obs)`."""

    def __init__(self, actor: Any, config: Config, which: str, path: Path) -> None:
        self._actor, self.config, self.which, self.path = actor, config, which, path
        self.obs_dim, self.act_dim = actor.obs_dim, actor.act_dim
        self._rng = np.random.default_rng(config.seed)

    def predict(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        """The action for one observation [obs_dim] (returns [act_dim]) or a batch [N, obs_dim]
        (returns [N, act_dim]), float32 within the action bounds; `deterministic=False` explores
        as the samplers do (the policy's own noise)."""
        x = np.asarray(obs, np.float32)
        if x.ndim not in (1, 2) or x.shape[-1] != self.obs_dim:
            raise ValueError(f"obs of shape {x.shape}: expected [{self.obs_dim}] or [N, {self.obs_dim}]")
        batch = x[None] if x.ndim == 1 else x
        actions = self._actor.act(batch, self._rng, explore=not deterministic)
        return actions[0] if x.ndim == 1 else actions

    def __repr__(self) -> str:
        return f"Policy({self.config.algo} on {self.config.env}, {self.which} checkpoint of {str(self.path)!r})"


def load(run_dir: str | Path, which: str = "best") -> Policy:
    """The policy of a finished or running run directory: its best (or latest) checkpoint.
    ConfigError naming what is missing when there is none."""
    from spreeze.common.evaluation import checkpoint_actor

    cfg, actor = checkpoint_actor(Path(run_dir), which)
    return Policy(actor, cfg, which, Path(run_dir))


def export(run_dir: str | Path, out: str | Path, format: str = "torchscript", which: str = "best",
           timed: bool = False) -> Exported:
    """Write a run's policy (best or latest checkpoint) to `out` as TorchScript or ONNX: input
    ``obs`` float32 [N, obs_dim], output the deterministic ``action`` [N, act_dim] within the
    action bounds, observation normalisation inside. The file runs without Spreeze: plain
    torch (``torch.jit.load``) or onnxruntime. ONNX needs the ``onnx`` package to write, and
    stores the weight matrices of a sparse run as their non-zeros.

    Returns what was written (``.path``, ``.bytes``, ``.dense_bytes``, ``.zeros``); with
    ``timed=True`` also the cost of one action through the file and through the same policy
    stored dense (``.seconds_per_action``, ``.dense_seconds_per_action``)."""
    from spreeze.common.evaluation import checkpoint_policy
    from spreeze.common.policy_torch import FORMATS, PolicyModule, export_policy, timed as with_times

    if format not in FORMATS:
        raise ConfigError(f"format={format!r} must be one of {', '.join(FORMATS)}")
    _, policy, state, low, high = checkpoint_policy(Path(run_dir), which)
    module = PolicyModule(policy, state, low, high)
    exported = export_policy(module, Path(out), format)
    return with_times(module, exported, format) if timed else exported
