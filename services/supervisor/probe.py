"""Hardware probe and the start plan: how many samplers, envs, which batch and learner placement.

`probe()` reads what this host offers (CPU cores this process may run on, memory, CUDA
devices) without initialising CUDA in the supervisor: `nvidia-smi` answers, or, where a
driver is present but that tool is not, a short torch subprocess. `plan(hardware, cfg,
pinned)` is pure: it returns the values to use for every knob the user did not set, each
with the reason, and `apply(cfg, choices)` makes the run's config from them.

The CPU counters (`cpu_seconds`, `host_cpu`) are read here too: the tuner's measure of
CPU use per process and of idle cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spreeze.common.config import Config, build, to_dict
from spreeze.common.envs import Task

GIB = 1024 ** 3
REPLAY_MEMORY_SHARE = 0.25  # most of the host memory the replay ring may take
PROBE_TIMEOUT = 20.0  # seconds for nvidia-smi or the torch subprocess
LEARNER_THREADS_MAX = 4  # a small MLP's update gains little from more intra-op threads
SAMPLERS_MAX = 32
GPU_BATCH = 1024  # a GPU update costs about the same at 256 and 1024: take the larger
GPU_ENVS = 8  # GPU learners eat data fast: more envs per sampler amortise each actor call
ENDS_EARLY_HIDDEN = (256, 256)  # networks for tasks that end episodes when the agent falls
ENDS_EARLY_WARMUP = 1_000  # random warm-up steps for such tasks
ENDS_EARLY_ALGO = "crossq"  # the algorithm for such tasks when the user chose none
# On CPU, networks at least this wide make split learners pay: each update is long beside the
# weight exchange, so critic and actor updates on two cores beat one (2 cores, `spreeze bench
# e2e`: TD3 256-256 on Walker2d-v5 184 vs 155 updates/s, SAC 256-256 168 vs 110; at 64-64
# split was no faster, the exchange taking what the second core gave).
SPLIT_CPU_WIDTH = 256
CXX_HINT = ("install a C++ compiler and the Python headers (Debian: apt-get install g++ python3-dev) for "
            "compiled updates, about 2x faster on CPU")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_gib: float


@dataclass(frozen=True)
class Hardware:
    cores: int  # CPU cores this process may run on
    memory_gib: float  # total host memory
    gpus: tuple[Gpu, ...] = ()
    cxx: str = ""  # the C++ compiler torch.compile would build kernels with; "" when none (or no Python.h)

    def describe(self) -> str:
        gpus = ", ".join(f"cuda:{g.index} {g.name} {g.memory_gib:.0f} GiB" for g in self.gpus) or "no CUDA device"
        cxx = f"C++ compiler {self.cxx}" if self.cxx else "no C++ compiler (or no Python headers)"
        return f"{self.cores} CPU cores, {self.memory_gib:.1f} GiB memory, {gpus}, {cxx}"


@dataclass(frozen=True)
class Choice:
    key: str  # dotted config key
    value: Any
    reason: str

    def describe(self) -> str:
        """'key=value: reason', as the run's `plan` events and console lines say it."""
        return f"{self.key}={self.value}: {self.reason}"


# ------------------------------------------------------------------ probing

def probe() -> Hardware:
    return Hardware(cores=len(os.sched_getaffinity(0)), memory_gib=memory_gib(), gpus=cuda_devices(),
                    cxx=cxx_compiler())


def cxx_compiler() -> str:
    """The C++ compiler torch.compile's inductor looks for ($CXX, else g++) if it runs and this
    Python's headers are there (the compiled steps' C++ wrapper includes Python.h), else "".

    A bare Debian has neither: compiling the update steps would fail there, so the plan turns
    `learner.compile` off up front (and the tests of compiled steps skip) instead."""
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return ""
    cxx = os.environ.get("CXX") or "g++"
    try:
        ran = subprocess.run([cxx, "--version"], capture_output=True, timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (shutil.which(cxx) or cxx) if ran.returncode == 0 else ""


def memory_gib(meminfo: Path = Path("/proc/meminfo")) -> float:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return 0.0  # unknown: the plan then leaves memory-bound values alone


def cuda_devices() -> tuple[Gpu, ...]:
    """CUDA devices from nvidia-smi, else from torch in a subprocess, else none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=PROBE_TIMEOUT)
        if out.returncode == 0:
            return parse_nvidia_smi(out.stdout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    if not Path("/proc/driver/nvidia").exists():
        return ()  # no driver: no CUDA device, and no torch import needed to know it
    code = ("import torch\nfor i in range(torch.cuda.device_count()):\n"
            " p = torch.cuda.get_device_properties(i)\n print(f'{i}, {p.name}, {p.total_memory // 2**20}')")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return ()
    return parse_nvidia_smi(out.stdout) if out.returncode == 0 else ()


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """Lines of 'index, name, memory MiB'; unreadable lines are skipped."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            gpus.append(Gpu(int(parts[0]), ", ".join(parts[1:-1]), float(parts[-1]) / 1024))
        except (ValueError, IndexError):
            continue
    return tuple(gpus)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (/proc/<pid>/stat), None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def host_cpu(stat: Path = Path("/proc/stat")) -> tuple[float, float]:
    """(idle, total) CPU seconds of the whole host since boot, summed over its cores."""
    try:
        values = [int(v) for v in stat.read_text().splitlines()[0].split()[1:]]
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return (values[3] + values[4]) / tick, sum(values[:8]) / tick  # idle + iowait; without guest time


# ------------------------------------------------------------------ planning

def plan(hw: Hardware, cfg: Config, pinned: frozenset[str], row_bytes: int, task: Task | None = None
         ) -> list[Choice]:
    """The start values of every knob not in `pinned`, each with its reason (pure). The
    algorithm comes first: the rest is planned for the one chosen."""
    choices: list[Choice] = []
    if task is not None:
        choices = algo_choice(task, cfg, pinned)
        cfg = apply(cfg, choices)
        choices += task_choices(task, cfg, pinned)
    hidden = next((c.value for c in choices if c.key == f"{cfg.algorithm.name}.hidden"),
                  getattr(cfg.algo_config, "hidden", ()))
    if not hw.cxx and cfg.learner.compile and "learner.compile" not in pinned:
        choices.append(Choice("learner.compile", False,
                              f"no C++ compiler or Python headers: eager updates; {CXX_HINT}"))
    mode, actor_dev, critic_dev = cfg.learner.mode, cfg.learner.actor_device, cfg.learner.critic_device
    placement = {"learner.mode", "learner.actor_device", "learner.critic_device"}
    if not placement & pinned:
        mode, actor_dev, critic_dev, why = placement_for(hw, max(hidden, default=0))
        choices += [Choice("learner.mode", mode, why), Choice("learner.actor_device", actor_dev, why),
                    Choice("learner.critic_device", critic_dev, why)]
    on_gpu = actor_dev != "cpu" or (mode == "split" and critic_dev != "cpu")
    choices += algorithm_choices(cfg, pinned, on_gpu)
    learner_procs = 1 if mode == "fused" else 2
    threads = cfg.learner.threads
    if "learner.threads" not in pinned:
        if on_gpu:
            threads = 1
            why = "the learner computes on the GPU: one CPU thread feeds it"
        else:
            threads = max(1, min(LEARNER_THREADS_MAX, hw.cores // 4))
            why = f"{hw.cores} cores: a quarter to the learner's intra-op threads (1 to {LEARNER_THREADS_MAX})"
        choices.append(Choice("learner.threads", threads, why))
    spare = hw.cores - learner_procs * threads - 1  # one core for replay, evaluator and the supervisor
    if "sampler.num_samplers" not in pinned:
        n = max(1, min(SAMPLERS_MAX, spare))
        choices.append(Choice("sampler.num_samplers", n,
                              f"{hw.cores} cores - {learner_procs * threads} learner threads - 1 for replay, "
                              f"evaluator and supervisor: {n} sampler process{'es' if n > 1 else ''}"))
    if "sampler.envs_per_sampler" not in pinned:
        envs = GPU_ENVS if on_gpu else cfg.sampler.envs_per_sampler
        choices.append(Choice("sampler.envs_per_sampler", envs,
                              "GPU learners: more envs per actor call" if on_gpu else
                              "CPU learner: the default envs per sampler (the tuner grows it if sampling limits)"))
    if "learner.batch_size" not in pinned:
        batch = GPU_BATCH if on_gpu else cfg.learner.batch_size
        choices.append(Choice("learner.batch_size", batch,
                              f"GPU: {GPU_BATCH} costs about as much per update as 256" if on_gpu else
                              "CPU: the default batch size (tuned only with supervisor.tune_batch=true)"))
    if "replay.capacity" not in pinned and hw.memory_gib > 0:
        fits = int(hw.memory_gib * GIB * REPLAY_MEMORY_SHARE // max(row_bytes, 1))
        if fits < cfg.replay.capacity:
            capacity = max(fits, cfg.replay.min_size)
            choices.append(Choice("replay.capacity", capacity,
                                  f"{cfg.replay.capacity:,} transitions of {row_bytes} bytes exceed "
                                  f"{REPLAY_MEMORY_SHARE:.0%} of {hw.memory_gib:.3g} GiB memory"))
    return choices


def algo_choice(task: Task, cfg: Config, pinned: frozenset[str]) -> list[Choice]:
    """A task that ends the episode when the agent falls gets CrossQ (Bhatt et al., ICLR 2024),
    unless the user chose the algorithm or set a key of the configured one's section. On
    Hopper-v5 and Walker2d-v5 (3 seeds, 100k steps, 2 CPU cores; results/) its last-10 return
    was 1,991 and 2,441 where TD3's was 541 and 576 (1/3 and 0/3 seeds past 1000); on Ant-v5
    1,015 against 631, and 3/3 seeds past 1000 against 1/3. A task
    that never ends early keeps the configured algorithm (TD3: 3000 on HalfCheetah-v5 in ~40 s).
    """
    if "algo" in pinned or any(key.startswith(f"{cfg.algorithm.name}.") for key in pinned):
        return []
    if not task.ends_early:
        return [Choice("algo", cfg.algo, f"{task.env_id} never ends an episode early: the configured "
                       f"{cfg.algo}")]
    return [Choice("algo", ENDS_EARLY_ALGO, f"{task.env_id} ends episodes when the agent falls: "
                   f"{ENDS_EARLY_ALGO} (batch-normalised critics without target networks; in 100k steps it "
                   "learned ~4x TD3's return on Hopper-v5 and Walker2d-v5 and ~1.6x on Ant-v5, every seed past "
                   "1000)")]


def planned_algo(cfg: Config, pinned: frozenset[str]) -> list[Choice]:
    """`algo_choice` for the config's own task, before anything runs (the run directory and
    `spreeze results --algos plan` name the algorithm it picks); none when the plan is off or
    the user chose the algorithm (then the env is not even made)."""
    if not cfg.supervisor.auto or "algo" in pinned:
        return []
    from spreeze.common.envs import task_facts
    return algo_choice(task_facts(cfg.env_source), cfg, pinned)


def task_choices(task: Task, cfg: Config, pinned: frozenset[str]) -> list[Choice]:
    """Settings derived from the task itself, by early termination: the network size and the
    random warm-up."""
    return [*network_choice(task, cfg, pinned), *warmup_choices(task, cfg, pinned)]


def network_choice(task: Task, cfg: Config, pinned: frozenset[str]) -> list[Choice]:
    """A task that ends the episode when the agent falls (Hopper, Walker2d, Ant) gets 256-256
    networks: with 64-64, TD3 plateaued on Walker2d-v5 and Ant-v5 at their first evaluation's
    return for 80k steps. A task without it (HalfCheetah) keeps the algorithm's default, where
    64-64 reached 3000 in as few env steps as 256-256 at a fraction of the CPU per update.
    """
    key = f"{cfg.algorithm.name}.hidden"
    hidden = tuple(getattr(cfg.algo_config, "hidden", ()))
    if key in pinned or not hidden:
        return []
    if not task.ends_early:
        return [Choice(key, list(hidden), f"{task.env_id} never ends an episode early: the {cfg.algo} default "
                       f"{'-'.join(map(str, hidden))} (smaller networks update faster)")]
    big = tuple(max(h, b) for h, b in zip(hidden, ENDS_EARLY_HIDDEN)) + hidden[len(ENDS_EARLY_HIDDEN):]
    return [Choice(key, list(big), f"{task.env_id} ends episodes when the agent falls: "
                   f"{'-'.join(map(str, big))} networks (64-64 did not learn such tasks)")]


def warmup_choices(task: Task, cfg: Config, pinned: frozenset[str]) -> list[Choice]:
    """A task that ends the episode when the agent falls gets a short random warm-up (the TD3
    paper's 1,000 steps for Hopper and Walker2d): random actions fall within a few dozen
    steps, so more random episodes add only more falls, and learning starts sooner. TD3
    256-256 on Walker2d-v5, seed 0, best evaluation within 100k steps: 1,042 after a 1k
    warm-up, 677 after 10k, 434 after 25k. Replay serves its first batch after the warm-up.
    """
    keys = {"sampler.warmup_steps", "replay.min_size"}
    if not task.ends_early or keys & pinned:
        return []
    steps = min(cfg.sampler.warmup_steps, ENDS_EARLY_WARMUP)
    why = (f"{task.env_id} ends episodes when the agent falls: {steps:,} random steps (random actions fall "
           "within a few dozen steps; longer random warm-ups learned less)")
    return [Choice("sampler.warmup_steps", steps, why), Choice("replay.min_size", min(cfg.replay.min_size, steps), why)]


def algorithm_choices(cfg: Config, pinned: frozenset[str], on_gpu: bool) -> list[Choice]:
    """What the run's algorithm sets for the learners' device (its descriptor's
    `plan_choices`; a plain field is one of its own section), but for the keys the user set."""
    name = cfg.algorithm.name
    choices = [Choice(key if "." in key else f"{name}.{key}", value, why)
               for key, value, why in cfg.algorithm.plan_choices(cfg.algo_config, on_gpu)]
    return [c for c in choices if c.key not in pinned]


def placement_for(hw: Hardware, width: int) -> tuple[str, str, str, str]:
    """(mode, actor device, critic device, reason) for the CUDA devices found, or on CPU for
    the cores and the networks' widest hidden layer (`width`)."""
    if len(hw.gpus) >= 2:
        a, c = hw.gpus[0].index, hw.gpus[1].index
        return ("split", f"cuda:{a}", f"cuda:{c}",
                f"{len(hw.gpus)} GPUs: split learners, actor on cuda:{a}, critic on cuda:{c}")
    if len(hw.gpus) == 1:
        g = hw.gpus[0].index
        return "split", f"cuda:{g}", f"cuda:{g}", f"1 GPU: split learners both on cuda:{g} (their updates overlap)"
    if hw.cores >= 2 and width >= SPLIT_CPU_WIDTH:
        return ("split", "cpu", "cpu", f"no CUDA device, {width}-wide networks: split learners, critic and actor "
                "updates on two cores (updates this large cost far more than exchanging weights)")
    return ("fused", "cpu", "cpu", "no CUDA device: the fused learner on CPU (with networks under "
            f"{SPLIT_CPU_WIDTH} wide, split learners were no faster: exchanging weights every 2 updates costs "
            "what the second core gains)")


def apply(cfg: Config, choices: list[Choice]) -> Config:
    """The config with every choice's value set, validated."""
    data = to_dict(cfg)
    for choice in choices:
        section, _, key = choice.key.rpartition(".")
        node = data[section] if section else data
        node[key] = choice.value
    new: Config = build(Config, data)
    new.validate()
    return new
