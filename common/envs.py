"""Gymnasium environments stepped in batches, writing transition rows in place.

Our own small vectorization rather than gymnasium's vector envs: it writes each step
straight into the rows of the outgoing Experience matrix, stores the TRUE final
observation at episode ends (not the reset one), and marks only termination as done,
so truncated episodes are bootstrapped.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from spreeze.common.env_source import EnvSource
from spreeze.common.errors import ConfigError, EnvArgumentError
from spreeze.proto.messages import TransitionLayout


log = logging.getLogger(__name__)

GL_OFF = "disable"  # MuJoCo's own MUJOCO_GL value for "no GL": its import then loads no GL library


# Namespaces of gymnasium ids whose environments a package registers when it is imported,
# with the extra that installs it: `--env dm_control/cartpole-swingup-v0` needs no env_imports.
NAMESPACE_PACKAGES = {"dm_control": ("shimmy", "spreeze[dm-control]")}
MUJOCO_NAMESPACES = ("dm_control",)  # simulated by MuJoCo: filmed like gymnasium's MuJoCo envs


def namespace_of(env_id: str) -> str | None:
    """The namespace of a gymnasium id (`dm_control/cartpole-swingup-v0`: dm_control), after any module: prefix."""
    try:
        return gym.envs.registration.parse_env_id(env_id.rsplit(":", 1)[-1])[0]
    except gym.error.Error:
        return None  # gym.make says what is wrong with it


def is_mujoco(env_id: str) -> bool:
    """Whether gymnasium's registry builds `env_id` with MuJoCo (without importing MuJoCo)."""
    if namespace_of(env_id) in MUJOCO_NAMESPACES:
        return True  # registered only once its package is imported
    try:
        entry = gym.spec(env_id).entry_point
    except gym.error.Error:
        return False
    return "mujoco" in str(entry)


def import_mujoco_without_gl() -> None:
    """Import MuJoCo with MUJOCO_GL=disable, then put the variable back.

    MuJoCo loads the GL library that MUJOCO_GL names when it is first imported, and some
    crash that import where the library is missing (osmesa without libOSMesa). Stepping an
    environment needs no GL, and gymnasium's renderer loads its backend itself when asked
    for a frame, so no process's environments depend on GL this way."""
    if "mujoco" in sys.modules:
        return
    saved = os.environ.get("MUJOCO_GL")
    os.environ["MUJOCO_GL"] = GL_OFF
    try:
        importlib.import_module("mujoco")
    finally:
        if saved is None:
            del os.environ["MUJOCO_GL"]
        else:
            os.environ["MUJOCO_GL"] = saved


# MuJoCo 3.3+ deprecates the `settotalmass` compiler attribute that gymnasium's own
# HalfCheetah model file uses, and prints so on every load of it: a warning about a file
# the user cannot change, dropped by the handler below (every other MuJoCo warning is logged).
DROPPED_MUJOCO_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)


def _mujoco_warning(message: str) -> None:
    if not message.startswith(DROPPED_MUJOCO_WARNINGS):
        log.warning("MuJoCo: %s", message)


def route_mujoco_warnings() -> None:
    """Send MuJoCo's C-level warnings (printed to stdout by default) to this module's logger,
    without the deprecation of gymnasium's own model files (DROPPED_MUJOCO_WARNINGS)."""
    import mujoco
    if mujoco.get_mju_user_warning() is not _mujoco_warning:
        mujoco.set_mju_user_warning(_mujoco_warning)




def import_namespace_package(env_id: str) -> None:
    """Import the package that registers `env_id`'s namespace (NAMESPACE_PACKAGES), if any.

    dm_control picks its GL backend when first imported: the MUJOCO_GL this process chose for
    videos (common/video.py) when there is one, else none, so that stepping never loads GL."""
    namespace = namespace_of(env_id)
    if namespace not in NAMESPACE_PACKAGES or NAMESPACE_PACKAGES[namespace][0] in sys.modules:
        return
    module, extra = NAMESPACE_PACKAGES[namespace]
    import_mujoco_without_gl()
    saved = os.environ.get("MUJOCO_GL")
    os.environ["MUJOCO_GL"] = saved or GL_OFF
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"env={env_id!r}: its namespace {namespace!r} needs the {module} package "
                          f"({exc}): pip install '{extra}'") from None
    finally:
        if saved is None:
            del os.environ["MUJOCO_GL"]


def import_env_modules(modules: tuple[str, ...]) -> None:
    """Import the modules that register a user's environments; ConfigError naming a missing one."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"env_imports: module {name!r} cannot be imported ({exc}); is its package "
                              "installed (or on PYTHONPATH) where every service runs?") from None


def wrapper_class(name: str) -> type[gym.Wrapper]:
    """A wrapper of ``env_wrappers`` by name: gymnasium.wrappers' own (``ClipAction``) or a
    user's (``my_package.wrappers:ActionRepeat``); ConfigError naming what is not there."""
    module_name, sep, attr = name.rpartition(":")
    module_name = module_name if sep else "gymnasium.wrappers"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"env_wrappers: {name!r}: module {module_name!r} cannot be imported ({exc}); is its "
                          "package installed (or on PYTHONPATH) where every service runs?") from None
    found = getattr(module, attr, None)
    if not (isinstance(found, type) and issubclass(found, gym.Wrapper)):
        raise ConfigError(f"env_wrappers: {name!r} is not a gymnasium wrapper class ({module_name} has "
                          f"{'no ' + attr if found is None else repr(found)})")
    return found


def wrap(env: gym.Env, src: EnvSource) -> gym.Env:
    """Put the source's wrappers around `env`, innermost first; a keyword a wrapper does not
    take is an EnvArgumentError naming it."""
    for spec in src.wrappers:
        cls = wrapper_class(spec.name)
        try:
            env = cls(env, **dict(spec.kwargs))
        except TypeError as exc:
            env.close()
            raise EnvArgumentError(f"env_wrappers: {spec.describe()} cannot wrap {src.describe()}: {exc}") from None
    return env


def make_env(env: str | EnvSource, seed: int | None = None, **kwargs: object) -> gym.Env:
    """gym.make with a clear error for unknown ids, bad keyword arguments and non-continuous
    action spaces; then the source's wrappers (config ``env_wrappers``), and a Dict observation
    still left flattened. The package of a known namespace is imported first. ``kwargs``
    (rendering) go with the source's own env_kwargs."""
    src = EnvSource.of(env)
    import_env_modules(src.imports)
    import_namespace_package(src.id)
    if is_mujoco(src.id):
        import_mujoco_without_gl()
        route_mujoco_warnings()
    try:
        made = gym.make(src.id, **dict(src.kwargs), **kwargs)
    except TypeError as exc:  # an argument the environment does not take
        raise EnvArgumentError(f"{src.describe()} cannot be made: {exc}") from None
    except (gym.error.Error, ValueError, ImportError) as exc:
        # an unknown id, a bad argument value, a module of gymnasium's module:EnvId that is not there
        raise ConfigError(f"{src.describe()} cannot be made: {exc}") from None
    made = wrap(made, src)
    if isinstance(made.observation_space, gym.spaces.Dict):  # dm_control's, or any left after env_wrappers
        made = gym.wrappers.FlattenObservation(made)  # its keys in sorted order, one flat Box
    space = made.action_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        made.close()
        raise ConfigError(f"env={src.id!r} has action space {space}, Spreeze needs a 1-D Box")
    if len(made.observation_space.shape or ()) != 1:
        made.close()
        raise ConfigError(f"env={src.id!r} has observation space {made.observation_space}, Spreeze needs a "
                          "flat Box (env_wrappers=[FlattenObservation] flattens a Dict or a multi-dimensional Box)")
    if seed is not None:
        made.action_space.seed(seed)
    return made


@dataclass(frozen=True)
class Task:
    """What the start plan derives settings from: the task's sizes and whether it ends episodes early."""

    env_id: str
    obs_dim: int
    act_dim: int
    ends_early: bool  # episodes end when the agent fails (falls), not only at the time limit


def task_facts(env_id: str | EnvSource) -> Task:
    """The task's sizes, and early termination as the MuJoCo locomotion envs declare it
    (``terminate_when_unhealthy``: Hopper, Walker2d, Ant, Humanoid; not HalfCheetah, Swimmer)."""
    env = make_env(env_id)
    try:
        ends_early = bool(getattr(env.unwrapped, "_terminate_when_unhealthy", False))
        return Task(EnvSource.of(env_id).id, env.observation_space.shape[0], env.action_space.shape[0], ends_early)
    finally:
        env.close()


def env_spec(env_id: str | EnvSource) -> tuple[TransitionLayout, np.ndarray, np.ndarray]:
    """(layout, action low, action high) of an environment id."""
    env = make_env(env_id)
    try:
        space = env.action_space
        layout = TransitionLayout(env.observation_space.shape[0], space.shape[0])
        return layout, space.low.astype(np.float32), space.high.astype(np.float32)
    finally:
        env.close()


class EnvBatch:
    """E environments of one id, stepped one after another in this process."""

    def __init__(self, env_id: str | EnvSource, n: int, seed: int) -> None:
        self.envs = [make_env(env_id, seed + i) for i in range(n)]
        space = self.envs[0].action_space
        self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)
        self.layout = TransitionLayout(self.envs[0].observation_space.shape[0], space.shape[0])
        self.obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(self.envs)]).astype(np.float32)
        self.ep_return = np.zeros(n)
        self.ep_length = np.zeros(n, np.int64)
        self.steps = 0

    def __len__(self) -> int:
        return len(self.envs)

    def step(self, actions: np.ndarray, rows: np.ndarray) -> list[tuple[float, int]]:
        """Step every env with `actions` [E, act_dim]; write E transition rows into `rows`.

        Returns (return, length) of each episode that ended in this step."""
        cols = self.layout.columns(rows)
        cols["obs"][:] = self.obs
        cols["action"][:] = actions
        finished = []
        for i, env in enumerate(self.envs):
            next_obs, reward, terminated, truncated, _ = env.step(actions[i])
            cols["reward"][i] = reward
            cols["next_obs"][i] = next_obs
            cols["done"][i] = 1.0 if terminated else 0.0
            self.ep_return[i] += reward
            self.ep_length[i] += 1
            if terminated or truncated:
                finished.append((float(self.ep_return[i]), int(self.ep_length[i])))
                self.ep_return[i], self.ep_length[i] = 0.0, 0
                next_obs, _ = env.reset()
            self.obs[i] = next_obs
        self.steps += len(self.envs)
        return finished

    def random_actions(self, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(self.low, self.high, (len(self.envs), len(self.low))).astype(np.float32)

    def close(self) -> None:
        for env in self.envs:
            env.close()
