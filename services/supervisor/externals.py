"""Services the supervisor did not start: compose containers and remote samplers.

They register like children do, but the supervisor owns no process of theirs: it knows
them only by their heartbeats. A silent one is marked `gone` and leaves the run's
accounting; nobody restarts it here (its owner does: a compose restart policy, or the
operator of a remote host). If its heartbeats come back (the network healed) it is
`running` again; a restarted one registers again under its id and is welcomed again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from spreeze.common.errors import ConfigError
from spreeze.proto.messages import Heartbeat, Register
from spreeze.proto.names import ROLES, SAMPLER

REMOTE_ROLES = (SAMPLER,)  # the tcp endpoints (config.TCP_OFFSETS) serve samplers only
LIVE = ("running", "paused", "stopping")  # stopping: flushing before its goodbye


@dataclass
class External:
    """What the supervisor knows of a service it did not start."""

    service_id: str
    role: str
    host: str
    pid: int
    remote: bool
    last_heartbeat: float
    state: str = "running"  # running | paused | stopping | stopped (said goodbye) | gone (went silent)
    joins: int = 1  # registrations under this id (restarts by its owner)
    counters: dict[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.state in LIVE


class Externals:
    """The registry: join on Register, beat on Heartbeat, sweep for silence."""

    def __init__(self, any_role_over_tcp: bool = False) -> None:
        self.by_id: dict[str, External] = {}
        self.any_role_over_tcp = any_role_over_tcp  # transport=tcp: every service registers over tcp

    def join(self, sid: str, msg: Register, now: float) -> External:
        """Admit a registration (ConfigError names what is refused)."""
        if msg.role not in ROLES:
            raise ConfigError(f"role {msg.role!r} of {sid!r} is not one of {', '.join(ROLES)}")
        if msg.service_id and msg.service_id != sid:
            raise ConfigError(f"register.service_id={msg.service_id!r} differs from the DEALER identity {sid!r}: "
                              "set the socket's identity to the service id")
        if msg.remote and msg.role not in REMOTE_ROLES and not self.any_role_over_tcp:
            raise ConfigError(f"{sid!r}: only {', '.join(REMOTE_ROLES)} services may attach over tcp, "
                              f"not {msg.role!r}")
        old = self.by_id.get(sid)
        ext = External(sid, msg.role, msg.host, msg.pid, msg.remote, now, joins=old.joins + 1 if old else 1)
        self.by_id[sid] = ext
        return ext

    def beat(self, sid: str, msg: Heartbeat, now: float) -> External | None:
        """Record a heartbeat; the External (None when unknown). A `gone` one comes back."""
        ext = self.by_id.get(sid)
        if ext is not None:
            ext.last_heartbeat, ext.state, ext.counters = now, msg.state, msg.counters
        return ext

    def sweep(self, now: float, silence: float) -> list[External]:
        """Mark live ones silent for longer than `silence` as gone; return them."""
        lost = [e for e in self.by_id.values() if e.live and now - e.last_heartbeat > silence]
        for ext in lost:
            ext.state = "gone"
        return lost

    def live(self, roles: tuple[str, ...] | None = None) -> list[External]:
        return [e for e in self.by_id.values() if e.live and (roles is None or e.role in roles)]

    def rows(self) -> dict[str, dict[str, Any]]:
        """services.json rows; `last_heartbeat` in unix time, as for the services it started."""
        now, unix = time.monotonic(), time.time()
        return {e.service_id: {"role": e.role, "pid": e.pid, "host": e.host, "state": e.state,
                               "restarts": e.joins - 1, "external": True, "remote": e.remote,
                               "last_heartbeat": unix - (now - e.last_heartbeat)}
                for e in self.by_id.values()}
