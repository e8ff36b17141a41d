"""Test-only service: registers, heartbeats, answers control, exits 0 on shutdown.

SPREEZE_TEST_BUILD_SECONDS makes it block that long after registering, before its first
heartbeat, as a service importing torch and building networks on a busy machine does."""

from __future__ import annotations

import os
import time
from typing import Any

from spreeze.common.service import Service, run_service


class IdleService(Service):
    ROLE = "idle"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        time.sleep(float(os.environ.get("SPREEZE_TEST_BUILD_SECONDS", "0")))

    async def serve(self) -> None:
        await self.stopping.wait()


if __name__ == "__main__":
    run_service(IdleService)
