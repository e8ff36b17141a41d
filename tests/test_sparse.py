"""common/sparse*.py: masks, SET / RigL adaptation, target pruning, accounting (the wire, checkpoints and
services: test_sparse_exchange.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from spreeze.common.algorithms.sac import SACConfig
from spreeze.common.algorithms.td3 import TD3Config
from spreeze.common.algorithms.base import fused_step
from spreeze.common.algorithms.build import make_parts
from spreeze.cli.main import parser
from spreeze.cli.train import train_config
from spreeze.common.config import load_config
from spreeze.common.errors import ConfigError
from spreeze.common.sparse import SparseTopology, forward_flops, hidden_layers
from spreeze.common.sparse_config import SparseConfig
from spreeze.common.sparse_masks import drop_indices, split_by_sign, target_densities
from spreeze.common.sparse_stats import overall_sparsity, training_flops_ratio

pytestmark = pytest.mark.timeout(30)
torch.set_num_threads(1)
CPU = torch.device("cpu")
OBS, ACT = 3, 2
LOW, HIGH = np.array([-1.0, -2.0]), np.array([1.0, 2.0])
DS = SparseConfig(network="ds", every=2, sparsity=0.6)  # 32-32 nets are dense at the ER lambdas
HC_OBS, HC_ACT = 17, 6  # HalfCheetah


def algo_cfg(algo: str, hidden: tuple[int, ...] = (32, 32)) -> TD3Config | SACConfig:
    return TD3Config(hidden=hidden) if algo == "td3" else SACConfig(hidden=hidden)


def parts(algo: str = "td3", sparse: SparseConfig = DS, shared: bool = True, seed: int = 0,
          total_updates: int = 0) -> tuple[Any, Any]:
    return make_parts(algo, OBS, ACT, LOW, HIGH, algo_cfg(algo), CPU, shared, seed,
                      sparse=sparse, total_updates=total_updates)


def make_batches(n: int, size: int = 32, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"obs": torch.rand(size, OBS, generator=g) * 2 - 1,
             "action": torch.rand(size, ACT, generator=g) * 2 - 1,
             "reward": torch.randn(size, generator=g),
             "next_obs": torch.rand(size, OBS, generator=g) * 2 - 1,
             "done": torch.zeros(size)} for _ in range(n)]


def hidden_net(n_in: int = 6, n_out: int = 4) -> nn.Sequential:
    """One sparse hidden layer [n_out, n_in] and a dense output layer."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(n_in, n_out), nn.ReLU(), nn.Linear(n_out, 1))


def topology(net: nn.Module, **cfg: Any) -> SparseTopology:
    return SparseTopology(net, SparseConfig(**{"network": "ds", **cfg}), seed=0, role="actor")


def masked(top: SparseTopology) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(w.detach(), m) for w, m in zip(top.weights, top.masks)]


# ------------------------------------------------------------------ config and densities

def test_config_keys_validate_by_name_and_cli_flag_maps(tmp_path: Path) -> None:
    cfg = load_config(None, ["sparse.network=ds", "sparse.lambdas=[7, 64.5]", "sparse.sparsity=0.8"])
    assert cfg.sparse == SparseConfig(network="ds", lambdas=(7.0, 64.5), sparsity=0.8)
    assert type(cfg.sparse.lambdas[0]) is float
    assert cfg.total_updates == cfg.total_steps  # update_to_data 1.0
    for override, named in [("sparse.network=sparse", "sparse.network='sparse'"),
                             ("sparse.eta=1.5", "sparse.eta=1.5"),
                             ("sparse.sparsity=1.0", "sparse.sparsity=1.0"),
                             ("sparse.lambdas=[]", "sparse.lambdas=()"),
                             ("sparse.lambdas=[7, x]", "sparse.lambdas=[7, 'x']"),
                             ("sparse.every=0", "sparse.every=0"),
                             ("sparse.growth=magic", "sparse.growth='magic'"),
                             ("sparse.distribution=uniform", "sparse.distribution='uniform'")]:
        with pytest.raises(ConfigError) as err:
            load_config(None, [override])
        assert named in str(err.value)
    args = parser().parse_args(["train", "--network", "static", "--run-dir", str(tmp_path)])
    assert train_config(args).sparse.network == "static"
    with pytest.raises(SystemExit):
        parser().parse_args(["train", "--network", "lottery"])


def test_er_lambdas_give_about_half_for_halfcheetah_sizes() -> None:
    for algo in ("td3", "sac"):
        a, c = make_parts(algo, HC_OBS, HC_ACT, -np.ones(HC_ACT), np.ones(HC_ACT),
                          algo_cfg(algo, (256, 256)), CPU, True, sparse=SparseConfig(network="static"))
        assert a.sparse.names in (["net.0.weight", "net.2.weight"], ["trunk.0.weight", "trunk.2.weight"])
        assert c.sparse.names == ["qf1.0.weight", "qf1.2.weight", "qf2.0.weight", "qf2.2.weight"]
        for part in (a, c):
            measured = overall_sparsity(part.sparse.layer_stats())
            assert 0.49 < measured < 0.53, (algo, measured)
            assert measured == pytest.approx(part.sparse.sparsity)
        stats = {s.name: s for s in c.sparse.layer_stats()}
        assert stats["qf1.2.weight"].density == 0.5  # lambda 64: 64 * 512 / 256^2
        assert stats["qf1.0.weight"].nnz == (7 * (23 + 256))  # lambda 7 on (obs + act) x 256


@pytest.mark.parametrize("sparsity", [0.5, 0.8, 0.9, 0.95])
def test_requested_sparsity_is_reached_within_one_percent(sparsity: float) -> None:
    a, c = make_parts("td3", HC_OBS, HC_ACT, -np.ones(HC_ACT), np.ones(HC_ACT),
                      algo_cfg("td3", (256, 256)), CPU, True,
                      sparse=SparseConfig(network="static", sparsity=sparsity))
    for part in (a, c):
        assert abs(overall_sparsity(part.sparse.layer_stats()) - sparsity) < 0.01
    # a layer that would need density > 1 is made dense and the scale re-solved
    dens = target_densities([(256, 3), (256, 256)], 0.5)
    assert dens[0] == 1.0 and (768 + dens[1] * 65536) / (768 + 65536) == pytest.approx(0.5)


def test_hidden_layers_are_sparse_and_outputs_dense() -> None:
    a, c = parts("sac", replace(DS, network="static"))
    assert [n for n, _, _ in hidden_layers(a.actor)] == ["trunk.0", "trunk.2"]  # head stays dense
    assert [n for n, _, _ in hidden_layers(c.critic)] == ["qf1.0", "qf1.2", "qf2.0", "qf2.2"]
    assert all(b.count_nonzero() == b.numel() for n, b in c.critic.named_parameters() if "bias" in n)


def test_hidden_layers_are_found_by_module_type_whatever_sits_between() -> None:
    """A normalised residual-style trunk (Linear, LayerNorm, ReLU; Linear, Linear) gets its
    hidden Linear layers masked like an MLP's; the Linear that ends the Sequential stays dense."""
    net = torch.nn.Sequential(torch.nn.Linear(OBS, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, ACT))
    assert [(n, d) for n, _, d in hidden_layers(net)] == [("0", 0), ("3", 1), ("4", 2)]
    topology = SparseTopology(net, replace(DS, sparsity=0.5), 0, "critic")
    assert topology.names == ["0.weight", "3.weight", "4.weight"]
    assert all(w.count_nonzero() < w.numel() for w in topology.weights[1:])  # (the narrow first may stay dense)
    assert net[6].weight.count_nonzero() == net[6].weight.numel()  # the output layer stays dense


def test_dense_network_builds_no_topology() -> None:
    for sparse in (None, SparseConfig()):
        a, c = make_parts("td3", OBS, ACT, LOW, HIGH, algo_cfg("td3"), CPU, True, sparse=sparse)
        assert a.sparse is None and c.sparse is None
        assert set(c.update(make_batches(1)[0])) == {"critic_loss", "q_mean"}


# ------------------------------------------------------------------ masking and adaptation

@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_masked_weights_are_zero_after_steps_while_gradients_are_dense(algo: str) -> None:
    a, c = parts(algo, replace(DS, every=3))
    for b in make_batches(7):
        fused_step(a, c, b)
        for part in (a, c):
            for w, m in masked(part.sparse):
                assert torch.all(w[m == 0] == 0)
    for part in (a, c):
        assert part.sparse.adaptations >= 1
        sparse_layers = [(w, m) for w, m in zip(part.sparse.weights, part.sparse.masks) if m.min() == 0]
        assert sparse_layers  # (a 32x3 first layer is dense at 60% overall sparsity)
        for w, m in sparse_layers:
            assert w.grad is not None and w.grad[m == 0].count_nonzero() > 0  # dense gradient


def test_connection_count_constant_across_many_adaptations() -> None:
    net = hidden_net(20, 30)
    top = topology(net, sparsity=0.7, eta=0.2)
    opt = torch.optim.Adam(net.parameters())
    count = int(top.masks[0].sum())
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        with torch.no_grad():
            top.weights[0].add_(torch.randn(30, 20, generator=g) * 0.1)
        top.apply()
        top.adapt(opt)
        assert int(top.masks[0].sum()) == count == top.counts[0]
        assert top.last["dropped"] == top.last["grown"] == round(0.2 * count)
        assert torch.all(top.weights[0].detach()[top.masks[0] == 0] == 0)
    assert top.adaptations == 200 and 0 <= top.last["survival"] <= 1


def test_drop_picks_the_smallest_magnitudes_per_sign() -> None:
    w = torch.tensor([[0.9, -0.01, 0.02, -0.3], [0.005, -0.2, 0.5, -0.04], [0.0, 0.3, -7.0, 0.001]])
    mask = torch.ones_like(w)
    mask[2, 3] = 0.0  # the smallest positive, but not active: never dropped
    got = sorted(drop_indices(w, mask, 4).tolist())
    # positives (0 counts as the smallest): 0.0 @ 8, 0.005 @ 4; negatives: -0.01 @ 1, -0.04 @ 7
    assert got == [1, 4, 7, 8]
    assert sorted(drop_indices(w, mask, 3).tolist()) == [1, 4, 8]  # odd: the extra one non-negative
    assert split_by_sign(6, 1, 10) == (1, 5) and split_by_sign(6, 10, 2) == (4, 2)


def hand_layer() -> tuple[SparseTopology, torch.optim.Adam]:
    """A 4x6 layer with 12 connections, 7 positive and 5 negative; Adam state populated."""
    net = hidden_net(6, 4)
    top = topology(net, eta=1 / 3, growth="gradient")
    opt = torch.optim.Adam(net.parameters())
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # Adam state exists, non-zero everywhere
    w = torch.tensor([[0.5, 0.0, -0.1, 0.0, 0.02, 0.0],
                      [0.0, -0.03, 0.0, 0.7, 0.0, -0.9],
                      [0.04, 0.0, 0.3, 0.0, -0.05, 0.0],
                      [0.0, 0.6, 0.0, -0.2, 0.0, 0.01]])
    with torch.no_grad():
        top.weights[0].copy_(w)
    top.set_mask(0, w != 0)
    grad = torch.full((4, 6), 0.1)
    grad[0, 1], grad[3, 0], grad[2, 3], grad[1, 0] = 5.0, -4.0, 3.0, 2.5  # empty: grown here
    grad[3, 5], grad[0, 0] = 100.0, 50.0  # to be dropped / active: never grown
    top.weights[0].grad = grad
    return top, opt


def test_one_adaptation_on_a_hand_made_4x6_layer() -> None:
    top, opt = hand_layer()
    before = top.masks[0].clone()
    assert top.counts[0] == 12
    stats = top.adapt(opt)
    # dropped: 0.01 (3,5) and 0.02 (0,4) of the positives, -0.03 (1,1) and -0.05 (2,4) of the
    # negatives (0.04 survives although |-0.03| < 0.04 < |-0.05|: half per sign); grown where
    # |grad| is largest among the previously empty positions
    after = before.clone()
    for r, col in [(3, 5), (0, 4), (1, 1), (2, 4)]:
        after[r, col] = 0.0
    for r, col in [(0, 1), (3, 0), (2, 3), (1, 0)]:
        after[r, col] = 1.0
    assert torch.equal(top.masks[0], after)
    expected = torch.tensor([[0.5, 0.0, -0.1, 0.0, 0.0, 0.0],
                             [0.0, 0.0, 0.0, 0.7, 0.0, -0.9],
                             [0.04, 0.0, 0.3, 0.0, 0.0, 0.0],
                             [0.0, 0.6, 0.0, -0.2, 0.0, 0.0]])
    assert torch.equal(top.weights[0].detach(), expected)  # regrown ones start at 0
    assert stats["dropped"] == stats["grown"] == 4
    assert stats["dropped_abs_w"] == pytest.approx((0.01 + 0.02 + 0.03 + 0.05) / 4)


def test_adam_state_zeroed_exactly_at_changed_positions() -> None:
    top, opt = hand_layer()
    state = opt.state[top.weights[0]]
    before = {k: state[k].clone() for k in ("exp_avg", "exp_avg_sq")}
    old = top.masks[0].clone()
    top.adapt(opt)
    changed = old != top.masks[0]
    assert int(changed.sum()) == 8
    for k, v in before.items():
        assert torch.all(state[k][changed] == 0) and torch.all(v[changed] != 0)
        assert torch.equal(state[k][~changed], v[~changed])


def test_random_regrowth_only_into_previously_empty_positions() -> None:
    net = hidden_net(40, 50)
    top = topology(net, sparsity=0.6, eta=0.3)
    opt = torch.optim.Adam(net.parameters())
    g = torch.Generator().manual_seed(2)
    for _ in range(20):
        with torch.no_grad():
            top.weights[0].add_(torch.randn(50, 40, generator=g))
        top.apply()
        old = top.masks[0].clone()
        top.adapt(opt)
        grown = (old == 0) & (top.masks[0] == 1)
        dropped = (old == 1) & (top.masks[0] == 0)
        assert int(grown.sum()) == int(dropped.sum()) == round(0.3 * top.counts[0])
        assert torch.all(top.weights[0].detach()[grown] == 0)
        assert torch.equal(top.grown[0].view(50, 40), grown)  # none of them was just dropped


def test_gradient_growth_picks_the_largest_dense_gradients() -> None:
    net = hidden_net(30, 20)
    top = topology(net, sparsity=0.5, eta=0.1, growth="gradient")
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(8, 30)).square().sum().backward()
    grad = top.weights[0].grad
    assert grad is not None
    old = top.masks[0].clone()
    n = round(0.1 * top.counts[0])
    expected = torch.where(old == 0, grad.abs(), -1.0).view(-1).topk(n).indices
    top.adapt(opt)
    grown = ((old == 0) & (top.masks[0] == 1)).view(-1).nonzero().squeeze(1)
    assert sorted(grown.tolist()) == sorted(expected.tolist())


def test_target_pruned_to_the_online_count_after_polyak() -> None:
    a, c = parts("td3", replace(DS, every=1, eta=0.3))
    for b in make_batches(10):
        fused_step(a, c, b)
    for top in (a.sparse, c.sparse):
        assert top.adaptations >= 5
        for t, k in zip(top.targets, top.counts):
            assert 0 < int(t.count_nonzero()) <= k
    # prune_target keeps exactly the k largest magnitudes of a dense target
    top = c.sparse
    with torch.no_grad():
        for t in top.targets:
            t.copy_(torch.randn_like(t))
    dense = [t.detach().clone() for t in top.targets]
    top.target_dirty = True
    top.prune_target()
    for t, d, k in zip(top.targets, dense, top.counts):
        assert int(t.count_nonzero()) == k
        kept = d.abs().view(-1).topk(k).values.min()
        assert torch.all(d.abs()[t != 0] >= kept) and torch.equal(t[t != 0], d[t != 0])
    assert top.target_dirty  # the random target lies outside the mask: keep pruning
    with torch.no_grad():
        for t, w in zip(top.targets, top.weights):
            t.copy_(w)
    for _ in range(8):  # inside the mask again: noticed at the next alignment check
        top.prune_target()
    assert not top.target_dirty


def test_static_masks_never_change_and_target_stays_inside() -> None:
    a, c = parts("td3", replace(DS, network="static", every=1))
    masks = [m.clone() for m in c.sparse.masks]
    for b in make_batches(6):
        fused_step(a, c, b)
    assert all(torch.equal(m, n) for m, n in zip(masks, c.sparse.masks))
    assert c.sparse.adaptations == 0 and not c.sparse.target_dirty
    for t, m in zip(c.sparse.targets, c.sparse.masks):
        assert torch.all(t[m == 0] == 0)


def test_topology_frozen_at_the_end_of_the_budget() -> None:
    # 10 critic updates budget, last 4 frozen: critic adapts at 2 and 4 (6 >= 10 - 4 is frozen);
    # the TD3 actor counts in critic updates (x policy_delay 2): adapts at actor update 2 only
    sp = replace(DS, every=2, freeze_last=4)
    a, c = parts("td3", sp, total_updates=10)
    assert not c.sparse.frozen(5) and c.sparse.frozen(6) and a.sparse.frozen(3)
    for b in make_batches(6):
        fused_step(a, c, b)
    masks = [m.clone() for m in (*a.sparse.masks, *c.sparse.masks)]
    for b in make_batches(6, seed=1):
        fused_step(a, c, b)
    assert (c.sparse.adaptations, a.sparse.adaptations) == (2, 1)
    assert all(torch.equal(m, n) for m, n in zip(masks, (*a.sparse.masks, *c.sparse.masks)))


# ------------------------------------------------------------------ accounting and metrics

def test_flops_counting_follows_rigl() -> None:
    net = hidden_net(100, 100)
    dense, sparse = forward_flops(net, {"0.weight": 2500})
    assert (dense, sparse) == (10_100, 2_600)  # output layer 100 x 1 stays dense
    assert training_flops_ratio(dense, sparse) == pytest.approx(2600 / 10100)
    rigl = training_flops_ratio(dense, sparse, rigl_every=100)
    assert rigl == pytest.approx((3 * 2600 + (10100 - 2600) / 100) / (3 * 10100))
    _, c = make_parts("td3", HC_OBS, HC_ACT, -np.ones(HC_ACT), np.ones(HC_ACT),
                      algo_cfg("td3", (256, 256)), CPU, True, sparse=SparseConfig(network="ds"))
    assert 0.45 < c.sparse.flops_ratio < 0.55  # the paper: about half the training FLOPs


def test_metrics_only_when_wanted() -> None:
    a, c = parts("td3", replace(DS, every=1))
    b = make_batches(2)
    assert c.update(b[0], want_metrics=False) == {}
    got = fused_step(a, c, b[1])  # critic update 2, actor update 1: every=1 adapts both
    for role in ("actor", "critic"):
        assert 0 < got[f"sparsity/{role}"] < 1 and 0 < got[f"flops_ratio/{role}"] < 1
        assert got[f"topology/{role}/dropped"] > 0
    assert (got["topology/critic/adaptations"], got["topology/actor/adaptations"]) == (2.0, 1.0)
    assert 0 <= got["topology/critic/survival"] <= 1
    assert "topology/actor/survival" not in got  # no previous round yet
