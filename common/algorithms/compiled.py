"""Compiled update steps: the machinery shared by the TD3 and SAC steps (common/algorithms/steps.py).

A compiled step is one Python function of the batch that does a whole update in place:
forward, gradient (``torch.func.grad``, so there is no autograd graph break), Adam,
re-masking of sparse weights and the Polyak update of the targets. Being one graph, it
compiles with ``fullgraph=True``:

- CPU: ``torch.compile`` (inductor, C++ kernels). The per-operation dispatch that bounds a
  small network's eager update is what it removes.
- CUDA: the compiled function is captured as a CUDA graph (explicit capture, one per batch
  shape) with static input buffers: each update copies the batch columns and the noise into
  them and replays the graph, one launch for the whole update.

Everything a step mutates stays at a fixed address (parameters, targets, Adam moments, the
step counters, masks), so neither a topology update of a sparse network nor a checkpoint
load recompiles or re-captures: they write into the same tensors. The parts' eager
``update`` stays the reference (``learner.compile=false``); a compiled part agrees with it
within float tolerance (tests/test_compiled.py).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from spreeze.common.sparse import SparseTopology

WARMUP_CALLS = 2  # calls of each step in the warm-up: the first compiles, the second proves no recompile
CUDA_SIDE_CALLS = 3  # side-stream calls before a CUDA graph capture (cuBLAS handles, allocator, autotune)
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # where inductor keeps compiled kernels and its FX graph cache
VEC_ISA_FILE = "spreeze-vec-isa.json"  # in that cache: the vector instruction sets that passed inductor's check

Tensors = list[torch.Tensor]


@dataclass(frozen=True)
class CompileOptions:
    """How a part runs its update: eager (reference), compiled, compiled + CUDA graph."""

    enabled: bool = True  # torch.compile the step (False: the parts' eager update)
    cuda_graphs: bool = True  # on a CUDA device, capture the compiled step as a CUDA graph


def check_guards(on: bool) -> None:
    """Whether calls of compiled steps in this process evaluate dynamo's guards.

    A guard re-checks, on every call, everything a graph was specialised on: some 70
    captured tensors per step (parameters, targets, Adam moments), about a tenth of a 64-64
    TD3 update on CPU. Nothing they check ever changes between our calls (everything a step
    mutates stays at its address, and the tests count no recompile after the first), so once
    a learner's steps are compiled it turns them off, and on again before compiling for a
    new batch size (a graph is only ever made with guards on; with several cached graphs
    the shape guards that tell them apart are still evaluated). The switch is process-wide
    (``torch.compiler.set_stance``): while a step compiles in any thread (`compiling`), the
    guards stay on and are turned off when the last compile ends, so several learners in one
    process (the tests' harness) cannot turn them off under each other's compiles.
    """
    global _guards_off
    with _STANCE_LOCK:
        _guards_off = not on
        _apply_stance()


_STANCE_LOCK = threading.Lock()
_guards_off = False  # what the updating threads asked for (check_guards)
_compiles_running = 0  # compiles in flight in this process (they need the guards)


def _apply_stance() -> None:
    torch.compiler.set_stance("default", skip_guard_eval_unsafe=_guards_off and _compiles_running == 0)


@contextmanager
def compiling() -> Iterator[None]:
    """Around a compile: the guards are on while it runs (see `check_guards`)."""
    global _compiles_running
    with _STANCE_LOCK:
        _compiles_running += 1
        _apply_stance()
    try:
        yield
    finally:
        with _STANCE_LOCK:
            _compiles_running -= 1
            _apply_stance()


def compile_cache_dir(setting: str, run_dir: str | Path) -> Path:
    """The directory ``learner.compile_cache`` names: ``user`` (shared by runs), ``run``, or a path."""
    if setting == "user":
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(base) / "spreeze" / "torch-compile"
    if setting == "run":
        return Path(run_dir) / "compile-cache"
    return Path(setting).expanduser()


def use_compile_cache(path: str | Path) -> Path:
    """Point inductor's on-disk caches (kernels, FX graphs) at ``path``, unless the user set
    TORCHINDUCTOR_CACHE_DIR. Call before the first compile; a second run starts warm.

    Importing ``torch._dynamo`` sets TORCHINDUCTOR_CACHE_DIR to torch's default (a folder in
    /tmp) when it is unset, so that value counts as unset: only another one is the user's."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    current = os.environ.get(CACHE_ENV)
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ[CACHE_ENV] = str(Path(path).expanduser().absolute())
    chosen = Path(os.environ[CACHE_ENV])
    chosen.mkdir(parents=True, exist_ok=True)
    import torch._inductor.config as inductor_config
    inductor_config.fx_graph_cache = True
    return chosen


def settle_vec_isa() -> str:
    """Spare inductor its vector-instruction check where it already passed on this machine.

    Before its first CPU kernel, inductor checks each vector instruction set the CPU has
    (AVX2, AVX-512, ...): a dry compile and a child Python loading the result, per set.
    That is 7-12 s of a first compile on 2 cores and 1.5 s of every later start (the kernels
    come from the cache, the check does not). Here the check runs once, its sets in
    parallel, and when every set the CPU has passed, that is recorded in the compile cache
    (VEC_ISA_FILE) with what it depends on (torch's version, the compiler, the CPU's sets)
    and inductor is told (``cpp.vec_isa_ok``) instead of checking; a later start that finds
    the same record tells it at once. Both starts compile with the same setting, so the
    second finds the first's kernels. Where a set fails (a compiler without AVX-512, say),
    inductor keeps checking for itself. Returns what it did: trusted (from the record),
    checked (and recorded), or unchanged (not x86, or a set failed).
    """
    import torch._inductor.config as inductor_config
    from torch._inductor import cpu_vec_isa
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if inductor_config.cpp.vec_isa_ok is not None:
        return "trusted" if inductor_config.cpp.vec_isa_ok else "unchanged"
    try:
        cpu_sets = cpu_vec_isa.x86_isa_checker()
        compiler = shutil.which(get_cpp_compiler()) or get_cpp_compiler()
    except Exception:  # noqa: BLE001 - not x86, or inductor's internals moved: let it check itself
        return "unchanged"
    facts = {"torch": torch.__version__, "compiler": compiler, "cpu": sorted(cpu_sets)}
    record = Path(os.environ.get(CACHE_ENV) or default_cache_dir()) / VEC_ISA_FILE
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = None
    if known != facts:
        wanted = [isa for isa in cpu_vec_isa.supported_vec_isa_list if all(f in cpu_sets for f in str(isa).split())]
        checks = [threading.Thread(target=bool, args=(isa,), daemon=True) for isa in wanted]
        for t in checks:
            t.start()
        for t in checks:
            t.join()
        if not wanted or not all(wanted):  # bool(isa) is cached: the checks just made
            return "unchanged"
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps(facts))
        except OSError:
            pass  # checked again next start
    inductor_config.cpp.vec_isa_ok = True
    return "checked" if known != facts else "trusted"


class AdamState:
    """``torch.optim.Adam``'s per-parameter state (step, exp_avg, exp_avg_sq), created now and
    kept at fixed addresses so a compiled step or a captured graph updates it in place.

    The optimizer still owns the state: checkpoints (``opt.state_dict()``), the sparse
    topology's slot resets and an eager ``opt.step()`` all see the same tensors.
    """

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        group = opt.param_groups[0]
        if len(opt.param_groups) != 1 or group.get("amsgrad") or group.get("maximize"):
            raise ValueError("compiled Adam supports one param group without amsgrad/maximize")
        self.opt = opt
        self.params: Tensors = list(group["params"])
        self.lr, (self.beta1, self.beta2) = float(group["lr"]), group["betas"]
        self.eps, self.weight_decay = float(group["eps"]), float(group["weight_decay"])
        for p in self.params:
            state = opt.state[p]
            if not state:  # what Adam's first step would create
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        self.steps = [opt.state[p]["step"] for p in self.params]
        self.exp_avg = [opt.state[p]["exp_avg"] for p in self.params]
        self.exp_avg_sq = [opt.state[p]["exp_avg_sq"] for p in self.params]

    def rebind(self) -> None:
        """After ``opt.load_state_dict`` (new tensors): copy the loaded values into ours and
        point the optimizer back at them."""
        with torch.no_grad():
            for i, p in enumerate(self.params):
                state = self.opt.state[p]
                for key, mine in (("step", self.steps), ("exp_avg", self.exp_avg),
                                  ("exp_avg_sq", self.exp_avg_sq)):
                    if key in state and state[key] is not mine[i]:
                        mine[i].copy_(state[key])
                    state[key] = mine[i]

    def tensors(self) -> Tensors:
        return [*self.steps, *self.exp_avg, *self.exp_avg_sq]

    def update_(self, grads: Sequence[torch.Tensor]) -> None:
        """One Adam step of every parameter (the formula of torch.optim.Adam), in place."""
        torch._foreach_add_(self.steps, 1.0)
        step = self.steps[0].double()
        step_size = (self.lr / (1.0 - self.beta1 ** step)).float()
        bc2_sqrt = (1.0 - self.beta2 ** step).sqrt().float()
        for p, g, m, v in zip(self.params, grads, self.exp_avg, self.exp_avg_sq):
            if self.weight_decay:
                g = g + self.weight_decay * p
            m.lerp_(g, 1.0 - self.beta1)
            v.mul_(self.beta2).addcmul_(g, g, value=1.0 - self.beta2)
            p.sub_(step_size * m / (v.sqrt() / bc2_sqrt + self.eps))


class Trained:
    """What one step trains in place: a network's parameters, their Adam state, the target
    copies (Polyak), the sparse masks (re-applied after Adam) and, for RigL gradient growth,
    the dense gradient kept in each parameter's ``.grad``."""

    def __init__(self, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer,
                 targets: Sequence[torch.Tensor] = (), sparse: SparseTopology | None = None) -> None:
        self.params, self.adam, self.targets = list(params), AdamState(opt), list(targets)
        index = {id(p): i for i, p in enumerate(self.params)}
        self.masked = [(index[id(w)], m) for w, m in zip(sparse.weights, sparse.masks)] if sparse else []
        keep_grads = sparse is not None and sparse.cfg.dynamic and sparse.cfg.growth == "gradient"
        self.grads = [torch.zeros_like(p) for p in self.params] if keep_grads else []
        for p, g in zip(self.params, self.grads):
            p.grad = g

    def inputs(self) -> Tensors:
        """The parameters as gradient inputs (aliases without autograd history)."""
        return [p.detach() for p in self.params]

    def apply_(self, grads: Sequence[torch.Tensor], tau: torch.Tensor | None) -> None:
        """Adam, re-mask, keep the gradient (RigL), Polyak toward the new weights (``tau``)."""
        self.adam.update_(grads)
        for i, mask in self.masked:
            self.params[i].mul_(mask)
        for buf, g in zip(self.grads, grads):
            buf.copy_(g)
        if tau is not None:
            for t, p in zip(self.targets, self.params):
                t.lerp_(p, tau)

    def mutated(self) -> Tensors:
        return [*self.params, *self.targets, *self.adam.tensors(), *self.grads]


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: Tensors
    outputs: tuple[torch.Tensor, ...]


class CompiledStep:
    """``fn(*inputs) -> tuple of 0-dim tensors``, compiled; on CUDA captured as CUDA graphs.

    ``mutated``: every tensor ``fn`` writes, restored after warm-up calls and captures so
    they leave no trace. ``compiles`` counts graphs handed to inductor (1 after the first
    call; more means a recompile) and ``compile_s`` the seconds of warm-ups and captures.
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]], mutated: Tensors,
                 device: torch.device, options: CompileOptions) -> None:
        self.fn, self.mutated, self.device = fn, mutated, device
        self.compiles, self.compile_s = 0, 0.0
        self.run = torch.compile(fn, backend=self._backend, fullgraph=True, dynamic=False)
        self.graphs: dict[tuple[tuple[int, ...], ...], _Captured] | None = (
            {} if device.type == "cuda" and options.cuda_graphs else None)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        from torch._inductor.compile_fx import compile_fx
        self.compiles += 1
        # CPU: the graph's wrapper in C++ too, not Python calling ~50 small kernels (about 10 %
        # of a 64-64 update); CUDA: the captured graph already removes the launch overhead.
        patches = {"cpp_wrapper": True} if self.device.type == "cpu" else {}
        return cast(Callable[..., object], compile_fx(gm, example_inputs, config_patches=patches))

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.graphs is None:
            return self.run(*inputs)
        key = self._key(inputs)
        captured = self.graphs.get(key)
        if captured is None:
            captured = self.graphs[key] = self._capture(inputs)
        for static, t in zip(captured.inputs, inputs):
            static.copy_(t, non_blocking=True)
        captured.graph.replay()
        return captured.outputs

    def warm_up(self, *inputs: torch.Tensor) -> float:
        """Compile (on CUDA: compile and capture) for these input shapes, changing no state;
        returns the seconds it took."""
        t0 = time.perf_counter()
        if self.device.type == "cpu":
            settle_vec_isa()
        with compiling():
            if self.graphs is None:
                saved = self._snapshot()
                try:
                    for _ in range(WARMUP_CALLS):
                        self.run(*inputs)
                finally:
                    self._restore(saved)
                self.compile_s += time.perf_counter() - t0
            elif self._key(inputs) not in self.graphs:
                self.graphs[self._key(inputs)] = self._capture(inputs)  # counts its own seconds
        return time.perf_counter() - t0

    @staticmethod
    def _key(inputs: Sequence[torch.Tensor]) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(t.shape) for t in inputs)

    def _capture(self, inputs: Sequence[torch.Tensor]) -> _Captured:
        t0 = time.perf_counter()
        static = [t.detach().clone() for t in inputs]
        saved = self._snapshot()
        try:
            with torch.cuda.device(self.device):  # a worker thread starts on device 0
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    for _ in range(CUDA_SIDE_CALLS):
                        self.run(*static)
                torch.cuda.current_stream(self.device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # thread_local: the event loop may copy a batch to the device while a worker captures
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    outputs = self.run(*static)
        finally:
            self._restore(saved)
        self.compile_s += time.perf_counter() - t0
        return _Captured(graph, static, tuple(outputs))

    def _snapshot(self) -> Tensors:
        return [t.detach().clone() for t in self.mutated]

    def _restore(self, saved: Tensors) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self.mutated, saved)
