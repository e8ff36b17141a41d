"""services/replay: inserts and rejections, rate-limited answers, serve() with real peers."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import numpy as np
import pytest

from common.transport import Channel
from proto.messages import Control, Error, SampledBatch, SampleRequest, TransitionLayout
from services.replay.main import Replay, limiter_config
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
