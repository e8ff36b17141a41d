"""Conformance checks for a sampler (SPEC §4.1, §4.1a, §4.4, §4.8-§4.12, §6).

The kit is a fake trainer: the supervisor (`control`, `metrics_in`), the replay
(`experience`, acking by the rules of §6) and the learner (`actor_weights`, a TD3 actor
whose deterministic action is 1.0 everywhere). It grants a small warm-up, withholds acks,
fakes a lost batch and a replay restart, and finally shuts the sampler down.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from spreeze.proto.codec import Encoder
from spreeze.proto.conformance.report import Abort, Report
from spreeze.proto.conformance.wire import Got, Sock, endpoints_beside
from spreeze.proto.messages import (Control, ControlReply, Experience, ExperienceAck, Heartbeat, Register, TransitionLayout,
                            Weights, Welcome)

HEARTBEAT = 0.2  # seconds between heartbeats the kit asks for
LAYOUT = TransitionLayout(3, 1)  # Pendulum-v1: obs 3, action 1 in [-2, 2]
ENVS, STEPS, WINDOW, GRANT, ACK_TIMEOUT = 2, 8, 3, 48, 1.0
ACTION = 1.0  # the published actor's deterministic action
HIDDEN = 16
CONFIG: dict[str, Any] = {
    "env": "Pendulum-v1", "algo": "td3", "seed": 0,
    "td3": {"hidden": [HIDDEN], "exploration_noise": 0.1},
    "sampler": {"envs_per_sampler": ENVS, "steps_per_push": STEPS, "warmup_steps": GRANT, "ack_window": WINDOW,
                "ack_timeout": ACK_TIMEOUT},
    "supervisor": {"heartbeat_interval": HEARTBEAT, "liveness": 50, "remote_patience": 60.0},
}


def actor_weights(version: int) -> Weights:
    """A TD3 actor (§4.4) whose output is tanh(atanh(0.5)) * 2 + 0 = 1.0 for every observation."""
    dense = {"net.0.weight": np.zeros((HIDDEN, LAYOUT.obs_dim), np.float32),
             "net.0.bias": np.zeros(HIDDEN, np.float32),
             "net.2.weight": np.zeros((LAYOUT.act_dim, HIDDEN), np.float32),
             "net.2.bias": np.full(LAYOUT.act_dim, math.atanh(ACTION / 2.0), np.float32),
             "scale": np.full(LAYOUT.act_dim, 2.0, np.float32), "bias": np.zeros(LAYOUT.act_dim, np.float32)}
    return Weights("actor", version, version, dense=dense, extras={"env_steps": 0.0})


class FakeTrainer:
    def __init__(self, ctx: zmq.Context[Any], endpoint: str, report: Report) -> None:
        self.ctx, self.report, self.endpoint = ctx, report, endpoint
        self.eps = endpoints_beside(endpoint)
        self.encoder = Encoder("supervisor")
        self.control = Sock(ctx, zmq.ROUTER, self.eps["control"], True, self.encoder)
        self.metrics = Sock(ctx, zmq.SUB, self.eps["metrics_in"], True, self.encoder)
        self.weights = Sock(ctx, zmq.XPUB, self.eps["actor_weights"], True, Encoder("learner"))
        self.exp = self.bind_experience()
        self.peer = b""
        self.heartbeats: list[Heartbeat] = []
        self.replies: dict[int, ControlReply] = {}
        self.last_ping, self.next_request = 0.0, 100
        self.published: Weights | None = None
        self.last_publish = 0.0
        # the replay side: arrivals in order, first copies, watermarks, rows of stored batches
        self.arrivals: list[Experience] = []
        self.first: dict[int, bytes] = {}
        self.stored = self.durable = 0
        self.rows: dict[int, int] = {}
        self.hold = False  # withhold acks
        self.fake_gap = False  # answer the next new batch with `gap`, as if the one before was lost
        self.gap_at = 0
        self.bad: list[str] = []  # what broke §4.1 in any batch
        self.exp_peer = b""  # routing id of the sampler's experience DEALER

    def bind_experience(self) -> Sock:
        return Sock(self.ctx, zmq.ROUTER, self.eps["experience"], True, Encoder("replay"))

    # ------------------------------------------------------------ plumbing
    def tick(self) -> None:
        while (got := self.control.recv(0)) is not None:
            if isinstance(got.msg, Heartbeat):
                self.heartbeats.append(got.msg)
            elif isinstance(got.msg, ControlReply):
                self.replies[got.msg.request_id] = got.msg
        while self.metrics.recv(0) is not None:
            pass
        while (got := self.exp.recv(0)) is not None:
            self.on_experience(got)
        resend = False
        while self.weights.recv(0) is not None:  # a (re)subscription: last-value cache
            resend = True
        now = time.monotonic()
        if self.published is not None and (resend or now - self.last_publish > 0.5):
            self.weights.send(self.published)
            self.last_publish = now
        if self.peer and now - self.last_ping > HEARTBEAT:
            self.last_ping = now
            self.tell("ping")

    def tell(self, command: str, key: str = "", value: Any = None) -> int:
        self.next_request += 1
        self.control.send(Control(command, self.next_request, key, value), to=self.peer)
        return self.next_request

    def until(self, probe: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tick()
            if (got := probe()):
                return got
            time.sleep(0.005)
        return probe()

    def on_experience(self, got: Got) -> None:
        msg = got.msg
        if not isinstance(msg, Experience):
            self.bad.append(f"{got.error or got.msg!r:.160}")
            return
        self.arrivals.append(msg)
        self.check_batch(msg)
        b = msg.batch
        self.first.setdefault(b, msg.transitions.tobytes())
        self.exp_peer = got.peer or self.exp_peer
        if self.hold or not got.peer:
            return
        if b and b <= self.stored:
            status = "duplicate"
        elif b > self.stored + 1:
            status = "gap"
        elif self.fake_gap and b - 1 > self.durable:  # as if b - 1 was lost with a connection
            self.fake_gap, self.gap_at, status = False, b, "gap"
            self.stored = b - 2  # the watermark goes back (§4.1a)
            self.rows.pop(b - 1, None)
        else:
            status = "stored"
            self.stored = b or self.stored
            self.rows[b] = len(msg.transitions)
        self.exp.send(ExperienceAck(b, status, self.stored, self.durable, GRANT), to=got.peer)

    def check_batch(self, msg: Experience) -> None:
        m = msg.transitions
        cols = LAYOUT.columns(m) if m.ndim == 2 and m.shape[1] == LAYOUT.width else None
        if (msg.obs_dim, msg.act_dim) != (3, 1) or cols is None:
            self.bad.append(f"batch {msg.batch}: dims {msg.obs_dim}, {msg.act_dim}, shape {list(m.shape)}")
        elif len(m) and (np.abs(cols["action"]) > 2.0).any():
            self.bad.append(f"batch {msg.batch}: actions outside [-2, 2]")
        elif not np.isfinite(m).all():
            self.bad.append(f"batch {msg.batch}: NaN/inf")

    def distinct(self) -> dict[int, Experience]:
        out: dict[int, Experience] = {}
        for m in self.arrivals:
            out.setdefault(m.batch, m)
        return out

    def close(self) -> None:
        for sock in (self.control, self.metrics, self.weights, self.exp):
            sock.close()

    # ------------------------------------------------------------ the checks
    def run(self, timeout: float) -> None:
        r = self.report
        got = self.control.recv_until(lambda g: isinstance(g.msg, Register) or g.error is not None, timeout)
        r.require("§4.8 register: the first message on control is a valid `register`",
                  got is not None and isinstance(got.msg, Register),
                  f"got {got and (got.msg or got.error)!r:.200}" if got else f"nothing within {timeout}s")
        assert got is not None and isinstance(got.msg, Register)
        reg, self.peer = got.msg, got.peer or b""
        sid = self.peer.decode(errors="replace")
        tcp = self.endpoint.startswith("tcp://")
        r.check("§4.8 register: role `sampler`, pid and host given", reg.role == "sampler" and reg.pid > 0 and reg.host,
                f"{reg}")
        r.check("§4.9 DEALER identity set to the service id (and `service_id`, if given, equal to it)",
                self.peer[:1] not in (b"", b"\0") and reg.service_id in ("", sid),
                f"identity={self.peer!r}, service_id={reg.service_id!r}")
        r.check("§4.8 register.remote is true exactly over tcp", reg.remote == tcp, f"remote={reg.remote}")
        endpoints = {n: self.eps[n] for n in ("control", "metrics_in", "experience", "actor_weights")}
        self.control.send(Welcome(sid, endpoints, CONFIG, HEARTBEAT, endpoints if tcp else {}), to=self.peer)
        r.require("§4.10 heartbeats every heartbeat_interval, state running, service_id = identity",
                  self.until(lambda: len(self.heartbeats) >= 3, 10 * HEARTBEAT + 10) and
                  all(h.service_id == sid and h.state == "running" for h in self.heartbeats),
                  f"heartbeats {self.heartbeats[:3]}")
        self.warmup_checks()
        self.actor_checks()
        self.window_checks()
        self.gap_checks()
        self.restart_checks()
        self.control_checks()
        self.shutdown_checks()

    def random_rows(self) -> int:
        return sum(m.random_rows for m in self.distinct().values())

    def warmup_checks(self) -> None:
        r = self.report
        first = self.until(lambda: self.arrivals, 15)
        r.require("§6 experience arrives, the session's first batch numbered 1", first and first[0].batch == 1,
                  f"first batch {first and first[0].batch}")
        used = self.until(lambda: self.random_rows() >= GRANT, 10)
        r.check("§6 warm-up: random steps up to the grant (ack.warmup) are taken", used,
                f"{self.random_rows()} random steps of {GRANT} granted")
        top = max(self.distinct())
        self.until(lambda: False, 1.0)
        r.check("§6 warm-up: never more random steps than granted", self.random_rows() <= GRANT,
                f"{self.random_rows()} random steps, {GRANT} granted")
        later = [m for b, m in self.distinct().items() if b > top and len(m.transitions)]
        r.check("§6 with no actor and no grant left, the sampler waits (sends no rows)", not later,
                f"{len(later)} batches with rows arrived")

    def actor_checks(self) -> None:
        r = self.report
        self.published = actor_weights(7)
        acted = self.until(lambda: [m for m in self.distinct().values() if m.actor_version == 7
                                    and len(m.transitions) and m.random_rows == 0], 10)
        r.require("§4.4 after weights arrive, batches acted by that actor (actor_version, random_steps 0)", acted,
                  f"versions seen {sorted({m.actor_version for m in self.arrivals})}")
        actions = np.concatenate([LAYOUT.columns(m.transitions)["action"] for m in acted])
        r.check("§4.4 actions follow the actor: tanh(out) * scale + bias = 1.0, plus exploration noise",
                abs(float(actions.mean()) - ACTION) < 0.15 and 0.02 < float(actions.std()) < 0.5,
                f"mean {actions.mean():.3f}, std {actions.std():.3f} over {len(actions)} actions")

    def window_checks(self) -> None:
        r = self.report
        self.until(lambda: len(self.distinct()) > 8, 5)
        self.hold = True
        stored, seen = self.stored, set(self.distinct())
        start = len(self.arrivals)
        self.until(lambda: False, ACK_TIMEOUT + 1.5)
        top = max(self.distinct())
        r.check("§6 credit: at most ack_window batches beyond `stored` while acks are withheld",
                top - stored <= WINDOW, f"stored {stored}, batches up to {top}")
        again = [m for m in self.arrivals[start:] if m.batch in seen]
        r.check("§6 (c) unstored batches are sent again after ack_timeout without ack progress, identical",
                again and all(m.transitions.tobytes() == self.first[m.batch] for m in again),
                f"{len(again)} re-sent")
        self.hold = False

    def gap_checks(self) -> None:
        r = self.report
        self.until(lambda: False, 0.5)
        self.fake_gap = True
        self.until(lambda: not self.fake_gap, 5)
        k = self.gap_at
        start = len(self.arrivals)
        self.until(lambda: self.stored >= k + 2, 6)
        after = [m.batch for m in self.arrivals[start:]]
        i = after.index(k - 1) if k - 1 in after else len(after)
        r.check("§6 (b) after a `gap` ack the sampler sends again from stored + 1, in order, identical bytes",
                k and after[i:i + 2] == [k - 1, k] and all(m.transitions.tobytes() == self.first[m.batch]
                                                      for m in self.arrivals[start:] if m.batch <= k),
                f"gap at {k}, then {after[:8]}")

    def restart_checks(self) -> None:
        r = self.report
        self.until(lambda: False, 0.5)
        self.hold = True
        self.until(lambda: False, 0.3)
        top = max(self.distinct())
        self.durable = max(self.stored - 2, self.durable)
        self.exp.send(ExperienceAck(0, "snapshot", self.stored, self.durable, GRANT), to=self.exp_peer)
        self.until(lambda: False, 0.3)
        self.exp.close()  # replay dies; a new one comes back with only its snapshot
        for b in [b for b in self.rows if b > self.durable]:
            del self.rows[b]
        self.stored = self.durable
        time.sleep(0.3)
        self.exp = self.bind_experience()
        self.hold = False
        start = len(self.arrivals)
        back = self.until(lambda: any(m.batch == self.durable + 1 for m in self.arrivals[start:]), 5 + ACK_TIMEOUT)
        resent = [m for m in self.arrivals[start:] if m.batch in self.first and m.batch <= top]
        r.check("§6 (a) after a replay restart the kept batches come again from durable + 1, identical", back and
                all(m.transitions.tobytes() == self.first[m.batch] for m in resent),
                f"durable {self.durable}, after restart {[m.batch for m in self.arrivals[start:start + 6]]}")
        r.check("§6 batches inside `durable` are forgotten: never sent again",
                all(m.batch > self.durable or m.batch == 0 for m in self.arrivals[start:]),
                f"durable {self.durable}, after restart {[m.batch for m in self.arrivals[start:start + 6]]}")

    def control_checks(self) -> None:
        r = self.report
        rid = self.tell("ping")
        reply = self.until(lambda: self.replies.get(rid), 3)
        r.check("§4.11 ping answered by control_reply ok, request_id echoed", reply and reply.ok, f"{reply}")
        rid = self.tell("set", "no_such_key", 1)
        reply = self.until(lambda: self.replies.get(rid), 3)
        r.check("§4.11 set of an unknown key: control_reply ok false, with a reason", reply and not reply.ok
                and reply.detail, f"{reply}")

    def shutdown_checks(self) -> None:
        r = self.report
        self.until(lambda: False, 0.5)
        n = len(self.heartbeats)
        rid = self.tell("shutdown")
        stopped = self.until(lambda: next((h for h in self.heartbeats[n:] if h.state == "stopped"), None), 20)
        reply = self.replies.get(rid)
        r.check("§4.11 shutdown: control_reply ok", reply and reply.ok, f"{reply}")
        r.require("§4.10 a clean exit ends with a `stopped` heartbeat", stopped,
                  f"states {[h.state for h in self.heartbeats[n:]]}")
        top = max(self.distinct())
        r.check("§6 shutdown: every batch sent was stored before the sampler left", self.stored == top,
                f"stored {self.stored}, sent up to {top}")
        made = stopped.counters.get("env_steps")
        rows = sum(self.rows.values())
        r.check("§6 made = stored: the last heartbeat's env_steps equals the rows stored", made == rows,
                f"env_steps {made}, rows stored {rows}")
        r.check("§4.1 every batch decoded and fits the schema (dims, width, done 0/1, actions in bounds)",
                not self.bad, "; ".join(self.bad[:3]))


def check_sampler(endpoint: str, timeout: float = 60.0) -> Report:
    """Be the trainer for the sampler that registers at `endpoint` and check it; the report."""
    report = Report("sampler", endpoint)
    ctx: zmq.Context[Any] = zmq.Context()
    kit = None
    try:
        kit = FakeTrainer(ctx, endpoint, report)
        kit.run(timeout)
    except Abort:
        pass
    except zmq.ZMQError as exc:
        report.check(f"sockets at {endpoint}", False, str(exc))
    finally:
        if kit is not None:
            kit.close()
        ctx.term()
    return report
