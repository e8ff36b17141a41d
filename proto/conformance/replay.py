"""Conformance checks for a replay (SPEC §4.1, §4.1a, §4.2, §4.3, §4.8-§4.13, §5, §6).

The kit plays the supervisor (it binds `control` and `metrics_in`), two samplers and a
learner. Every check names the section it holds the service to.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import zmq

from spreeze.proto.codec import PROTOCOL_VERSION, Encoder
from spreeze.proto.conformance.report import Abort, Report
from spreeze.proto.conformance.wire import Got, Sock, endpoints_beside
from spreeze.proto.messages import (Control, ControlReply, Error, Experience, ExperienceAck, Heartbeat, Metrics,
                                    Register, SampledBatch, SampleRequest, TransitionLayout, Welcome, to_frames)

HEARTBEAT = 0.2  # seconds between heartbeats the kit asks for
LAYOUT = TransitionLayout(3, 1)  # Pendulum-v1, the env the kit's welcome names
WARMUP, CAPACITY = 1500, 5000
CONFIG: dict[str, Any] = {
    "env": "Pendulum-v1", "algo": "td3", "seed": 0,
    "replay": {"capacity": CAPACITY, "min_size": 64, "update_to_data": 1.0, "tolerance": 10.0,
               "snapshot_every_s": 0.5},
    "sampler": {"warmup_steps": WARMUP, "ack_window": 4},
    "learner": {"batch_size": 16, "prefetch": 1},
    "supervisor": {"heartbeat_interval": HEARTBEAT, "liveness": 25},
}


def rows(n: int, seed: int) -> np.ndarray:
    """n plausible Pendulum transitions (done 0)."""
    rng = np.random.default_rng(seed)
    m = rng.uniform(-1, 1, (n, LAYOUT.width)).astype(np.float32)
    LAYOUT.columns(m)["done"][:] = 0.0
    return m


def batch(n: int, number: int, seed: int = 0, layout: TransitionLayout = LAYOUT) -> Experience:
    m = rows(n, seed) if layout == LAYOUT else np.zeros((n, layout.width), np.float32)
    return Experience(m, layout.obs_dim, layout.act_dim, env_steps=n, batch=number, random_steps=0,
                      actor_version=1)


class ReplayKit:
    def __init__(self, ctx: zmq.Context[Any], endpoint: str, report: Report, run_dir: str) -> None:
        self.ctx, self.report, self.run_dir = ctx, report, run_dir
        self.eps = endpoints_beside(endpoint)
        self.encoder = Encoder("supervisor")
        self.control = Sock(ctx, zmq.ROUTER, self.eps["control"], True, self.encoder)
        self.metrics = Sock(ctx, zmq.SUB, self.eps["metrics_in"], True, self.encoder)
        self.peer = b""
        self.heartbeats: list[tuple[float, bytes, Heartbeat]] = []
        self.replies: dict[int, ControlReply] = {}
        self.metric_values: dict[str, Any] = {}
        self.last_ping = 0.0
        self.next_request = 100
        self.socks: list[Sock] = [self.control, self.metrics]
        self.notices: list[ExperienceAck] = []  # snapshot notices seen by sampler A
        self.grant_a = 0

    # ------------------------------------------------------------ plumbing
    def tick(self) -> None:
        """Take control and metrics messages; ping the service every heartbeat interval."""
        while (got := self.control.recv(0)) is not None:
            m = got.msg
            if isinstance(m, Heartbeat):
                self.heartbeats.append((time.monotonic(), got.peer or b"", m))
            elif isinstance(m, ControlReply):
                self.replies[m.request_id] = m
        while (got := self.metrics.recv(0)) is not None:
            if isinstance(got.msg, Metrics):
                self.metric_values.update(got.msg.values)
        if self.peer and time.monotonic() - self.last_ping > HEARTBEAT:
            self.last_ping = time.monotonic()
            self.tell("ping")

    def tell(self, command: str, key: str = "", value: Any = None) -> int:
        self.next_request += 1
        self.control.send(Control(command, self.next_request, key, value), to=self.peer)
        return self.next_request

    def wait(self, sock: Sock, accept: Callable[[Got], bool], timeout: float) -> Got | None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            got = sock.recv(min(0.05, left))
            self.tick()
            if got is not None and accept(got):
                return got
        return None

    def until(self, probe: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.tick()
            if (got := probe()):
                return got
            time.sleep(0.02)
        return None

    def dealer(self, name: str, sender: str) -> Sock:
        sock = Sock(self.ctx, zmq.DEALER, self.eps[name], False, Encoder(sender))
        self.socks.append(sock)
        return sock

    def answer(self, sock: Sock, frames: list[Any], timeout: float = 3.0) -> tuple[list[Error], ExperienceAck | None]:
        """Send one experience (as frames); the errors and the ack that answer it (snapshot
        notices on the way are kept in `notices`)."""
        sock.send_raw(frames)
        errors: list[Error] = []

        def accept(g: Got) -> bool:
            if isinstance(g.msg, Error):
                errors.append(g.msg)
            elif isinstance(g.msg, ExperienceAck) and g.msg.status == "snapshot":
                self.notices.append(g.msg)
            return isinstance(g.msg, ExperienceAck) and g.msg.status != "snapshot"
        got = self.wait(sock, accept, timeout)
        return errors, got.msg if got is not None else None  # type: ignore[return-value]

    def close(self) -> None:
        for sock in self.socks:
            sock.close()

    # ------------------------------------------------------------ the checks
    def run(self, timeout: float) -> None:
        r = self.report
        got = self.wait(self.control, lambda g: isinstance(g.msg, Register) or g.error is not None, timeout)
        r.require("§4.8 register: the first message on control is a valid `register`",
                  got is not None and isinstance(got.msg, Register), f"got {got and (got.msg or got.error)!r:.200}"
                  if got else f"nothing within {timeout}s")
        assert got is not None and isinstance(got.msg, Register)
        reg, self.peer = got.msg, got.peer or b""
        sid = self.peer.decode(errors="replace")
        r.check("§4.8 register: role `replay`", reg.role == "replay", f"role={reg.role!r}")
        r.check("§4.9 DEALER identity set to the service id (and `service_id`, if given, equal to it)",
                self.peer[:1] not in (b"", b"\0") and reg.service_id in ("", sid),
                f"identity={self.peer!r}, service_id={reg.service_id!r}")
        config = {**CONFIG, "run_dir": self.run_dir}
        self.control.send(Welcome(sid, {n: self.eps[n] for n in ("control", "metrics_in", "experience", "sample")},
                                  config, HEARTBEAT), to=self.peer)
        beats = self.until(lambda: len(self.heartbeats) >= 2, 10 * HEARTBEAT + 5)
        r.require("§4.10 heartbeats every heartbeat_interval, state running, service_id = identity",
                  beats and all(p == self.peer and h.service_id == sid and h.state in ("running", "paused")
                                for _, p, h in self.heartbeats), f"heartbeats: {self.heartbeats[:3]!r:.200}")
        rid = self.tell("ping")
        reply = self.until(lambda: self.replies.get(rid), 3)
        r.check("§4.11 control ping answered by control_reply ok, request_id echoed", reply and reply.ok,
                f"reply={reply!r}")
        self.experience_checks()
        self.bad_input_checks()
        self.sample_checks()
        self.flow_checks()
        self.shutdown_checks()

    def experience_checks(self) -> None:
        r = self.report
        a = self.a = self.dealer("experience", "conformance-a")
        enc = a.encoder
        errs, ack = self.answer(a, to_frames(batch(0, 1), enc), timeout=10)
        r.require("§4.1a an empty numbered batch is acked `stored`", ack and (ack.batch, ack.status, ack.stored) ==
                  (1, "stored", 1), f"errors={errs}, ack={ack}")
        assert ack is not None
        r.check("§6 warm-up: the first ack grants random steps, at most warmup_steps", 0 < ack.warmup <= WARMUP,
                f"warmup={ack.warmup}")
        self.grant_a = ack.warmup
        r.check("§4.1a durable <= stored", 0 <= ack.durable <= ack.stored, f"{ack}")
        _, ack = self.answer(a, to_frames(batch(32, 2, seed=2), enc))
        r.check("§4.1a next batch `stored`, stored = 2",
                ack and (ack.batch, ack.status, ack.stored) == (2, "stored", 2), f"{ack}")
        _, ack = self.answer(a, to_frames(batch(32, 2, seed=2), enc))
        r.check("§6 a re-sent batch is a `duplicate`, stored unchanged",
                ack and (ack.batch, ack.status, ack.stored) == (2, "duplicate", 2), f"{ack}")
        _, ack = self.answer(a, to_frames(batch(32, 4, seed=4), enc))
        r.check("§6 a batch after a missing one is a `gap`, stored unchanged",
                ack and (ack.batch, ack.status, ack.stored) == (4, "gap", 2), f"{ack}")
        _, ack3 = self.answer(a, to_frames(batch(32, 3, seed=3), enc))
        _, ack4 = self.answer(a, to_frames(batch(32, 4, seed=4), enc))
        r.check("§6 sent again from stored + 1, the batches are stored in order",
                ack3 and ack4 and (ack3.status, ack3.stored, ack4.status, ack4.stored) == ("stored", 3, "stored", 4),
                f"{ack3}, {ack4}")
        frames = to_frames(batch(0, 0), enc)
        _, ack = self.answer(a, frames)
        r.check("§4.1a an unnumbered batch is acked with batch 0 and a status other than `snapshot`",
                ack and ack.batch == 0 and ack.status == "stored", f"{ack}")
        self.stored_rows = {m.tobytes() for s in (2, 3, 4) for m in rows(32, s)}

    def refused(self, number: int, frames: list[Any], code: str, what: str) -> None:
        errs, ack = self.answer(self.a, frames)
        seq = msgpack.unpackb(frames[0])["seq"]
        self.report.check(f"§5 {what}: `error` {code} with ref_type experience and ref_seq = its seq",
                          any(e.code == code and e.ref_type == "experience" and e.ref_seq == seq for e in errs),
                          f"errors={errs}")
        self.report.check(f"§4.1a {what}: `rejected` ack that uses the batch number up",
                          ack and (ack.batch, ack.status, ack.stored) == (number, "rejected", number), f"{ack}")

    def bad_input_checks(self) -> None:
        enc = self.a.encoder
        wide = to_frames(batch(8, 5, seed=5), enc)
        head = msgpack.unpackb(wide[0])
        head["body"]["obs_dim"] = 4  # rows of width 9 but obs_dim 4: width 11 expected
        self.refused(5, [msgpack.packb(head), *wide[1:]], "schema", "row width not matching obs_dim/act_dim")
        done = batch(8, 6, seed=6)
        LAYOUT.columns(done.transitions)["done"][2] = 2.0
        self.refused(6, to_frames(done, enc), "schema", "done = 2.0")
        nan = batch(8, 7, seed=7)
        nan.transitions[1, 0] = math.nan
        frames = to_frames(nan, enc)
        errs, ack = self.answer(self.a, frames)
        self.report.check("§5 NaN in a batch: an `error` and a `rejected` ack that uses the number up",
                          errs and ack and (ack.batch, ack.status, ack.stored) == (7, "rejected", 7),
                          f"errors={errs}, ack={ack}")
        errs, ack = self.answer(self.a, to_frames(batch(8, 8, layout=TransitionLayout(2, 3)), enc))
        self.report.check("§5 dimensions of another env: an `error` and a `rejected` ack",
                          errs and ack and (ack.batch, ack.status, ack.stored) == (8, "rejected", 8),
                          f"errors={errs}, ack={ack}")
        good = to_frames(batch(4, 9, seed=9), enc)
        head = msgpack.unpackb(good[0])
        cases: list[tuple[str, list[Any], bool]] = [
            ("header", [b"\xc1 not msgpack"], False),
            ("version", [msgpack.packb({**head, "v": PROTOCOL_VERSION + 1}), *good[1:]], True),
            ("array", [msgpack.packb({**head, "arrays": [["transitions", "float128", [4, 9]]]}), *good[1:]], True),
            ("array", [good[0], bytes(good[1])[:-4]], True),
            ("unknown_type", [msgpack.packb({**head, "type": "teleport", "arrays": []})], True),
            ("limit", [msgpack.packb({**head, "body": {"pad": "x" * 70_000}})], False),
            ("header", [msgpack.packb({**head, "body": {"x": msgpack.ExtType(1, b"1")}}), *good[1:]], False),
            ("header", [b"", *good], False),  # a REQ-style empty delimiter frame first
        ]
        for code, frames, named in cases:
            self.a.send_raw(frames)
            got = self.wait(self.a, lambda g: isinstance(g.msg, Error), 3)
            err = got.msg if got is not None else None
            ok = isinstance(err, Error) and err.code == code and (
                not named or (err.ref_type, err.ref_seq) == (head["type"] if code != "unknown_type" else "teleport",
                                                             head["seq"]))
            self.report.check(f"§5 bad input answered with `error` {code}" + (", ref_type/ref_seq filled" if named
                                                                              else ""), ok, f"got {err!r:.200}")
        _, ack = self.answer(self.a, good)
        self.report.check("§5 after bad input the replay keeps serving: the next batch is stored",
                          ack and (ack.batch, ack.status, ack.stored) == (9, "stored", 9), f"{ack}")
        self.stored_rows |= {m.tobytes() for m in rows(4, 9)}

    def sample_checks(self) -> None:
        r = self.report
        learner = self.dealer("sample", "conformance-learner")
        learner.send(SampleRequest(41, 16))
        got = self.wait(learner, lambda g: isinstance(g.msg, (SampledBatch, Error)), 5)
        sb = got.msg if got is not None else None
        r.check("§4.3 sample_request answered by sampled_batch, request_id echoed, [batch_size, width] float32",
                isinstance(sb, SampledBatch) and sb.request_id == 41 and sb.transitions.shape == (16, LAYOUT.width)
                and (sb.obs_dim, sb.act_dim) == (3, 1), f"got {sb!r:.200}")
        if isinstance(sb, SampledBatch):
            r.check("§4.3 sampled rows are rows that were stored (none refused, none invented)",
                    all(row.tobytes() in self.stored_rows for row in sb.transitions),
                    "a row not sent in a stored batch")
        learner.send(SampleRequest(44, 16, obs_stats=True))
        got = self.wait(learner, lambda g: isinstance(g.msg, (SampledBatch, Error)), 5)
        sb = got.msg if got is not None else None
        stored = np.frombuffer(b"".join(self.stored_rows), np.float32).reshape(-1, LAYOUT.width)
        obs = LAYOUT.columns(stored)["obs"].astype(np.float64)
        r.check("§4.3 (1.6) obs_stats asked: the mean and variance of every stored row's obs, or none (obs_count 0)",
                isinstance(sb, SampledBatch) and sb.request_id == 44 and (
                    (sb.obs_count == 0 and not sb.obs_stats) or (
                        sb.obs_count == len(obs) and np.allclose(sb.obs_stats["mean"], obs.mean(0), atol=1e-5)
                        and np.allclose(sb.obs_stats["var"], obs.var(0), atol=1e-5))),
                f"got {(sb.obs_count, sb.obs_stats) if isinstance(sb, SampledBatch) else sb!r:.300}, "
                f"stored {len(obs)} rows")
        learner.send(SampleRequest(42, CAPACITY + 1))
        seq = learner.encoder.seq
        got = self.wait(learner, lambda g: isinstance(g.msg, (SampledBatch, Error)), 5)
        r.check("§4.13 batch_size above capacity: `error` bad_request with ref_type sample_request, ref_seq its seq",
                got and isinstance(got.msg, Error) and (got.msg.code, got.msg.ref_type, got.msg.ref_seq) ==
                ("bad_request", "sample_request", seq), f"got {got and got.msg!r:.200}")
        learner.send(SampleRequest(43, 0))
        seq = learner.encoder.seq
        got = self.wait(learner, lambda g: isinstance(g.msg, (SampledBatch, Error)), 5)
        r.check("§5 batch_size 0: `error` schema naming the request", got and isinstance(got.msg, Error) and
                (got.msg.code, got.msg.ref_seq) == ("schema", seq), f"got {got and got.msg!r:.200}")

    def flow_checks(self) -> None:
        r = self.report
        def notice(g: Got) -> bool:
            if isinstance(g.msg, ExperienceAck) and g.msg.status == "snapshot":
                self.notices.append(g.msg)
            return any(n.durable >= 9 for n in self.notices)
        if not any(n.durable >= 9 for n in self.notices):
            self.wait(self.a, notice, 10)
        r.check("§4.1a snapshot notices: batch 0, status `snapshot`, durable rising up to stored",
                self.notices and all(n.batch == 0 and n.durable <= n.stored for n in self.notices)
                and self.notices[-1].durable == 9, f"notices {self.notices}")
        b = self.dealer("experience", "conformance-b")
        _, first = self.answer(b, to_frames(batch(0, 1), b.encoder))
        r.check("§6 warm-up grants of all sessions add up to at most warmup_steps",
                first is not None and first.warmup + self.grant_a <= WARMUP,
                f"first session granted {self.grant_a}, second {first}")
        statuses: dict[int, set[str]] = {}  # batch -> statuses of the acks that answered it
        sent, stored = [1], [1]  # the newest batch sent; replay's `stored` watermark (acks are cumulative)
        window = 8  # as a sampler with sampler.ack_window = 8: within the socket's high-water mark

        def pump(last: int, stall: float, resends: int = 0) -> None:
            """Send batches 2..last within the ack window until `last` is stored or acks stop
            for `stall` seconds; then, `resends` times, send the unacked ones again as a sampler
            does on its ack timeout (§6: an ack that finds replay's queue full is dropped)."""
            moved = time.monotonic()
            while stored[0] < last:
                while sent[0] < last and sent[0] - stored[0] < window:
                    sent[0] += 1
                    b.send(batch(64, sent[0], seed=100 + sent[0]))
                got = self.wait(b, lambda g: isinstance(g.msg, ExperienceAck) and g.msg.batch > 1, 0.2)
                if got is not None and isinstance(got.msg, ExperienceAck):
                    statuses.setdefault(got.msg.batch, set()).add(got.msg.status)
                    if got.msg.stored > stored[0]:
                        stored[0], moved = got.msg.stored, time.monotonic()
                elif time.monotonic() - moved >= stall:
                    if resends == 0:
                        return
                    resends, moved = resends - 1, time.monotonic()
                    for number in range(stored[0] + 1, sent[0] + 1):
                        b.send(batch(64, number, seed=100 + number))
        pump(39, 1.5)  # far more than the rate limiter admits while no learner samples
        r.check("§3 back-pressure: while no learner samples, acks stop before every batch is stored",
                stored[0] < 39, f"stored up to batch {stored[0]} of 39")
        rid = self.tell("set", "drain", True)
        reply = self.until(lambda: self.replies.get(rid), 3)
        r.check("§4.11 set drain true: control_reply ok", reply and reply.ok, f"{reply}")
        pump(39, 5.0, resends=2)
        r.check("§6 drain: every held-back batch is stored and acked, rate limiter notwithstanding",
                stored[0] == 39 and all(s <= {"stored", "duplicate"} for s in statuses.values()),
                f"stored up to batch {stored[0]} of 39; statuses {sorted(set().union(*statuses.values()))}")
        m = self.until(lambda: self.metric_values.get("ledger/conformance-b/inserted") == 38 * 64, 5)
        r.check("§6 ledger metrics: ledger/<sender>/inserted counts the stored rows",
                m, f"ledger/conformance-b/inserted={self.metric_values.get('ledger/conformance-b/inserted')}")
        r.check("§5 errors counted per code and sender in metrics (errors/<sender>/<code>)",
                self.metric_values.get("errors/conformance-a/schema", 0) >= 2,
                f"errors/conformance-a/schema={self.metric_values.get('errors/conformance-a/schema')}")

    def shutdown_checks(self) -> None:
        n = len(self.heartbeats)
        rid = self.tell("shutdown")
        reply = self.until(lambda: self.replies.get(rid), 5)
        self.report.check("§4.11 shutdown: control_reply ok", reply and reply.ok, f"{reply}")
        peer, self.peer = self.peer, b""  # no more pings
        stopped = self.until(lambda: any(h.state == "stopped" for _, _, h in self.heartbeats[n:]), 20)
        self.report.check("§4.10 a clean exit ends with a `stopped` heartbeat", stopped,
                          f"states after shutdown: {[h.state for _, _, h in self.heartbeats[n:]]}")
        self.peer = peer


def check_replay(endpoint: str, timeout: float = 60.0, run_dir: str = "") -> Report:
    """Welcome the replay that registers at `endpoint` and check it; the report."""
    report = Report("replay", endpoint)
    ctx: zmq.Context[Any] = zmq.Context()
    made = not run_dir
    run_dir = run_dir or tempfile.mkdtemp(prefix="spz-conformance-")
    kit = None
    try:
        kit = ReplayKit(ctx, endpoint, report, os.path.abspath(run_dir))
        kit.run(timeout)
    except Abort:
        pass
    except zmq.ZMQError as exc:
        report.check(f"sockets at {endpoint} ({socket.gethostname()})", False, str(exc))
    finally:
        if kit is not None:
            kit.close()
        ctx.term()
        if made:
            shutil.rmtree(run_dir, ignore_errors=True)
    return report
