"""The run's local samplers as the tuner changes their number: one more starts under a fresh id,
the newest one retires (told to leave, it flushes its pushes and exits, and is not restarted),
and those that left are forgotten; one that outstays its grace period is killed."""

from __future__ import annotations

import time
from collections.abc import Callable

from spreeze.proto.names import SAMPLER
from spreeze.services.supervisor.processes import Child, service, terminate


class SamplerPool:
    def __init__(self, children: dict[str, Child], start: Callable[[Child], None],
                 tell: Callable[[str, str], None], next_index: int, grace: float) -> None:
        self.children = children  # the supervisor's own dict: samplers join and leave it here
        self.start, self.tell = start, tell
        self.next_index = next_index  # of the next sampler started at runtime
        self.grace = grace  # seconds a retired sampler has to exit
        self.retiring: list[tuple[Child, float]] = []  # samplers told to leave, with their exit deadline

    def add(self) -> Child:
        """Start one more sampler process (a fresh id: a leaving one may still hold its old id)."""
        sid = f"{SAMPLER}-{self.next_index}"
        self.next_index += 1
        child = self.children[sid] = Child(service(SAMPLER, sid))
        self.start(child)
        return child

    def retire(self) -> Child | None:
        """Tell the most recently started sampler to leave; None when it is the last one."""
        samplers = [c for c in self.children.values() if c.spec.role == SAMPLER]
        if len(samplers) <= 1:
            return None
        child = max(samplers, key=lambda c: c.started)
        del self.children[child.spec.service_id]
        child.restart_at, child.state = 0.0, "leaving"
        self.retiring.append((child, time.monotonic() + self.grace))
        if child.alive and child.registered:
            self.tell(child.spec.service_id, "shutdown")
        return child

    def reap(self, now: float) -> None:
        """Forget samplers that left; kill one that outstays its grace period."""
        for child, deadline in self.retiring:
            if child.alive and now > deadline:
                terminate([child], timeout=1.0)
        self.retiring = [(c, d) for c, d in self.retiring if c.alive]

    def leaving(self) -> list[Child]:
        return [c for c, _ in self.retiring]
