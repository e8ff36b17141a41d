"""The end of a run: the supervisor's stop sequence.

Two stop groups, in order: the producers (samplers, learners) and then the services whose
last work must reach disk and dashboard (evaluator, replay, visualizer). Each is told to shut
down (one still starting is sent SIGTERM: it has nothing to keep), waited for, then
terminated. Right after the samplers are told to stop, replay is told to drain. At the end the
goodbyes (last heartbeats) are taken and the ledger is recorded and said.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any
from collections.abc import Callable

from spreeze.common.config import Config
from spreeze.common.transport import Channel
from spreeze.proto.errors import SpreezeError
from spreeze.proto.names import EVALUATOR, REPLAY, VISUALIZER
from spreeze.services.supervisor.externals import External, Externals
from spreeze.services.supervisor.ledger import Ledger
from spreeze.services.supervisor.processes import Child, terminate
from spreeze.services.supervisor.progress import Progress
from spreeze.services.supervisor.samplers import SamplerPool

KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL for a service that outstays its stop grace
GOODBYE_GRACE = 1.0  # seconds for the control loop to take the goodbyes of services that exited cleanly
LAST_TO_STOP = (EVALUATOR, REPLAY, VISUALIZER)  # the final evaluation reaches disk and dashboard


class StopSequence:
    """The supervisor's stop sequence (a base class of Supervisor), and what it uses of it."""

    cfg: Config
    children: dict[str, Child]
    externals: Externals
    samplers: SamplerPool
    stopping: set[str]  # ids of the children shut_down() has asked (or is asking) to stop
    stop_grace: float
    progress: Progress
    ledger: Ledger
    metrics: Channel
    tell: Callable[..., None]  # (service_id, command, key="", value=None): a control command to a service
    say: Callable[[str], None]  # a line on the console and in the log
    write_roster: Callable[[], None]  # run_dir/services.json

    async def shut_down(self) -> None:
        """Producers stop (samplers, learners) and replay drains, then evaluator, replay and visualizer."""
        first = [c for c in self.children.values() if c.spec.role not in LAST_TO_STOP]
        first += self.samplers.leaving()
        last = [c for c in self.children.values() if c.spec.role in LAST_TO_STOP]
        outside = [e for e in self.externals.live() if e.role not in LAST_TO_STOP]
        for group, externals in ((first, outside), (last, self.externals.live(LAST_TO_STOP))):
            self.stopping |= {child.spec.service_id for child in group}
            for child in group:
                child.restart_at = 0.0
                if child.alive and child.registered:
                    self.tell(child.spec.service_id, "shutdown")
                elif child.alive:  # still starting (importing, registering): it has nothing to keep
                    child.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            for ext in externals:
                self.tell(ext.service_id, "shutdown")
            if group is first:
                self.drain()
            await self.wait_exit(group, externals, self.stop_grace)
            # off the event loop: pings must go on meanwhile, or the services still running
            # (replay, the evaluator) take the supervisor for dead and exit without their last work
            await asyncio.to_thread(terminate, group, min(KILL_GRACE, self.stop_grace))
        await self.take_goodbyes(GOODBYE_GRACE)
        for child in self.children.values():  # a clean exit is a stop, its goodbye heard or not (the
            if child.proc is not None and child.proc.poll() == 0:  # last message a process sends
                child.state = "stopped"  # before exiting was seen lost, rarely: 1 in 20-40 here)
        await self.drain_metrics(0.5)
        self.write_roster()
        self.account()

    def drain(self) -> None:
        """Tell replay to store every batch from now on, rate limiter and budget notwithstanding:
        the samplers, told to stop just before (so that they make no new batches on the
        credit its acks give back), flush what they hold."""
        for child in self.children.values():
            if child.spec.role == REPLAY and child.alive and child.registered:
                self.tell(child.spec.service_id, "set", "drain", True)
        for ext in self.externals.live((REPLAY,)):
            self.tell(ext.service_id, "set", "drain", True)

    def account(self) -> None:
        """Record the ledger (ledger.py) and say whether every sampler's env steps were stored."""
        replay: dict[str, Any] = {}
        for values in self.progress.by_role(REPLAY):
            replay.update(values)
        record, summary = self.ledger.record(replay)
        self.progress.record("ledger", record)
        self.say(summary)

    async def wait_exit(self, group: list[Child], externals: list[External], timeout: float) -> None:
        """Until the children exited and the externals said goodbye or went quiet (or the timeout)."""
        deadline = time.monotonic() + timeout
        quiet = 2 * self.cfg.supervisor.heartbeat_interval

        def waiting() -> bool:
            now = time.monotonic()
            return (any(c.alive for c in group)
                    or any(e.live and now - e.last_heartbeat < quiet for e in externals))
        while waiting() and time.monotonic() < deadline:
            await self.drain_metrics(0.1)

    async def take_goodbyes(self, timeout: float) -> None:
        """Until every child that exited by itself (code 0) has had its last heartbeat, state
        `stopped`, taken by the control loop (or the timeout): it is sent just before the exit
        and may still be queued when the exit is seen."""
        deadline = time.monotonic() + timeout

        def pending() -> bool:
            return any(c.registered and c.proc is not None and c.proc.poll() == 0 and c.state != "stopped"
                       for c in self.children.values())
        while pending() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # the control loop runs meanwhile

    async def drain_metrics(self, seconds: float) -> None:
        """Take the metrics records that arrived (for up to `seconds`) into the run's progress."""
        try:
            for _, msg in await self.metrics.recv_many(1024, timeout=seconds):
                self.progress.take(msg)
        except SpreezeError:
            pass
