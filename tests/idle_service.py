"""Test-only service: registers, heartbeats, answers control, exits 0 on shutdown."""

from __future__ import annotations

from common.service import Service, run_service


class IdleService(Service):
    ROLE = "idle"

    async def serve(self) -> None:
        await self.stopping.wait()


if __name__ == "__main__":
    run_service(IdleService)
