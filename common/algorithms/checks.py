"""Validation helpers for the algorithms' hyperparameter dataclasses (torch-free)."""

from __future__ import annotations


def check(ok: bool, field: str, value: object, requirement: str) -> None:
    """Raise ``ValueError("field=value requirement")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{field}={value!r} {requirement}")


def check_hidden(field: str, hidden: object) -> None:
    """Hidden sizes must be a non-empty sequence of positive ints."""
    ok = isinstance(hidden, (tuple, list)) and len(hidden) > 0 and all(
        isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in hidden)
    check(ok, field, hidden, "must be a non-empty sequence of positive ints")
