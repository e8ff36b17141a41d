"""services/sampler: collect() rows, warm-up, acting with the actor, set_param, serve()."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from spreeze.common.numpy_policy import NumpyActor
from spreeze.common.weights import WeightsPublisher, dense_message
from spreeze.common.errors import TransportTimeout
from spreeze.common.transport import Channel
from spreeze.proto.messages import Control, Experience, ExperienceAck, Weights
from spreeze.services.sampler.main import Sampler
from tests.helpers import Harness, actor_policy, config, nothing_on, parts, run

pytestmark = pytest.mark.timeout(10)


def actor_weights(h: Harness, version: int = 5) -> Weights:
    actor, _ = parts(h.cfg, seed=3)
    return dense_message("actor", version, 2 * version, actor.actor_state(), {"env_steps": 0.0},
                         actor_policy(h.cfg, actor))


def actions_by_step(s: Sampler, exp: Experience) -> tuple[np.ndarray, np.ndarray]:
    """(obs, action) of an Experience as [steps, envs, dim] arrays."""
    cols = s.layout.columns(exp.transitions)
    n = len(s.envs)
    return cols["obs"].reshape(-1, n, s.layout.obs_dim), cols["action"].reshape(-1, n, s.layout.act_dim)


def grant(s: Sampler, steps: int) -> None:
    """What an ack with `warmup` = steps does: replay grants this session that many random steps."""
    s.outbox.on_ack(ExperienceAck(0, "stored", 0, 0, steps))


def test_collect_layout_steps_and_random_warmup(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, "sampler.warmup_steps=100")) as h:
            s = h.build(Sampler, "sampler-0")
            assert not s.can_act() and len(s.collect().transitions) == 0  # no actor, no grant: nothing
            grant(s, 100)
            s.take_weights(actor_weights(h))  # held, but unused while random steps are granted
            rng = copy.deepcopy(s.rng)
            exp = s.collect()
            assert exp.transitions.shape == (16, 9) and exp.transitions.dtype == np.float32
            assert (exp.obs_dim, exp.act_dim, exp.env_steps, exp.actor_version) == (3, 1, 16, -1)
            assert exp.random_steps == exp.random_rows == 16
            exp.check()
            _, actions = actions_by_step(s, exp)
            expected = np.stack([rng.uniform(s.envs.low, s.envs.high, (2, 1)).astype(np.float32)
                                 for _ in range(8)])
            np.testing.assert_array_equal(actions, expected)
            assert (actions >= -2).all() and (actions <= 2).all() and actions.std() > 0.5
            assert s.collect().env_steps == 32 and s.counters()["env_steps"] == 32
    run(body())


def test_random_steps_never_exceed_the_grant(tmp_path: Path) -> None:
    """Env by env: the last granted steps are random in the first envs of a step, the actor acts in
    the others; with neither a grant nor an actor the batch ends early."""
    async def body() -> None:
        async with Harness(config(tmp_path, "sampler.warmup_steps=1000")) as h:
            s = h.build(Sampler, "sampler-0")
            grant(s, 5)  # two steps of both envs, then one env
            exp = s.collect()
            assert len(exp.transitions) == 4 and exp.random_steps == 4 and s.random_steps == 4
            s.take_weights(actor_weights(h, version=7))
            mixed = s.collect()
            assert len(mixed.transitions) == 16 and mixed.random_steps == 1 and mixed.actor_version == 7
            grant(s, 3)  # a lower cumulative grant than before changes nothing
            assert s.outbox.warmup == 5 and s.collect().random_steps == 0
            grant(s, 9)
            assert s.collect().random_steps == 4 and s.random_steps == 9 == s.counters()["random_steps"]
    run(body())


def test_collect_acts_with_the_actor_after_take_weights(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            s = h.build(Sampler, "sampler-0")
            msg = actor_weights(h, version=5)
            s.take_weights(msg)
            assert s.actor_version == 5 and s.counters()["actor_version"] == 5
            rng = copy.deepcopy(s.rng)
            exp = s.collect()
            assert exp.actor_version == 5
            obs, actions = actions_by_step(s, exp)
            ref = NumpyActor(msg.policy, msg.dense, s.envs.low, s.envs.high)
            random_like = copy.deepcopy(rng)
            for t in range(len(obs)):
                np.testing.assert_allclose(actions[t], ref.act(obs[t], rng, explore=True), rtol=1e-6)
                assert not np.allclose(actions[t], s.envs.random_actions(random_like))
                noise = np.abs(actions[t] - ref.mean_action(obs[t]))
                assert (noise <= 5 * h.cfg.section("td3").exploration_noise * 2.0).all()  # 5 std of 0.1 x half range 2
            s.take_weights(actor_weights(h, version=9))  # a second message loads in place
            assert s.actor_version == 9 and s.collect().actor_version == 9
    run(body())


def test_truncated_episode_is_reported_and_not_done(tmp_path: Path) -> None:
    cfg = config(tmp_path, "sampler.envs_per_sampler=1", "sampler.steps_per_push=200",
                 "sampler.warmup_steps=1000")

    async def body() -> None:
        async with Harness(cfg) as h:
            s = h.build(Sampler, "sampler-0")
            grant(s, 1000)
            exp = s.collect()
            cols = s.layout.columns(exp.transitions)
            assert (cols["done"] == 0).all()
            assert exp.episode_lengths == [200]
            assert exp.episode_returns[0] == pytest.approx(float(cols["reward"].sum()), rel=1e-5)
            assert not np.allclose(cols["next_obs"][-1], s.envs.obs[0])  # final obs, not the reset one
            assert s.returns == exp.episode_returns
    run(body())


def test_terminal_rows_are_done_in_a_terminating_env(tmp_path: Path) -> None:
    cfg = config(tmp_path, "env=InvertedPendulum-v5", "sampler.steps_per_push=100",
                 "sampler.warmup_steps=1000")

    async def body() -> None:
        async with Harness(cfg) as h:
            s = h.build(Sampler, "sampler-0")
            grant(s, 1000)
            exp = s.collect()
            cols = s.layout.columns(exp.transitions)
            done = cols["done"] == 1
            assert done.sum() == len(exp.episode_returns) >= 2
            assert (np.abs(cols["next_obs"][done, 1]) > 0.2).all()
            assert set(np.unique(cols["done"])) == {0.0, 1.0}
    run(body())


def test_set_param_steps_per_push(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            s = h.build(Sampler, "sampler-0")
            grant(s, 100)
            assert s.on_control(Control("set", 1, "steps_per_push", 3)).ok
            assert len(s.collect().transitions) == 3 * 2
            for rid, (key, value) in enumerate([("steps_per_push", 0), ("steps_per_push", -2),
                                                ("steps_per_push", "8"), ("steps_per_push", True),
                                                ("steps_per_push", 2.0), ("warmup_steps", 5)], 2):
                reply = s.on_control(Control("set", rid, key, value))
                assert not reply.ok and key in reply.detail and repr(value) in reply.detail, reply
            assert s.steps_per_push == 3
    run(body())


async def recv_acking(router: Channel, accept: Callable[[Experience], bool], ack: bool = True,
                      timeout: float = 3.0) -> Experience:
    """The first Experience that `accept` takes, acking (stored, durable) every batch seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            peer, msg = await router.recv(timeout=0.1)
        except TransportTimeout:
            continue
        if isinstance(msg, Experience):
            if ack:
                await router.send(ExperienceAck(msg.batch, "stored", msg.batch, msg.batch), to=peer)
            if accept(msg):
                return msg
    raise AssertionError(f"no accepted Experience within {timeout}s")


def test_serve_pushes_experience_and_follows_published_weights(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            router = h.channel("experience", binding=True)
            pub = WeightsPublisher(h.channel("weights", binding=True, name="actor_weights"))
            h.start(pub.serve_joins())
            s = h.build(Sampler, "sampler-0")
            task = h.start(s.serve())
            first = await recv_acking(router, lambda m: True)
            assert first.batch == 1 and len(first.transitions) == 0  # the opening batch
            await nothing_on(router, 0.3)  # no actor, no warm-up granted: nothing to send
            pub.publish(actor_weights(h, version=4))
            acted = await recv_acking(router, lambda m: m.actor_version == 4)
            assert acted.env_steps > first.env_steps and acted.batch > first.batch
            await h.stop(s, task)
    run(body())


def test_sampler_waits_for_acks_and_resends_after_a_timeout(tmp_path: Path) -> None:
    """Credit: ack_window batches, then nothing until acks; unacked ones come again, in order."""
    async def body() -> None:
        async with Harness(config(tmp_path, "sampler.ack_window=3", "sampler.ack_timeout=0.5")) as h:
            router = h.channel("experience", binding=True)
            s = h.build(Sampler, "sampler-0")
            s.take_weights(actor_weights(h))
            task = h.start(s.serve())
            got = [await recv_acking(router, lambda m: True, ack=False) for _ in range(3)]
            assert [m.batch for m in got] == [1, 2, 3]
            again = [await recv_acking(router, lambda m: True, ack=False, timeout=5) for _ in range(3)]
            assert [m.batch for m in again] == [1, 2, 3]  # nothing new without credit: the same, re-sent
            assert len(got[0].transitions) == 0 and len(got[1].transitions) == 16  # the opening, then data
            np.testing.assert_array_equal(again[1].transitions, got[1].transitions)
            assert s.outbox.resends >= 3
            fourth = await recv_acking(router, lambda m: m.batch == 4, timeout=5)  # acks give credit
            assert fourth.env_steps > got[2].env_steps
            await h.stop(s, task)
    run(body(), timeout=15)
