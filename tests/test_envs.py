"""common/envs.py: env checks, and EnvBatch's rows at truncation and termination."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from spreeze.common.config import load_config
from spreeze.common.env_source import EnvSource, WrapperSpec
from spreeze.common.envs import EnvBatch, env_spec, make_env
from spreeze.common.errors import ConfigError, EnvArgumentError

pytestmark = pytest.mark.timeout(10)


def test_make_env_refuses_unknown_ids_and_discrete_actions() -> None:
    with pytest.raises(ConfigError, match="NoSuchEnv-v9"):
        make_env("NoSuchEnv-v9")
    with pytest.raises(ConfigError, match="CartPole-v1.*1-D Box"):
        make_env("CartPole-v1")


def test_env_wrappers_from_config_wrap_innermost_first() -> None:
    """FrameStackObservation makes a [2, 3] observation, FlattenObservation then a flat 6: in
    the other order the observation is not flat and the env is refused by name."""
    cfg = load_config(overrides=["env=Pendulum-v1",
                                 'env_wrappers=[{FrameStackObservation: {stack_size: 2}}, FlattenObservation]'])
    assert cfg.env_source.wrappers == (WrapperSpec("FrameStackObservation", (("stack_size", 2),)),
                                       WrapperSpec("FlattenObservation"))
    layout, _, _ = env_spec(cfg.env_source)
    assert layout.obs_dim == 6
    env = make_env(cfg.env_source, seed=0)
    first, _ = env.reset(seed=0)
    second = env.step(np.zeros(1, np.float32))[0]
    assert np.array_equal(second[:3], first[3:])  # the older frame first
    reversed_order = EnvSource("Pendulum-v1", wrappers=(WrapperSpec("FlattenObservation"),
                                                        WrapperSpec("FrameStackObservation", (("stack_size", 2),))))
    with pytest.raises(ConfigError, match=r"needs a flat Box \(env_wrappers=\[FlattenObservation\]"):
        make_env(reversed_order)


def test_a_users_wrapper_by_module_path() -> None:
    src = EnvSource("tests.custom_envs:SpreezeTests/Drift-v0", wrappers=(
        WrapperSpec("tests.custom_envs:Truncate", (("steps", 2),)),))
    env = make_env(src)
    env.reset(seed=0)
    assert [env.step(np.zeros(1, np.float32))[3] for _ in range(2)] == [False, True]


def test_a_dict_observation_is_flattened_in_key_order() -> None:
    src = EnvSource("tests.custom_envs:SpreezeTests/Drift-v0", kwargs=(("target", 0.25),),
                    wrappers=(WrapperSpec("tests.custom_envs:Split"),))
    env = make_env(src)
    assert env.observation_space.shape == (2,)
    obs, _ = env.reset(seed=0)
    assert obs[1] == np.float32(0.25)  # position, then target: the keys in sorted order


def test_a_dm_control_task_is_made_without_env_imports_and_flattened() -> None:
    """The dm-control extra where it is installed (the slow suite trains on it: tests/test_api.py)."""
    pytest.importorskip("shimmy")
    pytest.importorskip("dm_control")
    batch = EnvBatch("dm_control/cartpole-swingup-v0", 2, seed=0)
    try:
        assert batch.obs.shape == (2, 5) and batch.obs.dtype == np.float32  # position (3), velocity (2), flat
        assert (batch.layout.obs_dim, batch.layout.act_dim) == (5, 1)
        rows = np.zeros((2, batch.layout.width), np.float32)
        batch.step(np.zeros((2, 1), np.float32), rows)
        assert np.isfinite(rows).all() and batch.steps == 2
    finally:
        batch.close()


def test_a_known_namespace_without_its_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from spreeze.common import envs

    monkeypatch.setitem(envs.NAMESPACE_PACKAGES, "dm_control", ("no_such_shimmy", "spreeze[dm-control]"))
    with pytest.raises(ConfigError, match=r"env='dm_control/cartpole-swingup-v0': its namespace 'dm_control' "
                                          r"needs the no_such_shimmy package .*pip install 'spreeze\[dm-control\]'"):
        make_env("dm_control/cartpole-swingup-v0")


@pytest.mark.parametrize(("wrappers", "error", "match"), [
    ("[NoSuchWrapper]", ConfigError, "env_wrappers: 'NoSuchWrapper' is not a gymnasium wrapper class "
                                     "\\(gymnasium.wrappers has no NoSuchWrapper\\)"),
    ("[no_such_pkg:Wrap]", ConfigError, "env_wrappers: 'no_such_pkg:Wrap': module 'no_such_pkg' cannot be imported"),
    ("[numpy:ndarray]", ConfigError, "'numpy:ndarray' is not a gymnasium wrapper class"),
    ("[{ClipAction: {low: 1}}]", EnvArgumentError, r"env_wrappers: ClipAction\(low=1\) cannot wrap env='Pendulum-v1'"),
])
def test_bad_wrappers_are_refused_by_name(wrappers: str, error: type[Exception], match: str) -> None:
    cfg = load_config(overrides=["env=Pendulum-v1", f"env_wrappers={wrappers}"])
    with pytest.raises(error, match=match):
        make_env(cfg.env_source)


@pytest.mark.parametrize("bad", ["ClipAction", "[{}]", "[{a: 1, b: 2}]", "[3]", "[{ClipAction: [1]}]", "['']"])
def test_malformed_env_wrappers_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError, match="env_wrappers"):
        load_config(overrides=["env=Pendulum-v1", f"env_wrappers={bad}"])


def test_env_spec_of_pendulum() -> None:
    layout, low, high = env_spec("Pendulum-v1")
    assert (layout.obs_dim, layout.act_dim, layout.width) == (3, 1, 9)
    assert low.dtype == np.float32 and low.tolist() == [-2.0] and high.tolist() == [2.0]


def test_rows_chain_obs_to_next_obs_and_count_steps() -> None:
    envs = EnvBatch("Pendulum-v1", 3, seed=5)
    rows = np.empty((2 * 3, envs.layout.width), np.float32)
    rng = np.random.default_rng(0)
    first = envs.obs.copy()
    for t in range(2):
        actions = envs.random_actions(rng)
        assert actions.shape == (3, 1) and (actions >= -2).all() and (actions <= 2).all()
        assert envs.step(actions, rows[3 * t:3 * t + 3]) == []
        assert np.array_equal(envs.layout.columns(rows[3 * t:3 * t + 3])["action"], actions)
    cols = envs.layout.columns(rows)
    assert np.array_equal(cols["obs"][:3], first)
    assert np.array_equal(cols["obs"][3:], cols["next_obs"][:3])  # step t+1 starts where t ended
    assert np.array_equal(cols["next_obs"][3:], envs.obs)
    assert envs.steps == 6 and (cols["done"] == 0).all()
    envs.close()


def test_truncation_is_not_done_and_keeps_the_true_final_obs() -> None:
    """Pendulum truncates at 200 steps: done must stay 0 and next_obs must be the last
    observation of the episode (as a reference env shows), not the reset one."""
    n, seed = 2, 11
    envs = EnvBatch("Pendulum-v1", n, seed=seed)
    refs = [gym.make("Pendulum-v1") for _ in range(n)]
    for i, ref in enumerate(refs):
        ref.reset(seed=seed + i)
    rng = np.random.default_rng(1)
    rows = np.empty((n, envs.layout.width), np.float32)
    for t in range(200):
        actions = envs.random_actions(rng)
        finished = envs.step(actions, rows)
        ref_steps = [ref.step(actions[i]) for i, ref in enumerate(refs)]
        if t < 199:
            assert finished == []
    cols = envs.layout.columns(rows)
    assert all(truncated and not terminated for _, _, terminated, truncated, _ in ref_steps)
    assert [length for _, length in finished] == [200, 200]
    assert (cols["done"] == 0).all()
    for i, (final_obs, reward, *_rest) in enumerate(ref_steps):
        np.testing.assert_allclose(cols["next_obs"][i], final_obs, rtol=1e-6)
        assert cols["reward"][i] == pytest.approx(reward, rel=1e-6)
        reset_obs, _ = refs[i].reset()  # EnvBatch resets without a seed: same continuation
        np.testing.assert_allclose(envs.obs[i], reset_obs, rtol=1e-6)
        assert not np.allclose(cols["next_obs"][i], envs.obs[i])
    assert (envs.ep_length == 0).all() and (envs.ep_return == 0).all()
    envs.close()


def test_termination_is_done_with_the_terminal_obs() -> None:
    """InvertedPendulum terminates when the pole passes 0.2 rad: done=1 on that row only,
    next_obs is the fallen state, and the env's next row starts from a fresh reset."""
    envs = EnvBatch("InvertedPendulum-v5", 1, seed=3)
    rng = np.random.default_rng(2)
    rows = np.empty((300, envs.layout.width), np.float32)
    ended: list[tuple[int, float, int]] = []
    for t in range(300):
        for ret, length in envs.step(envs.random_actions(rng), rows[t:t + 1]):
            ended.append((t, ret, length))
    cols = envs.layout.columns(rows)
    done_rows = np.flatnonzero(cols["done"])
    assert len(ended) >= 2, "random actions should drop the pole within a few dozen steps"
    assert done_rows.tolist() == [t for t, _, _ in ended]
    start = 0
    for t, ret, length in ended:
        assert abs(cols["next_obs"][t, 1]) > 0.2  # the angle that ended the episode
        assert length == t - start + 1
        assert ret == pytest.approx(float(cols["reward"][start:t + 1].sum()), rel=1e-5)
        if t + 1 < len(rows):
            assert abs(cols["obs"][t + 1, 1]) <= 0.01  # reset state, not the fallen one
        start = t + 1
    envs.close()


def test_making_halfcheetah_prints_no_mujoco_deprecation() -> None:
    """gymnasium's HalfCheetah model uses `settotalmass`, which MuJoCo 3.3+ warns about on
    stdout at every load: a fresh process making it twice prints nothing of it."""
    code = ("from spreeze.common.envs import make_env\n"
            "make_env('HalfCheetah-v5').close(); make_env('HalfCheetah-v5').close()\n"
            "import mujoco; from spreeze.common.envs import _mujoco_warning\n"
            "assert mujoco.get_mju_user_warning() is _mujoco_warning\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "settotalmass" not in done.stdout + done.stderr


def test_other_mujoco_warnings_reach_the_log(caplog: pytest.LogCaptureFixture) -> None:
    from spreeze.common.envs import _mujoco_warning
    with caplog.at_level("WARNING", logger="spreeze.common.envs"):
        _mujoco_warning("compiler attribute 'settotalmass' is deprecated and will be removed")
        _mujoco_warning("Nan, Inf or huge value in QACC at DOF 0")
    assert [r.getMessage() for r in caplog.records] == ["MuJoCo: Nan, Inf or huge value in QACC at DOF 0"]
