"""Every shipped YAML config loads and validates."""

from __future__ import annotations

from pathlib import Path

import pytest

from spreeze.common.config import Config, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_there_are_configs() -> None:
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, Config)
