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
from typing import TYPE_CHECKING, Any

from spreeze.proto.errors import SpreezeError
from spreeze.proto.names import EVALUATOR, REPLAY, VISUALIZER
from spreeze.services.supervisor.externals import External
from spreeze.services.supervisor.processes import Child, terminate

if TYPE_CHECKING:
    from spreeze.services.supervisor.main import Supervisor

KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL for a service that outstays its stop grace
GOODBYE_GRACE = 1.0  # seconds for the control loop to take the goodbyes of services that exited cleanly
LAST_TO_STOP = (EVALUATOR, REPLAY, VISUALIZER)  # the final evaluation reaches disk and dashboard


async def shut_down(sup: Supervisor) -> None:
    """Producers stop (samplers, learners) and replay drains, then evaluator, replay and visualizer."""
    first = [c for c in sup.children.values() if c.spec.role not in LAST_TO_STOP]
    first += sup.samplers.leaving()
    last = [c for c in sup.children.values() if c.spec.role in LAST_TO_STOP]
    outside = [e for e in sup.externals.live() if e.role not in LAST_TO_STOP]
    for group, externals in ((first, outside), (last, sup.externals.live(LAST_TO_STOP))):
        sup.stopping |= {child.spec.service_id for child in group}
        for child in group:
            child.restart_at = 0.0
            if child.alive and child.registered:
                sup.tell(child.spec.service_id, "shutdown")
            elif child.alive:  # still starting (importing, registering): it has nothing to keep
                child.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for ext in externals:
            sup.tell(ext.service_id, "shutdown")
        if group is first:
            drain(sup)
        await wait_exit(sup, group, externals, sup.stop_grace)
        # off the event loop: pings must go on meanwhile, or the services still running
        # (replay, the evaluator) take the supervisor for dead and exit without their last work
        await asyncio.to_thread(terminate, group, min(KILL_GRACE, sup.stop_grace))
    await take_goodbyes(sup, GOODBYE_GRACE)
    await drain_metrics(sup, 0.5)
    sup.write_roster()
    account(sup)


def drain(sup: Supervisor) -> None:
    """Tell replay to store every batch from now on, rate limiter and budget notwithstanding:
    the samplers, told to stop just before (so that they make no new batches on the
    credit its acks give back), flush what they hold."""
    for child in sup.children.values():
        if child.spec.role == REPLAY and child.alive and child.registered:
            sup.tell(child.spec.service_id, "set", "drain", True)
    for ext in sup.externals.live((REPLAY,)):
        sup.tell(ext.service_id, "set", "drain", True)


def account(sup: Supervisor) -> None:
    """Record the ledger (ledger.py) and say whether every sampler's env steps were stored."""
    replay: dict[str, Any] = {}
    for values in sup.progress.by_role(REPLAY):
        replay.update(values)
    record, summary = sup.ledger.record(replay)
    sup.progress.record("ledger", record)
    sup.say(summary)


async def wait_exit(sup: Supervisor, group: list[Child], externals: list[External], timeout: float) -> None:
    """Until the children exited and the externals said goodbye or went quiet (or the timeout)."""
    deadline = time.monotonic() + timeout
    quiet = 2 * sup.cfg.supervisor.heartbeat_interval

    def waiting() -> bool:
        now = time.monotonic()
        return (any(c.alive for c in group)
                or any(e.live and now - e.last_heartbeat < quiet for e in externals))
    while waiting() and time.monotonic() < deadline:
        await drain_metrics(sup, 0.1)


async def take_goodbyes(sup: Supervisor, timeout: float) -> None:
    """Until every child that exited by itself (code 0) has had its last heartbeat, state
    `stopped`, taken by the control loop (or the timeout): it is sent just before the exit
    and may still be queued when the exit is seen."""
    deadline = time.monotonic() + timeout

    def pending() -> bool:
        return any(c.registered and c.proc is not None and c.proc.poll() == 0 and c.state != "stopped"
                   for c in sup.children.values())
    while pending() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # the control loop runs meanwhile


async def drain_metrics(sup: Supervisor, seconds: float) -> None:
    """Take the metrics records that arrived (for up to `seconds`) into the run's progress."""
    try:
        for _, msg in await sup.metrics.recv_many(1024, timeout=seconds):
            sup.progress.take(msg)
    except SpreezeError:
        pass
