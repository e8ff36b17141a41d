"""Process-wide state a test may leave behind, put back after each test."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _guards_back_on() -> Iterator[None]:
    """A learner run in the test process turns dynamo's guard checks off once its steps are
    compiled (common.algorithms.compiled.check_guards); that switch is process-wide, and a
    later test's new step (another closure of the same code) must be compiled and told
    apart by its guards."""
    yield
    if "torch" in sys.modules:  # never import torch for a test that did not
        from common.algorithms.compiled import check_guards
        check_guards(True)
