"""common/config.py: YAML + overrides, types, tuples, unknown keys, cross checks, docs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spreeze.common.config import Config, from_dict, load_config, to_dict
from spreeze.common.config_docs import field_docs
from spreeze.common.config_text import parse_override
from spreeze.common.errors import ConfigError

pytestmark = pytest.mark.timeout(10)


def leaves(data: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in data.items():
        out |= leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}"}  # {}: a mapping key
    return out


def test_yaml_file_and_overrides_merge(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("env: Pendulum-v1\nreplay:\n  capacity: 5000\n  min_size: 100\ntd3:\n  hidden: [64, 64]\n")
    cfg = load_config(path, ["replay.min_size=200", "learner.batch_size=64", "seed=3"])
    assert cfg.env == "Pendulum-v1" and cfg.seed == 3
    assert (cfg.replay.capacity, cfg.replay.min_size) == (5000, 200)  # the override wins, per key
    assert cfg.replay.tolerance == Config().replay.tolerance  # untouched keys keep defaults
    assert cfg.learner.batch_size == 64 and cfg.section("td3").hidden == (64, 64)


def test_type_coercion(tmp_path: Path) -> None:
    cfg = load_config(None, ["replay.tolerance=1", "time_limit=5"])
    assert cfg.replay.tolerance == 1.0 and type(cfg.replay.tolerance) is float
    assert type(cfg.time_limit) is float
    lrs = load_config(None, ["td3.actor_lr=3e-4", "sac.critic_lr=2E-3", "td3.critic_lr=.5"])
    td3, sac = lrs.section("td3"), lrs.section("sac")
    assert (td3.actor_lr, sac.critic_lr, td3.critic_lr) == (3e-4, 2e-3, 0.5)  # YAML reads 3e-4 as text
    path = tmp_path / "lr.yaml"
    path.write_text("td3:\n  actor_lr: 3e-4\n")
    assert load_config(path, []).section("td3").actor_lr == 3e-4
    for override, named in [("learner.batch_size=big", "learner.batch_size='big'"),
                            ("td3.actor_lr=3e-4x", "td3.actor_lr='3e-4x'"),
                            ("td3.actor_lr=inf", "td3.actor_lr='inf'"),
                            ("learner.batch_size=2.5", "learner.batch_size=2.5"),
                            ("seed=true", "seed=True"),
                            ("env=3", "env=3"),
                            ("replay.reject_non_finite=1", "replay.reject_non_finite=1")]:
        with pytest.raises(ConfigError, match="must be of type") as err:
            load_config(None, [override])
        assert named in str(err.value)


def test_tuple_fields() -> None:
    assert load_config(None, ["td3.hidden=[64,64]"]).section("td3").hidden == (64, 64)
    assert load_config(None, ["sac.hidden=[8]"]).section("sac").hidden == (8,)
    with pytest.raises(ConfigError, match="td3.hidden=.*list of integers"):
        load_config(None, ["td3.hidden=[64,x]"])
    with pytest.raises(ConfigError, match="td3.hidden"):
        load_config(None, ["td3.hidden=[]"])  # validated by TD3Config, still a ConfigError


@pytest.mark.parametrize("overrides, named", [
    (["replay.capcity=10"], "unknown config key replay.capcity"),
    (["nosuch.key=1"], "unknown config key nosuch"),
    (["replay=5"], "replay must be a mapping"),
    (["learner.mode=sideways"], "learner.mode='sideways'"),
    (["replay.min_size=10", "replay.capacity=5"], "replay.min_size=10 exceeds replay.capacity=5"),
    (["eval.every_updates=0", "eval.every_seconds=0"], "eval.every_updates and eval.every_seconds"),
    (["learner.prefetch=17"], "learner.prefetch=17"),
    (["learner.actor_device=tpu"], "learner.actor_device='tpu'"),
    (["novalue"], "not of the form key=value"),
])
def test_bad_values_are_refused_by_name(overrides: list[str], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert named in str(err.value)


def test_split_learners_need_enough_lag_for_one_sync_round() -> None:
    """The critic waits past max_lag; the actor syncs every sync_every x delay critic updates."""
    ok = ["learner.mode=split", "learner.sync_every=4"]
    assert load_config(None, [*ok, "learner.max_lag=7"]).learner.max_lag == 7  # TD3: 4 x 2 - 1
    with pytest.raises(ConfigError, match="learner.max_lag=6"):
        load_config(None, [*ok, "learner.max_lag=6"])
    assert load_config(None, [*ok, "learner.max_lag=3", "algo=sac"]).algo == "sac"  # SAC: 4 x 1 - 1
    assert load_config(None, ["learner.sync_every=64", "learner.max_lag=1"]).learner.mode == "fused"


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at top level"):
        load_config(listing)


def test_parse_override_values_are_yaml() -> None:
    assert parse_override("replay.capacity=1000") == (["replay", "capacity"], 1000)
    assert parse_override("run_dir=") == (["run_dir"], "")
    assert parse_override("sac.target_entropy=null") == (["sac", "target_entropy"], None)


def test_to_dict_from_dict_round_trip() -> None:
    """What the supervisor sends in Welcome.config rebuilds the same Config."""
    cfg = load_config(None, ["td3.hidden=[64,32]", "learner.mode=split", "sac.target_entropy=-2.0"])
    data = to_dict(cfg)
    assert data["td3"]["hidden"] == [64, 32]
    assert from_dict(data) == cfg


def test_field_docs_cover_every_leaf() -> None:
    rows = field_docs()
    keys = [key for key, _, _ in rows]
    assert set(keys) == leaves(to_dict(Config())) and len(keys) == len(set(keys))
    missing = [key for key, _, doc in rows if not doc.strip()]
    assert not missing, missing
    defaults = dict((key, default) for key, default, _ in rows)
    assert defaults["replay.capacity"] == "1000000" and defaults["td3.hidden"] == "(64, 64)"
