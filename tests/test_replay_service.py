"""services/replay: inserts and rejections, rate-limited answers, serve() with real peers."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from spreeze.common.transport import Channel
from spreeze.proto.codec import Encoder, decode
from spreeze.proto.messages import (Control, Error, Experience, ExperienceAck, SampledBatch, SampleRequest, TransitionLayout,
                            from_envelope, to_frames)
from spreeze.services.replay.ledger import WARMUP_LEASE
from spreeze.services.replay.main import Replay, limiter_config
from tests.helpers import Harness, config, experience, layout_of, metric_from, nothing_on, recv_until, run, until

pytestmark = pytest.mark.timeout(10)


def sampled(msg: object) -> bool:
    return isinstance(msg, (SampledBatch, Error))


async def take_pending(replay: Replay, smp: Channel, n: int, timeout: float = 3.0) -> None:
    """Move n requests already sent by a peer into replay.pending, as serve() does."""
    deadline = time.monotonic() + timeout
    while len(replay.pending) < n:
        assert time.monotonic() < deadline, f"{n} requests did not arrive"
        await asyncio.sleep(0.01)
        replay.take_requests(smp)


def test_insert_accepts_matching_and_rejects_wrong_dims(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            r = h.build(Replay)
            layout = layout_of(h.cfg)
            good = experience(layout, 10)
            r.insert(good, "s")
            assert r.buffer.size == 10 and r.limiter.inserts == 10 and r.rejected == 0
            stored = {row.tobytes() for row in good.transitions}
            assert all(row.tobytes() in stored for row in r.buffer.sample_packed(50))
            r.insert(experience(TransitionLayout(4, 1), 7), "s")  # another env's layout
            r.insert(experience(TransitionLayout(2, 3), 5), "s")  # same width (9) as Pendulum's
            assert r.rejected == 12 and r.buffer.size == 10 and r.limiter.inserts == 10
            assert r.counters() == {"size": 10, "inserted": 10}
    run(body())


def test_insert_rejects_non_finite_values(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            r = h.build(Replay)
            layout = layout_of(h.cfg)
            for bad in (np.nan, np.inf, -np.inf):
                exp = experience(layout, 6)
                exp.transitions[3, 2] = bad
                r.insert(exp, "s")
            assert r.rejected == 18 and r.buffer.size == 0 and r.limiter.inserts == 0
    run(body())


def test_reject_non_finite_false_is_honoured(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, "replay.reject_non_finite=false")) as h:
            r = h.build(Replay)
            exp = experience(layout_of(h.cfg), 6)
            exp.transitions[0, 0] = np.nan
            r.insert(exp, "s")
            assert r.rejected == 0 and r.buffer.size == 6
    run(body())


def test_answer_serves_only_what_the_rate_limiter_allows(tmp_path: Path) -> None:
    async def body() -> None:
        # min_size 64, batch 32, update_to_data 1; a small error buffer, so that fewer requests
        # than the sample sockets' HWM (16) are enough to reach it
        cfg = config(tmp_path, "replay.tolerance=0.05", "learner.prefetch=1")
        async with Harness(cfg) as h:
            r = h.build(Replay)
            layout, batch, n = layout_of(h.cfg), h.cfg.learner.batch_size, 14
            smp = r.channel("sample", binding=True)
            dealer = h.channel("sample", binding=False, sender="learner")
            for i in range(n):
                await dealer.send(SampleRequest(i, batch))
            await take_pending(r, smp, n)
            r.insert(experience(layout, 32), "s")
            await r.answer(smp)
            await nothing_on(dealer, 0.05)  # below min_size: nothing served
            assert len(r.pending) == n
            r.insert(experience(layout, 32, seed=1), "s")
            await r.answer(smp)
            # error starts at 0 at min_size; each batch costs `batch`, down to -error_buffer
            allowed = math.floor(r.limiter.config.error_buffer / batch) + 1
            assert 2 <= allowed < n - 1
            for i in range(allowed):
                msg = await recv_until(dealer, sampled)
                assert isinstance(msg, SampledBatch) and msg.request_id == i  # oldest first
                assert msg.transitions.shape == (batch, layout.width)
                assert (msg.replay_size, msg.inserted) == (64, 64)
            await nothing_on(dealer, 0.05)
            assert len(r.pending) == n - allowed and not r.limiter.can_sample(batch)
            r.insert(experience(layout, 1, seed=2), "s")  # one transition buys spi=batch samples
            await r.answer(smp)
            msg = await recv_until(dealer, sampled)
            assert isinstance(msg, SampledBatch) and msg.request_id == allowed
            assert len(r.pending) == n - allowed - 1
    run(body())


def test_bad_batch_size_gets_an_error_and_the_queue_goes_on(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            r = h.build(Replay)
            smp = r.channel("sample", binding=True)
            dealer = h.channel("sample", binding=False, sender="learner")
            r.insert(experience(layout_of(h.cfg), 64), "s")
            too_big = h.cfg.replay.capacity + 1
            for rid, size in ((1, 0), (2, too_big), (3, 8)):
                await dealer.send(SampleRequest(rid, size))
            await take_pending(r, smp, 2)  # size 0 is refused on receipt (schema check)
            await r.answer(smp)
            for size, codes in ((0, {"schema", "bad_request"}), (too_big, {"bad_request"})):
                err = await recv_until(dealer, sampled)
                assert isinstance(err, Error) and err.code in codes and f"batch_size={size}" in err.detail
            assert err.ref_seq == 2
            ok = await recv_until(dealer, sampled)
            assert isinstance(ok, SampledBatch) and ok.request_id == 3 and len(ok.transitions) == 8
            assert not r.pending
    run(body())


def test_limiter_config_follows_the_update_to_data_ratio(tmp_path: Path) -> None:
    fused = limiter_config(config(tmp_path, "replay.update_to_data=0.5"))
    assert fused.samples_per_insert == 0.5 * 32 and fused.min_size_to_sample == 64
    split = limiter_config(config(tmp_path, "learner.mode=split"))  # TD3: critic + actor/2 batches
    assert split.samples_per_insert == pytest.approx(32 * 1.5)
    assert not limiter_config(config(tmp_path, "replay.update_to_data=0")).limited


def test_serve_answers_an_early_request_only_after_min_size(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            metrics = h.metrics()
            r = h.build(Replay)
            task = h.start(r.serve())
            push = h.channel("experience", binding=False, sender="sampler-0")
            dealer = h.channel("sample", binding=False, sender="learner")
            layout = layout_of(h.cfg)
            await dealer.send(SampleRequest(7, 16))
            await push.send(experience(layout, 40))
            await push.send(experience(TransitionLayout(2, 3), 9))  # decodes fine, wrong env: rejected
            await until(lambda: r.buffer.size == 40 and r.rejected == 9, what="first inserts")
            await nothing_on(dealer, 0.2)
            assert len(r.pending) == 1
            await push.send(experience(layout, 24, seed=1))
            msg = await recv_until(dealer, sampled)
            assert isinstance(msg, SampledBatch) and msg.request_id == 7 and msg.inserted == 64
            report = await recv_until(metrics, metric_from("replay", "inserted", lambda v: v == 64))
            values = report.values  # type: ignore[attr-defined]
            assert values["rejected"] == 9 and values["replay_size"] == 64
            assert values["sampled"] == 16 and values["pending_requests"] == 0
            await h.stop(r, task)
    run(body())


def test_paused_replay_takes_no_experience(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            r = h.build(Replay)
            task = h.start(r.serve())
            push = h.channel("experience", binding=False, sender="sampler-0")
            assert r.on_control(Control("pause", 1)).ok
            await push.send(experience(layout_of(h.cfg), 10))
            with pytest.raises(AssertionError):
                await until(lambda: r.buffer.size > 0, timeout=0.3)
            r.on_control(Control("resume", 2))
            await until(lambda: r.buffer.size == 10, what="insert after resume")
            await h.stop(r, task)
    run(body())


def test_full_limiter_stops_reading_experience(tmp_path: Path) -> None:
    """Inserts beyond the error buffer wait in the socket (back-pressure), none is lost."""
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            r = h.build(Replay)
            task = h.start(r.serve())
            push = h.channel("experience", binding=False, sender="sampler-0")
            dealer = h.channel("sample", binding=False, sender="learner")
            for i in range(40):
                await push.send(experience(layout_of(h.cfg), 64, seed=i))
            await until(lambda: not r.limiter.can_insert(1), what="limiter full")
            held = r.limiter.inserts
            assert held < 40 * 64
            for i in range(60):  # one in flight at a time, as a learner with prefetch 1
                await dealer.send(SampleRequest(i, 32))
                assert isinstance(await recv_until(dealer, sampled), SampledBatch)
            await until(lambda: r.limiter.inserts > held, what="inserts resume after samples")
            await h.stop(r, task)
            assert r.rejected == 0 and r.limiter.inserts % 64 == 0
    run(body())


# ------------------------------------------------------------------ bad batches, drain, warm-up grants

async def answers(dealer: Channel, n: int, timeout: float = 3.0) -> list[object]:
    """The next n messages replay sends back on an experience DEALER (acks and errors)."""
    return [(await dealer.recv(timeout=timeout))[1] for _ in range(n)]


def numbered(layout: TransitionLayout, n: int, batch: int, seed: int = 0) -> Experience:
    msg = experience(layout, n, seed=seed)
    msg.batch = batch
    return msg


def raw_frames(msg: Experience, encoder: Encoder, **body: object) -> list[bytes]:
    """Frames of `msg` with header body fields overridden: what a sender whose rows do not fit
    its own obs_dim/act_dim, or whose done is 2.0, would put on the wire."""
    frames = to_frames(msg, encoder)
    head = msgpack.unpackb(frames[0])
    head["body"].update(body)
    return [msgpack.packb(head), *[bytes(f) for f in frames[1:]]]


def test_a_refused_numbered_batch_is_answered_rejected_and_the_sender_moves_on(tmp_path: Path) -> None:
    """Schema errors (row width, done) and replay's own refusals (other dims, NaN) each get an
    `error` naming the message and a `rejected` ack that uses the batch number up; the next
    batch is stored, not a gap; errors are counted per code and sender in the metrics."""
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            metrics = h.metrics()
            r = h.build(Replay)
            task = h.start(r.serve())
            layout = layout_of(h.cfg)
            dealer = h.channel("experience", binding=False, sender="sampler-x")
            raw = h.ctx.socket(zmq.DEALER)
            raw.connect(h.endpoints["experience"])
            enc = Encoder("sampler-y")
            await raw.send_multipart(raw_frames(numbered(layout, 8, 1), enc, obs_dim=4))  # width 9 != 11
            done2 = numbered(layout, 8, 2)
            layout.columns(done2.transitions)["done"][3] = 2.0
            await raw.send_multipart(to_frames(done2, enc))
            await raw.send_multipart(to_frames(numbered(layout, 8, 3, seed=3), enc))
            got = [from_envelope(decode(await raw.recv_multipart())) for _ in range(5)]
            errors = [m for m in got if isinstance(m, Error)]
            acks = [m for m in got if isinstance(m, ExperienceAck)]
            assert [(e.code, e.ref_type, e.ref_seq) for e in errors] == [("schema", "experience", 1),
                                                                        ("schema", "experience", 2)]
            assert "obs_dim=4" in errors[0].detail and "done=2.0" in errors[1].detail
            assert [(a.batch, a.status, a.stored) for a in acks] == [(1, "rejected", 1), (2, "rejected", 2),
                                                                      (3, "stored", 3)]
            nan = numbered(layout, 5, 1)
            nan.transitions[0, 0] = np.nan
            await dealer.send(nan)
            await dealer.send(numbered(TransitionLayout(2, 3), 5, 2))  # same width, another env
            await dealer.send(numbered(layout, 5, 3, seed=4))
            got = await answers(dealer, 5)
            assert [(m.code, m.ref_seq) for m in got if isinstance(m, Error)] == [("rejected", 1), ("rejected", 2)]
            assert [(m.batch, m.status) for m in got if isinstance(m, ExperienceAck)] == [
                (1, "rejected"), (2, "rejected"), (3, "stored")]
            assert r.buffer.size == 13 and r.rejected == 8 + 8 + 5 + 5
            report = await recv_until(metrics, metric_from("replay", "errors/sampler-y/schema", lambda v: v == 2))
            values = report.values  # type: ignore[attr-defined]
            assert values["errors/sampler-x/rejected"] == 2 and values["errors/schema"] == 2
            assert values["ledger/sampler-y/rejected"] == 16 and values["ledger/sampler-x/stored"] == 5
            raw.close(linger=0)
            await h.stop(r, task)
    run(body())


def test_drain_stores_what_the_rate_limiter_holds_back_and_close_takes_the_rest(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, "replay.snapshot_every_s=0")) as h:
            r = h.build(Replay)
            task = h.start(r.serve())
            layout = layout_of(h.cfg)
            dealer = h.channel("experience", binding=False, sender="sampler-0")
            for i in range(1, 13):
                await dealer.send(numbered(layout, 64, i, seed=i))
            await until(lambda: not r.limiter.can_insert(1), what="limiter full")
            held = r.buffer.size
            assert held < 12 * 64
            assert not r.on_control(Control("set", 1, "drain", 1)).ok  # only `true`
            assert r.on_control(Control("set", 2, "drain", True)).ok
            await until(lambda: r.buffer.size == 12 * 64, what="everything stored while draining")
            assert r.ledger.sessions[("sampler-0", dealer.encoder.session)].stored == 12
            await h.stop(r, task)
            for i in range(13, 16):  # arrive after the loop stopped: close() takes them
                await dealer.send(numbered(layout, 64, i, seed=i))
            await asyncio.sleep(0.2)
            await r.close()
            assert r.buffer.size == 15 * 64 and r.ledger.books["sampler-0"]["inserted"] == 15 * 64
    run(body())


def test_warmup_is_granted_for_the_run_as_a_whole(tmp_path: Path) -> None:
    """Replay grants `warmup_steps` random steps in all, at most a lease unused per session at
    a time; a sender's restart gives its old session's unused steps back."""
    async def body() -> None:
        async with Harness(config(tmp_path, "sampler.warmup_steps=1500", "replay.update_to_data=0")) as h:
            r = h.build(Replay)
            task = h.start(r.serve())
            layout = layout_of(h.cfg)
            a = h.channel("experience", binding=False, sender="sampler-a")
            b = h.channel("experience", binding=False, sender="sampler-b")

            async def send(ch: Channel, msg: Experience) -> ExperienceAck:
                await ch.send(msg)
                ack = (await answers(ch, 1))[0]
                assert isinstance(ack, ExperienceAck) and ack.status == "stored", ack
                return ack

            empty = experience(layout, 0)
            empty.batch, empty.random_steps = 1, 0
            assert (await send(a, empty)).warmup == WARMUP_LEASE
            empty.batch = 1
            assert (await send(b, empty)).warmup == 1500 - WARMUP_LEASE  # what is left
            used = numbered(layout, 600, 2)  # actor_version -1: all random
            assert (await send(a, used)).warmup == WARMUP_LEASE  # nothing left to top up with
            assert r.ledger.warmup_granted == 1500
            restarted = h.channel("experience", binding=False, sender="sampler-a")  # a new session
            empty.batch = 1
            # the old session's unused 1024 - 600 came back and went to the new one
            assert (await send(restarted, empty)).warmup == WARMUP_LEASE - 600
            assert r.ledger.warmup_granted == 1500
            acted = numbered(layout, 100, 2)
            acted.actor_version, acted.random_steps = 3, 10
            await send(b, acted)
            assert r.ledger.books["sampler-b"]["random"] == 10 and r.ledger.books["sampler-a"]["random"] == 600
            await h.stop(r, task)
    run(body())
