"""services/learner, actor_learner, critic_learner with a real replay service and sockets,
all in one event loop: updates, weight publishing, pacing, lag limits, checkpoints."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zmq


from spreeze.common.errors import ConfigError
from spreeze.common.checkpoint_files import save_checkpoint
from spreeze.common.learner_io import checkpoint_dir
from spreeze.common.numpy_policy import NumpyActor
from spreeze.common.weights import WeightsFollower, WeightsPublisher, dense_message
from spreeze.proto.messages import Weights
from spreeze.services.actor_learner.main import ActorLearner
from spreeze.services.critic_learner.main import CriticLearner
from spreeze.services.learner.main import Learner
from spreeze.services.replay.main import Replay
from tests.helpers import Harness, config, experience, layout_of, needs_cxx, parts, run, until

pytestmark = pytest.mark.timeout(10)
# replay tolerance 0.05 + prefetch 1: error buffer 256 transitions = 8 batches of 32 past
# the 64 inserted, so a fused learner fed 64 transitions does exactly 9 updates, then waits
PACED = ["replay.tolerance=0.05", "learner.prefetch=1", "learner.publish_interval=0"]
SPLIT = ["learner.mode=split", "replay.update_to_data=0", "learner.publish_interval=0",
         "learner.sync_every=2"]


async def replay_with(h: Harness, rows: int = 64) -> Replay:
    r = h.build(Replay)
    r.insert(experience(layout_of(h.cfg), rows), "sampler-0")
    h.start(r.serve())
    return r


async def steady(probe: Any, seconds: float = 0.3) -> Any:
    """The value of probe() after it stopped changing for `seconds` (fails if it keeps changing)."""
    deadline = time.monotonic() + 5
    value, since = probe(), time.monotonic()
    while time.monotonic() - since < seconds:
        assert time.monotonic() < deadline, f"still changing: {probe()}"
        await asyncio.sleep(0.02)
        if probe() != value:
            value, since = probe(), time.monotonic()
    return value


async def settle(probe: Any, at_least: int) -> Any:
    """Wait until probe() >= at_least, then return its value once it stopped changing."""
    await until(lambda: probe() >= at_least, timeout=5, what=f"at least {at_least}")
    return await steady(probe)


async def collect(follower: WeightsFollower, want: set[str], timeout: float = 3.0,
                  accept: Any = lambda m: True) -> dict[str, Weights]:
    """Newest message per net until every net in `want` has an accepted one."""
    seen: dict[str, Weights] = {}
    deadline = time.monotonic() + timeout
    while not want <= {k for k, m in seen.items() if accept(m)}:
        assert time.monotonic() < deadline, f"got only {sorted(seen)} of {sorted(want)}"
        await follower.channel.sock.poll(50, zmq.POLLIN)
        seen.update(follower.poll())
    return seen


def test_fused_learner_updates_publishes_and_caches_weights(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, *PACED)) as h:
            early = WeightsFollower(h.channel("weights", binding=False, name="actor_weights"))
            r = await replay_with(h)
            lrn = h.build(Learner)
            task = h.start(lrn.serve())
            updates = await settle(lambda: lrn.updates, 9)
            assert updates == 9 and r.limiter.samples == 9 * 32
            assert lrn.health_detail() == "eager update steps (learner.compile=false)"  # spreeze health says so
            assert lrn.compile_metrics(time.monotonic(), updates)["compiled"] == 0.0
            newest = (await collect(early, {"actor"}, accept=lambda m: m.version == 4))["actor"]
            assert (newest.version, newest.updates) == (4, 8)  # 9 critic updates, policy delay 2
            assert newest.extras["env_steps"] == 64
            live = lrn.actor.actor_state()
            for k, v in live.items():
                np.testing.assert_array_equal(newest.dense[k], v)
            assert newest.policy["ops"][-1] == {"op": "squash", "scale": "scale", "bias": "bias",
                                                "exploration_noise": lrn.cfg.section("td3").exploration_noise}
            NumpyActor(newest.policy, newest.dense, np.array([-2.0]), np.array([2.0]))  # samplers can act with it
            # a subscriber joining now, while the learner publishes nothing new, gets version 4
            late = WeightsFollower(h.channel("weights", binding=False, name="actor_weights"))
            assert (await late.wait("actor", 2)).version == 4
            await h.stop(lrn, task)
            await lrn.close()
            ckpt = checkpoint_dir(str(tmp_path))
            saved = torch.load(ckpt / "learner.pt", weights_only=False)
            assert saved["updates"] == 9 and saved["env_steps"] == 64
            assert saved["config"]["learner"]["prefetch"] == 1 and {"actor", "critic"} <= set(saved)
            # no temporary file left
            assert sorted(p.name for p in ckpt.iterdir()) == ["learner.made-for.json", "learner.pt"]
    run(body())


def critic_weights(h: Harness, updates: int) -> Weights:
    _, critic = parts(h.cfg)
    return dense_message("critic", updates, updates, critic.critic_state())


def actor_pair(h: Harness, updates: int) -> list[Weights]:
    actor, _ = parts(h.cfg)
    target = actor.target_actor_state()
    assert target is not None
    return [dense_message("actor", updates // 2, updates, actor.actor_state()),
            dense_message("actor_target", updates // 2, updates, target)]


def test_actor_learner_waits_for_critic_updates(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, *SPLIT)) as h:
            critic = WeightsPublisher(h.channel("weights", binding=True, name="critic_sync"))
            h.start(critic.serve_joins())
            to_critic = WeightsFollower(h.channel("weights", binding=False, name="actor_sync"))
            r = await replay_with(h)
            al = h.build(ActorLearner)
            task = h.start(al.serve())
            await until(lambda: al.ready, what="actor ready")
            assert await steady(lambda: al.actor.updates) == 0 and r.limiter.samples == 0
            critic.publish(critic_weights(h, updates=2))  # allows actor update 1 (policy delay 2)
            assert await settle(lambda: al.actor.updates, 1) == 1 and al.critic_updates == 2
            critic.publish(critic_weights(h, updates=6))
            assert await settle(lambda: al.actor.updates, 3) == 3
            assert r.limiter.samples == (3 + h.cfg.learner.prefetch - 1) * 32  # + requests in flight
            sync = await collect(to_critic, {"actor", "actor_target"}, accept=lambda m: m.version == 2)
            assert sync["actor"].updates == 4  # synced after actor update 2 (sync_every 2)
            await h.stop(al, task)
            await al.close()
            assert torch.load(checkpoint_dir(str(tmp_path)) / "actor_learner.pt", weights_only=False)["updates"] == 3
    run(body())


def test_critic_learner_stops_at_max_lag(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, *SPLIT, "learner.max_lag=4")) as h:
            actor = WeightsPublisher(h.channel("weights", binding=True, name="actor_sync"))
            h.start(actor.serve_joins())
            to_actor = WeightsFollower(h.channel("weights", binding=False, name="critic_sync"))
            await replay_with(h)
            cl = h.build(CriticLearner)
            task = h.start(cl.serve())
            await until(lambda: cl.ready, what="critic ready")
            assert await settle(lambda: cl.critic.updates, 5) == 5  # 5 - 0 > max_lag
            first, second = actor_pair(h, updates=8)
            actor.publish(first)  # TD3 needs the target too: the actor alone must not count
            assert await steady(lambda: cl.critic.updates, 0.2) == 5 and cl.actor_seen == 0
            assert not task.done(), task
            actor.publish(second)
            assert await settle(lambda: cl.critic.updates, 13) == 13 and cl.actor_seen == 8
            newest = await collect(to_actor, {"critic"}, accept=lambda m: m.updates == 12)
            assert newest["critic"].version == 12  # sent every sync_every=2 critic updates
            await h.stop(cl, task)
    run(body())


@pytest.mark.parametrize("max_lag", [3, 8])  # 3 = sync_every x policy_delay - 1: the least that works
def test_split_pair_keeps_going(tmp_path: Path, max_lag: int) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, *SPLIT, f"learner.max_lag={max_lag}")) as h:
            await replay_with(h)
            cl, al = h.build(CriticLearner), h.build(ActorLearner)
            h.start(cl.serve())
            h.start(al.serve())
            await until(lambda: al.ready and al.actor.updates >= 12, timeout=6,
                        what="actor updates")
            assert cl.critic.updates >= 24
            assert cl.critic.updates - cl.actor_seen <= max_lag + 1
    run(body())


def test_batch_stream_takes_several_batches_per_request(tmp_path: Path) -> None:
    from spreeze.common.learner_io import BatchStream

    async def body() -> None:
        async with Harness(config(tmp_path, "replay.update_to_data=0")) as h:
            r = await replay_with(h)
            stream = BatchStream(h.channel("sample", binding=False), layout_of(h.cfg), batch_size=32,
                                 prefetch=1, device=torch.device("cpu"), per_request=3)
            stop = asyncio.Event()
            first = [await stream.next(stop) for _ in range(3)]
            assert r.limiter.samples == 96 and stream.next_id == 1  # one request of 3 x 32 rows
            assert all(b["obs"].shape == (32, 3) for b in first)  # type: ignore[index]
            rows = torch.cat([torch.cat([b["obs"], b["action"]], 1) for b in first])  # type: ignore[index]
            assert len({tuple(x.tolist()) for x in rows}) > 32  # three different slices, not one repeated
            await stream.next(stop)  # the fourth batch needs a second request
            assert stream.next_id == 2
            assert r.limiter.samples == 192
    run(body())


def test_batches_per_request_must_fit_in_replay(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="batches_per_request"):
        config(tmp_path, "replay.capacity=1000", "replay.min_size=100", "learner.batch_size=256",
               "learner.batches_per_request=4")


def test_a_restarted_critic_learner_continues_from_its_checkpoint(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, *SPLIT, "learner.max_lag=4")) as h:
            await replay_with(h)
            cl = h.build(CriticLearner)
            task = h.start(cl.serve())
            assert await settle(lambda: cl.critic.updates, 5) == 5
            await h.stop(cl, task)
            await cl.close()  # what SIGTERM and shutdown do: a final checkpoint
            saved = cl.critic.save()
            again = h.build(CriticLearner, "critic_learner")
            h.start(again.serve())
            await until(lambda: again.ready, what="critic restored")
            assert again.critic.updates == 5  # then it waits at max_lag for a newer actor
            for name, value in again.critic.save()["states"]["critic"].items():
                torch.testing.assert_close(value, saved["states"]["critic"][name])
            assert again.critic.save()["states"]["opt"]["state"].keys() == saved["states"]["opt"]["state"].keys()
            ckpt = torch.load(checkpoint_dir(str(tmp_path)) / "critic_learner.pt", weights_only=False)
            assert ckpt["versions"] == {"critic": 5, "actor_seen": 0} and "torch_rng" in ckpt
    run(body())


@needs_cxx
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", [pytest.param("fused", marks=pytest.mark.slow), "split"])
def test_learners_update_eagerly_while_compiling_then_switch_to_compiled(tmp_path: Path, mode: str) -> None:
    # split: with normalised observations too, whose batches are not column views of the rows
    # (the steps must be warmed up on batches shaped as the real ones, or they recompile)
    overrides = ["learner.compile=true", "learner.compile_cache=run", "td3.hidden=[8,8]",
                 *([*SPLIT, "learner.obs_norm=true"] if mode == "split" else ["replay.update_to_data=0"])]

    async def body() -> None:
        async with Harness(config(tmp_path, *overrides)) as h:
            await replay_with(h)
            roles = [Learner] if mode == "fused" else [CriticLearner, ActorLearner]
            learners = [h.build(cls) for cls in roles]
            for lrn in learners:
                h.start(lrn.serve())
            counted = (lambda lrn: lrn.actor.updates) if mode == "fused" else (
                lambda lrn: (lrn.critic if hasattr(lrn, "critic") else lrn.actor).updates)
            await until(lambda: all(counted(lrn) >= 3 for lrn in learners), timeout=60, what="eager updates")
            assert all(lrn.compiling is not None and not lrn.fast for lrn in learners)  # a cold compile runs
            assert all(lrn.health_detail().startswith("eager update steps while compiling (") for lrn in learners)
            live = [lrn.trained() for lrn in learners]
            await until(lambda: all(lrn.fast for lrn in learners), timeout=200, what="compiled steps in use")
            for lrn, before in zip(learners, live):
                assert lrn.compiling is None and all(a is not b for a, b in zip(lrn.trained(), before))
                assert all(part.fast is not None for part in lrn.trained())
                assert all(part.updates >= old.updates for part, old in zip(lrn.trained(), before))
                m = lrn.compile_metrics(time.monotonic(), counted(lrn))
                assert m["compiling"] == 0.0 and m["compile_s"] > 0 and m["compiles"] == len(lrn.fast)
                assert m["compiled"] == 1.0 and lrn.health_detail().startswith("compiled update steps")
                assert lrn.recorded_compile_s() is not None  # the next run on this cache expects it
            done = [counted(lrn) for lrn in learners]
            await until(lambda: all(counted(lrn) >= n + 6 for lrn, n in zip(learners, done)), timeout=60,
                        what="compiled updates")
            if mode == "fused":  # a new batch size compiles in the background, then takes over
                (lrn,) = learners
                lrn.set_param("batch_size", 16)
                assert lrn.batches.batch_size == 32 and lrn.compiling is not None
                with pytest.raises(ConfigError, match="still compiling"):
                    lrn.set_param("batch_size", 8)
                await until(lambda: lrn.batches.batch_size == 16, timeout=120, what="batch size 16")
                done16 = counted(lrn)
                assert done16 > done[0] + 6  # it went on updating (eagerly) at 32 meanwhile
                await until(lambda: counted(lrn) >= done16 + 4, timeout=30, what="updates at batch 16")
                assert lrn.compile_metrics(time.monotonic(), counted(lrn))["compiles"] == len(lrn.fast)
    run(body(), timeout=230)


def test_a_learner_refuses_a_checkpoint_of_other_networks(tmp_path: Path) -> None:
    from spreeze.common.config import to_dict

    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            lrn = h.build(Learner)
            other = to_dict(config(tmp_path, "td3.hidden=[8,8]"))
            save_checkpoint({"config": other, "torch_rng": torch.get_rng_state(), "updates": 0}, lrn.checkpoint_path)
            with pytest.raises(ConfigError, match=r"td3\.hidden: checkpoint \[8, 8\], this run \[32, 32\]"):
                lrn.restored()
    run(body())
