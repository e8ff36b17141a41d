"""Test-only service that will not stop: it starts a helper process (as a sampler starts env
workers), then on shutdown or SIGTERM blocks in close() for an hour (as a learner waiting
for its background compile does). Writes "<its pid> <helper pid>" to run_dir/stubborn.pids
once it runs. Run as `python -m tests.stubborn_service`."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from spreeze.common.service import Service, run_service


class StubbornService(Service):
    ROLE = "stubborn"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.helper = subprocess.Popen(["sleep", "3600"])
        pids = Path(self.cfg.run_dir) / "stubborn.pids"
        pids.with_suffix(".tmp").write_text(f"{os.getpid()} {self.helper.pid}")
        os.replace(pids.with_suffix(".tmp"), pids)

    async def serve(self) -> None:
        await self.stopping.wait()

    async def close(self) -> None:
        time.sleep(3600)  # blocks the event loop: no goodbye, no exit


if __name__ == "__main__":
    run_service(StubbornService)
