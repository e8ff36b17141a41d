"""`RunningStats`: the mean and variance of every observation a run has stored, for observation
normalisation (``learner.obs_norm``).

Replay keeps them over every row it stores (each batch merged in with the parallel update of
Chan, Golub and LeVeque 1979, in float64), so they are exact for the data, whatever the
number of samplers, and saved with its snapshots. Learners that normalise ask for them with
their samples and normalise each batch with the newest (common/learner_io.py); the actor's
acting policy begins with an ``obs_norm`` op over the same numbers (proto/SPEC.md §4.4), so
samplers, the evaluator, ``spreeze.load`` and exported files normalise as the learner did.
Running observation statistics of this kind normalise SimBa's and SimbaV2's inputs (Lee et al.
2025, arXiv 2410.09754 and 2502.15280), as Stable-Baselines3's ``VecNormalize`` does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

OBS_NORM_EPS = 1e-8  # added to the variance before its square root
OBS_NORM_CLIP = 10.0  # normalised observations are clipped to [-clip, clip]
OBS_NORM_KEYS = ("obs_norm.mean", "obs_norm.var")  # their names among the actor's weights


class RunningStats:
    """Count, mean and variance (population) of the rows added, per column."""

    def __init__(self, dim: int) -> None:
        self.count = 0
        self.mean = np.zeros(dim)
        self.m2 = np.zeros(dim)  # sum of squared deviations from the mean

    def add(self, rows: np.ndarray) -> None:
        """Merge rows [n, dim] in."""
        n = len(rows)
        if n == 0:
            return
        batch_mean = rows.mean(axis=0, dtype=np.float64)
        batch_m2 = np.square(rows - batch_mean).sum(axis=0, dtype=np.float64)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + batch_m2 + np.square(delta) * (self.count * n / total)
        self.count = total

    @property
    def var(self) -> np.ndarray:
        """The variance of the rows added (ones before any: normalising then changes nothing)."""
        return self.m2 / self.count if self.count else np.ones_like(self.m2)

    def state(self) -> dict[str, Any]:
        """JSON-able state (replay snapshots)."""
        return {"count": self.count, "mean": self.mean.tolist(), "m2": self.m2.tolist()}

    def load(self, state: dict[str, Any]) -> None:
        mean, m2 = np.asarray(state["mean"], np.float64), np.asarray(state["m2"], np.float64)
        if mean.shape != self.mean.shape or m2.shape != self.m2.shape:
            raise ValueError(f"observation statistics of {mean.shape[0] if mean.ndim else 0} columns, "
                             f"this run's observations have {self.mean.shape[0]}")
        self.count, self.mean, self.m2 = int(state["count"]), mean, m2
