"""Bench-only service: fill replay with random transitions, then idle.

Registers like any service (`python -m spreeze.bench.filler` under the Supervisor), pushes random
Experience of the run env's sizes (done = 0) on the experience socket until it has sent
replay.capacity transitions (the ring is then full), publishes `pushed` once, and waits
for shutdown without using the CPU, so that a learner benchmark measures the learner
alone rather than a sampler competing for cores.
"""

from __future__ import annotations

import asyncio

from typing import Any

import numpy as np

from spreeze.common.envs import env_spec
from spreeze.common.service import Service, run_service
from spreeze.proto.messages import Experience

CHUNK = 4096  # transitions per pushed message


class Filler(Service):
    ROLE = "filler"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pushed = 0  # transitions sent

    def counters(self) -> dict[str, int]:
        return {"pushed": self.pushed}

    async def serve(self) -> None:
        layout, _, _ = env_spec(self.cfg.env_source)
        push = self.channel("experience", binding=False)
        rng = np.random.default_rng(self.cfg.seed + 29)
        target = self.cfg.replay.capacity
        while self.running and self.pushed < target:
            n = min(CHUNK, target - self.pushed)
            rows = rng.uniform(-1.0, 1.0, (n, layout.width)).astype(np.float32)  # fresh: sends are zero-copy
            layout.columns(rows)["done"][:] = 0.0
            self.pushed += n
            await push.send(Experience(rows, layout.obs_dim, layout.act_dim, self.pushed))
            await asyncio.sleep(0)  # a send that does not block never yields: let heartbeats run
        self.publish({"pushed": self.pushed})
        await self.stopping.wait()


if __name__ == "__main__":
    run_service(Filler)
