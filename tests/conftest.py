"""Shared fixtures: a private ipc:// socket directory, and process-wide state a test may
leave behind, put back after each test."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator

import pytest

from spreeze.common.transport import make_ipc_dir


@pytest.fixture(autouse=True)
def _guards_back_on() -> Iterator[None]:
    """A learner run in the test process turns dynamo's guard checks off once its steps are
    compiled (common.algorithms.compiled.check_guards); that switch is process-wide, and a
    later test's new step (another closure of the same code) must be compiled and told
    apart by its guards."""
    yield
    if "torch" in sys.modules:  # never import torch for a test that did not
        from spreeze.common.algorithms.compiled import check_guards
        check_guards(True)


@pytest.fixture
def ipc_dir() -> Iterator[str]:
    """A private, short directory for a test's ipc:// sockets, removed afterwards."""
    d = make_ipc_dir("spzt-")
    yield d
    shutil.rmtree(d, ignore_errors=True)
