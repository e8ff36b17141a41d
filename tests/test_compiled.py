"""Compiled update steps (common/algorithms/steps.py) against the eager parts, the reference.

Tiny networks and batches: compile time, not arithmetic, is what these tests pay for. The
kernels land in a per-module cache directory, so each graph compiles once per session.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from spreeze.common.algorithms import ALGOS, algorithm
from spreeze.common.algorithms.sac import SACConfig
from spreeze.common.algorithms.td3 import TD3Config
from spreeze.common.algorithms.base import fused_step
from spreeze.common.algorithms.build import make_parts
from spreeze.common.sparse_config import SparseConfig
from spreeze.common.algorithms.compiled import CompileOptions, check_guards, use_compile_cache
from tests.helpers import needs_cxx

pytestmark = needs_cxx

OBS, ACT, B = 5, 2, 16
LOW, HIGH = -2.0 * np.ones(ACT, np.float32), 2.0 * np.ones(ACT, np.float32)
UPDATES = 24
ATOL = 2e-4  # Adam turns rounding differences in near-zero gradients into lr-sized steps


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    use_compile_cache(tmp_path_factory.mktemp("compile-cache"))


def test_compile_cache_is_the_setting_unless_the_user_set_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from spreeze.common.algorithms.compiled import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, default_cache_dir())  # what importing torch._dynamo leaves there
    assert use_compile_cache(tmp_path / "setting") == tmp_path / "setting" and (tmp_path / "setting").is_dir()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "users"))
    assert use_compile_cache(tmp_path / "setting") == tmp_path / "users"
    assert os.environ[CACHE_ENV] == str(tmp_path / "users")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    # Each part's step is its own closure of one code object; dynamo keeps at most
    # recompile_limit (8) of them per code object. A learner process builds one per role.
    torch._dynamo.reset()


def _cfg(algo: str) -> TD3Config | SACConfig:
    cfg: TD3Config | SACConfig = algorithm(algo).config(hidden=(16, 16))
    return cfg


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))


def _parts(algo: str, shared: bool = True, sparse: SparseConfig | None = None, compiled: bool = False,
           device: str = "cpu"):
    actor, critic = make_parts(algo, OBS, ACT, LOW, HIGH, _cfg(algo), torch.device(device), shared, 3,
                               sparse=sparse)
    if compiled:
        actor.compile(CompileOptions())
        critic.compile(CompileOptions())
    return actor, critic


def _batches(n: int = 4, device: str = "cpu") -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [{k: v.to(device) for k, v in {
        "obs": torch.randn(B, OBS, generator=g), "action": torch.rand(B, ACT, generator=g) * 4 - 2,
        "reward": torch.randn(B, generator=g), "next_obs": torch.randn(B, OBS, generator=g),
        "done": (torch.rand(B, generator=g) < 0.2).float()}.items()} for _ in range(n)]


def _tensors(actor, critic) -> dict[str, torch.Tensor]:
    out = {f"actor.{k}": v for k, v in actor.actor.state_dict().items()}
    out.update({f"critic.{k}": v for k, v in critic.critic.state_dict().items()})
    if getattr(critic, "critic_target", None) is not None:  # CrossQ keeps none
        out.update({f"critic_target.{k}": v for k, v in critic.critic_target.state_dict().items()})
    if getattr(actor, "actor_target", None) is not None:
        out.update({f"actor_target.{k}": v for k, v in actor.actor_target.state_dict().items()})
    if getattr(actor, "log_alpha", None) is not None:
        out["log_alpha"] = actor.log_alpha.detach()
    return out


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = ATOL) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-3, msg=lambda m, k=k: f"{k}: {m}")


def _compiles(*parts) -> list[int]:
    return [p.fast.step.compiles for p in parts]


SLOW_SAC = pytest.param("sac", marks=pytest.mark.slow)  # the same machinery as TD3's, in the slow suite


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("algo", ["td3", SLOW_SAC])
def test_compiled_agrees_with_eager_over_many_updates(algo: str, device: str) -> None:
    """On CUDA the compiled steps are captured as CUDA graphs (CompileOptions' default)."""
    eager, fast = _parts(algo, device=device), _parts(algo, compiled=True, device=device)
    batches = _batches(device=device)
    for i in range(UPDATES):
        m_eager = fused_step(*eager, batches[i % len(batches)])
        m_fast = fused_step(*fast, batches[i % len(batches)])
    assert m_eager.keys() == m_fast.keys()
    for k in m_eager:
        assert m_fast[k] == pytest.approx(m_eager[k], rel=1e-3, abs=1e-3), k
    _assert_close(_tensors(*eager), _tensors(*fast))
    assert (fast[0].updates, fast[1].updates) == (eager[0].updates, eager[1].updates)
    assert _compiles(*fast) == [1, 1]  # one graph each, TD3's Polyak and no-Polyak updates alike
    if device == "cuda":
        assert all(len(p.fast.step.graphs) == 1 for p in fast)  # one capture each, replayed since


def test_warm_up_compiles_without_changing_state() -> None:
    actor, critic = _parts("sac", compiled=True)
    before = {k: v.clone() for k, v in _tensors(actor, critic).items()}
    gen = critic.generator.get_state()
    batch = _batches(1)[0]
    assert critic.fast.warm_up(batch) > 0 and actor.fast.warm_up(batch) > 0
    assert _compiles(actor, critic) == [1, 1]
    _assert_close(before, _tensors(actor, critic), atol=0.0)
    assert torch.equal(gen, critic.generator.get_state())
    assert all(float(s["step"]) == 0.0 for s in critic.opt.state.values())
    # ... and the first real update is the eager one's first update
    eager = _parts("sac")
    fused_step(*eager, batch)
    fused_step(actor, critic, batch)
    _assert_close(_tensors(*eager), _tensors(actor, critic))
    assert _compiles(actor, critic) == [1, 1]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS)  # every built-in: its compiled step comes from its own update functions
def test_compiled_split_equals_compiled_fused(algo: str) -> None:
    fused = _parts(algo, compiled=True)
    actor, critic = _parts(algo, shared=False, compiled=True)
    for batch in _batches(6):
        fused_step(*fused, batch)
        critic.update(batch)
        actor.load_critic(critic.critic_state())
        if critic.updates % actor.policy_delay == 0:
            actor.update(batch)
            critic.load_actor(actor.actor_state(), actor.target_actor_state(), actor.extras())
    _assert_close(_tensors(*fused), _tensors(actor, critic), atol=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("growth", ["random", "gradient"])
def test_sparse_topology_updates_do_not_recompile(growth: str) -> None:
    sparse = SparseConfig(network="ds", sparsity=0.5, every=4, growth=growth)
    eager, fast = _parts("td3", sparse=sparse), _parts("td3", sparse=sparse, compiled=True)
    for i in range(UPDATES):
        batch = _batches()[i % 4]
        fused_step(*eager, batch)
        fused_step(*fast, batch)
    assert fast[1].sparse.adaptations >= 5 and fast[0].sparse.adaptations >= 2
    assert _compiles(*fast) == [1, 1]
    for e, f in zip((eager[0].sparse, eager[1].sparse), (fast[0].sparse, fast[1].sparse)):
        for me, mf in zip(e.masks, f.masks):
            assert torch.equal(me, mf)
    _assert_close(_tensors(*eager), _tensors(*fast))
    for w, m in zip(fast[1].sparse.weights, fast[1].sparse.masks):
        assert not w[m == 0].any()  # masked weights stay zero inside the compiled step


def test_checkpoint_load_keeps_compiled_step() -> None:
    actor, critic = _parts("td3", compiled=True)
    batches = _batches()
    for b in batches:
        fused_step(actor, critic, b)
    saved = (actor.save(), critic.save())
    eager = _parts("td3")
    eager[0].load(saved[0])
    eager[1].load(saved[1])
    for b in batches:  # move on, then go back to the checkpoint
        fused_step(actor, critic, b)
    actor.load(saved[0])
    critic.load(saved[1])
    for b in batches:
        fused_step(*eager, b)
        fused_step(actor, critic, b)
    _assert_close(_tensors(*eager), _tensors(actor, critic))
    assert _compiles(actor, critic) == [1, 1]


@pytest.mark.parametrize("algo", ["td3", SLOW_SAC])
def test_compiled_shadows_take_over_eager_parts_mid_run(algo: str) -> None:
    """What a learner does on its first compile: fresh parts compile while the live ones
    update eagerly, then load the live state and train on, as the eager parts would have."""
    live, reference = _parts(algo), _parts(algo)
    shadows = _parts(algo, compiled=True)
    batches = _batches()
    for part in shadows:
        part.fast.warm_up(batches[0])
    for i in range(7):  # an odd count: TD3's policy delay is mid-cycle at the hand-over
        fused_step(*live, batches[i % len(batches)])
        fused_step(*reference, batches[i % len(batches)])
    for shadow, part in zip(shadows, live):
        shadow.load(part.save())
    for i in range(UPDATES):
        m_ref = fused_step(*reference, batches[i % len(batches)])
        m_fast = fused_step(*shadows, batches[i % len(batches)])
    assert m_fast.keys() == m_ref.keys()
    _assert_close(_tensors(*reference), _tensors(*shadows))
    assert [p.updates for p in shadows] == [p.updates for p in reference]
    assert _compiles(*shadows) == [1, 1]


def test_compile_disabled_keeps_eager_update() -> None:
    actor, critic = _parts("td3")
    actor.compile(CompileOptions(enabled=False))
    critic.compile(CompileOptions(enabled=False))
    assert actor.fast is None and critic.fast is None


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_guards_off_after_compile_still_agree_with_eager_across_batch_sizes(algo: str) -> None:
    """The learner's order: compile with guards on, updates with them off; a new batch size
    compiles with guards on again, after which both cached graphs run with guards off."""
    eager, fast = _parts(algo), _parts(algo, compiled=True)
    small, large = _batches(3), [{k: torch.cat([v, v]) for k, v in b.items()} for b in _batches(3)]
    try:
        for part in fast:
            part.fast.warm_up(small[0])
        check_guards(False)
        for phase in (small, large, small):
            if phase is large:
                check_guards(True)
                for part in fast:
                    part.fast.warm_up(large[0])
                check_guards(False)
            for batch in phase:
                fused_step(*eager, batch)
                fused_step(*fast, batch)
    finally:
        check_guards(True)
    _assert_close(_tensors(*eager), _tensors(*fast))
    assert _compiles(*fast) == [2, 2]  # one graph per batch size, none made with guards off



def test_guards_stay_on_while_any_compile_runs() -> None:
    # two learners in one process (the tests' harness): one turning its guards off must not
    # do so under the other's compile, which needs them
    from torch._dynamo.eval_frame import _is_skip_guard_eval_unsafe_stance as guards_off
    from spreeze.common.algorithms.compiled import compiling
    try:
        with compiling():
            check_guards(False)
            assert not guards_off()
            with compiling():
                pass
            assert not guards_off()
        assert guards_off()  # the last compile ended: as asked
        check_guards(True)
        with compiling():
            assert not guards_off()
        assert not guards_off()
    finally:
        check_guards(True)


def test_the_vector_instruction_check_runs_once_per_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import torch._inductor.config as inductor_config
    from spreeze.common.algorithms.compiled import CACHE_ENV, VEC_ISA_FILE, settle_vec_isa
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    before = inductor_config.cpp.vec_isa_ok  # (monkeypatch would delete inductor's config entry on undo)
    record = tmp_path / VEC_ISA_FILE
    try:
        inductor_config.cpp.vec_isa_ok = None
        assert settle_vec_isa() == "checked"  # x86 with g++: every set the CPU has builds and loads
        facts = json.loads(record.read_text())
        assert facts["torch"] == torch.__version__ and facts["cpu"] and inductor_config.cpp.vec_isa_ok is True
        inductor_config.cpp.vec_isa_ok = None  # a later start with this cache
        assert settle_vec_isa() == "trusted" and inductor_config.cpp.vec_isa_ok is True
        for stale in (json.dumps({**facts, "torch": "0.0"}), "{not json"):  # another torch; a torn write
            record.write_text(stale)
            inductor_config.cpp.vec_isa_ok = None
            assert settle_vec_isa() == "checked" and json.loads(record.read_text()) == facts
    finally:
        inductor_config.cpp.vec_isa_ok = before
