"""services/evaluator: when to evaluate, EvalResult on the bus, latest/best checkpoints."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from spreeze.common.errors import TransportTimeout
from spreeze.common.evaluation import evaluate_checkpoint
from spreeze.common.checkpoint_files import save_checkpoint
from spreeze.common.learner_io import checkpoint_dir
from spreeze.common.service import Service
from spreeze.common.transport import Channel
from spreeze.common.weights import WeightsPublisher, dense_message
from spreeze.proto.messages import EvalResult, Weights
from spreeze.services.evaluator.main import Evaluator
from tests.helpers import Harness, actor_policy, config, parts, recv_until, run

pytestmark = pytest.mark.timeout(10)


def actor(h: Harness, version: int, updates: int, env_steps: float = 100.0) -> Weights:
    a, _ = parts(h.cfg, seed=version)
    return dense_message("actor", version, updates, a.actor_state(), {"env_steps": env_steps},
                         actor_policy(h.cfg, a))


def ckpt(tmp_path: Path, name: str) -> dict:  # type: ignore[type-arg]
    return torch.load(checkpoint_dir(str(tmp_path)) / name, weights_only=False)


async def subscribed(svc: Service, metrics: Channel) -> None:
    """Publish probes until one reaches the bus: PUB drops everything before the subscription."""
    deadline = time.monotonic() + 3
    while True:
        svc.publish({"probe": 1})
        try:
            await metrics.recv(timeout=0.02)
            return
        except TransportTimeout:
            assert time.monotonic() < deadline, "metrics subscription never arrived"


def is_eval(msg: object) -> bool:
    return isinstance(msg, EvalResult)


def test_due_by_updates(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, "eval.every_updates=10")) as h:
            ev = h.build(Evaluator)
            assert not ev.due()  # nothing to evaluate
            ev.newest = actor(h, 0, 0)
            assert not ev.due()
            ev.newest = actor(h, 5, 10)
            assert ev.due()
            await ev.evaluate()
            assert not ev.due()  # this version is done
            ev.newest = actor(h, 7, 19)
            assert not ev.due()  # only 9 updates more
            ev.newest = actor(h, 8, 20)
            assert ev.due()
    run(body())


def test_due_by_seconds(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, "eval.every_updates=0", "eval.every_seconds=30")) as h:
            ev = h.build(Evaluator)
            ev.newest = actor(h, 1, 1)
            assert not ev.due()
            ev.last_eval_time -= 31  # instead of waiting half a minute
            assert ev.due()
            await ev.evaluate()
            ev.newest = actor(h, 2, 2)
            assert not ev.due()  # the clock restarted at the evaluation
    run(body())


def test_evaluate_publishes_and_writes_latest_and_best(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, "eval.episodes=2")) as h:
            metrics = h.metrics()
            ev = h.build(Evaluator)
            save_checkpoint({"updates": 77}, checkpoint_dir(str(tmp_path)) / "learner.pt")
            ev.newest = actor(h, 3, 6, env_steps=1234)
            await subscribed(ev, metrics)
            result = await ev.evaluate()
            assert result is not None
            got = await recv_until(metrics, is_eval)
            assert got == result
            assert (result.actor_version, result.updates, result.env_steps, result.episodes) == (3, 6, 1234, 2)
            assert result.return_mean == pytest.approx(np.mean(result.returns)) and result.length_mean == 200
            latest, best = ckpt(tmp_path, "latest.pt"), ckpt(tmp_path, "best.pt")
            assert latest["eval"]["actor_version"] == best["eval"]["actor_version"] == 3
            assert latest["learners"] == {"learner": {"updates": 77}}
            for k, v in ev.newest.dense.items():
                np.testing.assert_array_equal(latest["actor"][k].numpy(), v)
            assert latest["policy"] == ev.newest.policy  # the acting policy is saved beside the weights
            got_back = evaluate_checkpoint(tmp_path, 1, "best")  # the CLI's reader accepts it
            assert got_back
            older = {k: v for k, v in best.items() if k != "policy"}  # written before checkpoints had one
            save_checkpoint(older, checkpoint_dir(str(tmp_path)) / "best.pt")
            assert evaluate_checkpoint(tmp_path, 1, "best") == got_back  # rebuilt from the run config
            ev.best = 1e9  # the next result is worse: best.pt stays
            ev.newest = actor(h, 4, 8)
            await ev.evaluate()
            assert ckpt(tmp_path, "latest.pt")["eval"]["actor_version"] == 4
            assert ckpt(tmp_path, "best.pt")["eval"]["actor_version"] == 3
            ev.best = -1e9  # and an improvement replaces it
            ev.newest = actor(h, 5, 10)
            await ev.evaluate()
            assert ckpt(tmp_path, "best.pt")["eval"]["actor_version"] == 5
            assert ev.evaluations == 3 and ev.counters()["evaluations"] == 3
    run(body())


def test_close_evaluates_an_unevaluated_newest_version(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path)) as h:
            ev = h.build(Evaluator)
            ev.newest = actor(h, 2, 4)
            await ev.evaluate()
            ev.newest = actor(h, 3, 5)  # not due (every_updates 5000), never evaluated
            await ev.close()
            assert ev.evaluations == 2 and ckpt(tmp_path, "latest.pt")["eval"]["actor_version"] == 3
            again = h.build(Evaluator, "evaluator-2")  # a restart: the record is restored
            assert (again.evaluations, again.evaluated_version, again.best) == (2, 3, ev.best)
            again.newest = actor(h, 3, 5)
            await again.close()
            assert again.evaluations == 2  # version 3 was evaluated already: not again
    run(body())


def test_serve_evaluates_published_weights(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, "eval.every_updates=10")) as h:
            metrics = h.metrics()
            pub = WeightsPublisher(h.channel("weights", binding=True, name="actor_weights"))
            h.start(pub.serve_joins())
            ev = h.build(Evaluator)
            await subscribed(ev, metrics)
            task = h.start(ev.serve())
            pub.publish(actor(h, 1, 4))  # not due yet
            pub.publish(actor(h, 6, 12))
            got = await recv_until(metrics, is_eval, timeout=5)
            assert isinstance(got, EvalResult) and got.actor_version == 6 and ev.evaluations == 1
            await h.stop(ev, task)
    run(body())
