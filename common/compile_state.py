"""What a learner's metrics say of its update steps, in words: the console progress line
and the dashboard's health table both show it (services/learner/base.py sends the numbers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def compile_state(values: Mapping[str, Any]) -> str:
    """``compiling (cold, ~30s) 12s`` while the steps compile in the background (the learner
    updates eagerly meanwhile), ``compiled 31s, 1.9x eager`` once they run (the gain once
    measured), ``eager`` with compiling off or failed, ``""`` for metrics that say nothing of it."""
    if values.get("compiling"):
        cold = "cold, " if values.get("compile_cold") else ""
        return (f"compiling ({cold}~{float(values.get('compile_expected_s', 0.0)):.0f}s) "
                f"{float(values.get('compile_elapsed_s', 0.0)):.0f}s")
    if "compile_s" in values:
        gain = f", {float(values['compile_gain']):.1f}x eager" if "compile_gain" in values else ""
        return f"compiled {float(values['compile_s']):.0f}s{gain}"
    return "eager" if "compiling" in values or "update_hz" in values else ""
