"""A black-box conformance kit: drive one service through its sockets and check it against
proto/SPEC.md, message by message (`spreeze conformance ROLE ENDPOINT`).

It imports proto only (and pyzmq, msgpack, numpy), so it judges any implementation, in any
language, exactly as the document describes it. ENDPOINT is always where the kit binds the
supervisor's `control` ROUTER, and the service under test is started with it as its
control endpoint (Spreeze: SPREEZE_CONTROL=ENDPOINT, or `spreeze sampler --connect`):

- `replay`: the kit is the supervisor, a sampler and a learner. It welcomes the replay with
  endpoints beside ENDPOINT (the same ipc directory, or tcp ports PORT+1..PORT+4), then
  checks registration, heartbeats, control, acks (stored, duplicate, gap, rejected,
  unnumbered), error replies, limits, warm-up grants, snapshot notices, sample requests,
  back-pressure and drain, metrics and shutdown.
- `sampler`: the kit is the supervisor, replay and learner (a fake trainer). Over tcp it
  binds what `spreeze train --listen tcp://HOST:PORT` binds (PORT..PORT+3); over ipc, the
  same names beside ENDPOINT. It checks registration, heartbeats, the experience schema,
  warm-up within the grant, acting with the published actor, the ack window, re-sends
  after a gap and after a replay restart, control and a clean shutdown (made = stored).
"""

from __future__ import annotations

from spreeze.proto.conformance.report import Report

ROLES = ("replay", "sampler")


def run(role: str, endpoint: str, timeout: float = 60.0, run_dir: str = "") -> Report:
    """Run the checks of `role` against the service that registers at `endpoint`."""
    if role == "replay":
        from spreeze.proto.conformance.replay import check_replay

        return check_replay(endpoint, timeout, run_dir)
    if role == "sampler":
        from spreeze.proto.conformance.sampler import check_sampler

        return check_sampler(endpoint, timeout)
    raise ValueError(f"conformance role {role!r} is not one of {', '.join(ROLES)}")
