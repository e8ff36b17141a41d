"""The conformance report: one line per check, passed or failed, with what was seen."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Abort(Exception):
    """A check failed that the rest depend on (no registration, a silent service)."""


@dataclass
class Result:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Report:
    role: str
    endpoint: str
    results: list[Result] = field(default_factory=list)

    def check(self, name: str, ok: Any, detail: str = "") -> bool:
        """Record one check (its section of SPEC.md in the name); the outcome as a bool."""
        self.results.append(Result(name, bool(ok), "" if ok else detail))
        return bool(ok)

    def require(self, name: str, ok: Any, detail: str = "") -> None:
        """A check the rest depend on: a failure aborts the run (reported)."""
        if not self.check(name, ok, detail):
            raise Abort(f"{name}: {detail}")

    @property
    def passed(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def failed(self) -> int:
        return len(self.results) - self.passed

    def text(self) -> str:
        lines = [f"conformance {self.role} at {self.endpoint}"]
        lines += [f"  {'PASS' if r.ok else 'FAIL'}  {r.name}" + (f": {r.detail}" if r.detail else "")
                  for r in self.results]
        lines.append(f"{self.passed} passed, {self.failed} failed")
        return "\n".join(lines)
