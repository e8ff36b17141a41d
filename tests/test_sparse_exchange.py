"""Sparse networks across the system: weights on the wire, checkpoints, split == fused, the learner services."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from spreeze.common.algorithms.base import fused_step
from spreeze.common.algorithms.build import make_parts
from spreeze.proto.codec import Encoder, decode
from spreeze.common.numpy_policy import NumpyActor
from spreeze.common.policy_export import describe_actor
from spreeze.common.sparse_config import SparseConfig
from spreeze.common.weights import (
    WeightsFollower,
    dense_message,
    sparse_message,
    to_state,
    weights_message,
)
from spreeze.proto.messages import Weights, from_envelope, to_frames
from spreeze.services.actor_learner.main import ActorLearner
from spreeze.services.critic_learner.main import CriticLearner
from spreeze.services.replay.main import Replay
from tests import helpers

from tests.test_sparse import DS, HC_ACT, HC_OBS, CPU, algo_cfg, make_batches, parts

pytestmark = pytest.mark.timeout(30)
torch.set_num_threads(1)


# ------------------------------------------------------------------ wire, checkpoints, fused == split

def wire_bytes(msg: Weights) -> tuple[Weights, int]:
    frames = [bytes(memoryview(f)) for f in to_frames(msg, Encoder("learner"))]
    out = from_envelope(decode(frames))
    assert isinstance(out, Weights)
    return out, sum(len(f) for f in frames)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_sparse_weights_round_trip_with_fewer_bytes(algo: str) -> None:
    a, _ = make_parts(algo, HC_OBS, HC_ACT, -np.ones(HC_ACT), np.ones(HC_ACT),
                      algo_cfg(algo, (64, 64)), CPU, True,
                      sparse=SparseConfig(network="ds", sparsity=0.8))
    state = a.actor_state()
    sparse, n_sparse = wire_bytes(sparse_message("actor", 1, 2, state, set(a.sparse.names)))
    _, n_dense = wire_bytes(dense_message("actor", 1, 2, state))
    assert set(sparse.idx) == set(a.sparse.names) and n_sparse < 0.6 * n_dense
    back = to_state(sparse)
    assert back.keys() == state.keys()
    for k in state:
        np.testing.assert_array_equal(back[k], state[k])
    obs = np.random.default_rng(0).standard_normal((5, HC_OBS)).astype(np.float32)
    policy = describe_actor(a.actor)
    got = NumpyActor(policy, back, -np.ones(HC_ACT), np.ones(HC_ACT)).mean_action(obs)
    ref = NumpyActor(policy, state, -np.ones(HC_ACT), np.ones(HC_ACT)).mean_action(obs)
    np.testing.assert_array_equal(got, ref)
    # weights_message sends sparse only what is smaller that way: never more bytes than dense
    chosen, n_chosen = wire_bytes(weights_message("actor", 1, 2, state, a.sparse.names))
    assert set(chosen.idx) == set(a.sparse.names) and n_chosen == n_sparse
    half = dict(state, **{a.sparse.names[0]: np.ones_like(state[a.sparse.names[0]])})
    assert a.sparse.names[0] not in weights_message("actor", 1, 2, half, a.sparse.names).idx


@pytest.mark.parametrize("shared", [True, False])
def test_save_load_restores_the_topology(shared: bool) -> None:
    batches = make_batches(12)
    a1, c1 = parts("td3", shared=shared)
    helpers.run_split(a1, c1, batches[:6])
    buf = io.BytesIO()
    torch.save({"actor": a1.save(), "critic": c1.save()}, buf)
    helpers.run_split(a1, c1, batches[6:])
    buf.seek(0)
    saved = torch.load(buf)  # weights_only: masks are plain tensors
    a2, c2 = parts("td3", shared=shared, seed=7)
    assert not all(torch.equal(m, n) for m, n in zip(c1.sparse.masks, c2.sparse.masks))
    a2.load(saved["actor"])
    c2.load(saved["critic"])
    assert c2.sparse.adaptations == 3 and a2.sparse.adaptations == 1
    helpers.run_split(a2, c2, batches[6:])
    for p1, p2 in ((a1, a2), (c1, c2)):
        assert all(torch.equal(m, n) for m, n in zip(p1.sparse.masks, p2.sparse.masks))
        assert p1.sparse.adaptations == p2.sparse.adaptations
    assert torch.equal(flat(c1.critic, c1.critic_target), flat(c2.critic, c2.critic_target))
    assert torch.equal(flat(a1.actor, a1.actor_target), flat(a2.actor, a2.actor_target))


def flat(*modules: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for m in modules for p in m.parameters()])


@pytest.mark.parametrize("algo,growth", [("td3", "random"), ("td3", "gradient"), ("sac", "random")])
def test_split_with_exchange_every_update_equals_fused_in_ds_mode(algo: str, growth: str) -> None:
    sp = replace(DS, growth=growth, eta=0.2)
    batches = make_batches(12)
    fa, fc = parts(algo, sp, shared=True)
    for b in batches:
        fused_step(fa, fc, b)
    sa, sc = parts(algo, sp, shared=False)
    helpers.run_split(sa, sc, batches)
    assert fc.sparse.adaptations == 6 and fa.sparse.adaptations == (3 if algo == "td3" else 6)
    for f, s in ((fa, sa), (fc, sc)):
        assert all(torch.equal(m, n) for m, n in zip(f.sparse.masks, s.sparse.masks))
    assert torch.equal(flat(fa.actor), flat(sa.actor))
    assert torch.equal(flat(fc.critic, fc.critic_target), flat(sc.critic, sc.critic_target))
    if algo == "td3":
        assert torch.equal(flat(fa.actor_target), flat(sa.actor_target))
    # the masks really moved, and a different seed draws different ones
    fresh, _ = parts(algo, sp)
    assert not torch.equal(fresh.sparse.masks[1], fa.sparse.masks[1])
    other, _ = parts(algo, sp, seed=1)
    assert not torch.equal(other.sparse.masks[1], fresh.sparse.masks[1])


# ------------------------------------------------------------------ learner services

def test_split_learners_send_sparse_weights(tmp_path: Path) -> None:
    async def body() -> None:
        cfg = helpers.config(tmp_path, "learner.mode=split", "replay.update_to_data=0",
                             "learner.publish_interval=0", "learner.sync_every=2",
                             "sparse.network=ds", "sparse.sparsity=0.8", "sparse.every=2")
        async with helpers.Harness(cfg) as h:
            samplers = WeightsFollower(h.channel("weights", binding=False, name="actor_weights"))
            to_actor = WeightsFollower(h.channel("weights", binding=False, name="critic_sync"))
            replay = h.build(Replay)
            replay.insert(helpers.experience(helpers.layout_of(h.cfg), 64), "sampler-0")
            h.start(replay.serve())
            cl, al = h.build(CriticLearner), h.build(ActorLearner)
            h.start(cl.serve())
            h.start(al.serve())
            await helpers.until(lambda: al.ready and al.actor.updates >= 6, timeout=8,
                                what="actor updates")
            assert al.actor.sparse.adaptations >= 1 and cl.critic.sparse.adaptations >= 1
            assert "sparsity/critic" in cl.losses  # update 0's metrics, published by tick()
            actor = await samplers.wait("actor", 2)
            critic = await to_actor.wait("critic", 2)
            # the 32x3 and 32x4 first layers are dense at 80% overall sparsity: they travel dense
            assert set(actor.idx) == {"net.2.weight"}
            assert set(critic.idx) == {"qf1.2.weight", "qf2.2.weight"}
            low, high = np.array([-2.0]), np.array([2.0])
            NumpyActor(actor.policy, to_state(actor), low, high).act(np.zeros((2, 3), np.float32),
                                                               np.random.default_rng(0), True)
    helpers.run(body(), timeout=12)
