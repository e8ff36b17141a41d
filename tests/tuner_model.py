"""A response model of a training run on a CPU host, for the tuner's tests and traces.

Each sampler process steps E envs at E / (ENV_FIXED + ENV_STEP * E) env steps/s on a
full core (a per-step actor call shared by the envs, then the envs one by one); the
fused learner does 1 / (UPDATE_FIXED + REQUEST / R + UPDATE_ROW * B) updates/s on a full core
(a fixed cost per update, a sample request's cost shared by its R batches, then a cost per
row of the batch); replay takes REPLAY_CORES. The rate
limiter holds the update-to-data ratio u, so the slower side sets the pace and the other
stalls (a stalled process uses only the CPU its pace needs). When the busy processes ask
for more cores than the host has, all slow down in proportion. Constants are of the
order measured on the 2-core development machine (HalfCheetah, 64-64 TD3).
"""

from __future__ import annotations

import random

from spreeze.services.supervisor.tuner import Setting, Window

ENV_FIXED = 2.0e-4  # seconds per sampler step for the whole env batch (actor call, push share)
ENV_STEP = 1.2e-4  # seconds per env per step (MuJoCo step, row writes)
UPDATE_FIXED = 1.45e-3  # seconds per update whatever the batch (Python, optimizer steps)
REQUEST = 2e-4  # seconds per sample request (encode, send, decode), shared by its batches
UPDATE_ROW = 4.0e-6  # seconds per batch row per update
REPLAY_CORES = 0.3


def rates(s: Setting, cores: float, utd: float = 1.0, env_step: float = ENV_STEP
          ) -> tuple[float, float, float, float, float]:
    """(frame rate, sampling Hz, insert stall, sample stall, idle cores) at steady state."""
    per_sampler = s.envs / (ENV_FIXED + env_step * s.envs)  # env steps/s on one full core
    learner = 1.0 / (UPDATE_FIXED + REQUEST / s.bpr + UPDATE_ROW * s.batch)  # updates/s on one full core
    share = 1.0
    for _ in range(50):  # fixed point of the CPU share given to each busy process
        sampling = s.samplers * per_sampler * share
        updates = min(learner * share, utd * sampling)
        steps = updates / utd
        used = steps / per_sampler + updates / learner + REPLAY_CORES
        share = min(1.0, share * cores / used) if used > cores else min(1.0, share * 1.05)
    sampling_cap, learner_cap = s.samplers * per_sampler * share, learner * share
    updates = min(learner_cap, utd * sampling_cap)
    insert_stall = max(0.0, 1 - updates / (utd * sampling_cap))
    sample_stall = max(0.0, 1 - updates / learner_cap)
    idle = max(0.0, cores - (updates / utd / per_sampler + updates / learner + REPLAY_CORES))
    return updates * s.batch, updates / utd, insert_stall, sample_stall, idle


def measure(s: Setting, cores: float, rng: random.Random, noise: float = 0.03, utd: float = 1.0,
            env_step: float = ENV_STEP) -> Window:
    """One noisy measurement window of setting `s`."""
    frame, hz, ins, smp, idle = rates(s, cores, utd, env_step)
    jitter = 1 + rng.gauss(0, noise)
    return Window(frame_rate=frame * jitter, sampling_hz=hz * jitter, update_to_data=utd * (1 + rng.gauss(0, 0.02)),
                    insert_stall=ins, sample_stall=smp, idle_cores=idle)


def best(settings: list[Setting], cores: float, utd: float = 1.0, env_step: float = ENV_STEP
         ) -> tuple[Setting, float]:
    """The setting of the highest frame rate among `settings` (noise-free)."""
    return max(((s, rates(s, cores, utd, env_step)[0]) for s in settings), key=lambda pair: pair[1])
