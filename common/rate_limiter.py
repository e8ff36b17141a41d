"""Samples-per-insert rate limiter, after Reverb's SampleToInsertRatio.

Counting is in TRANSITIONS on both sides: inserting a batch of n transitions is
`insert(n)`, serving a learner batch of b transitions is `sample(b)`. With
`spi = samples_per_insert` the limiter tracks

    diff  = inserts * spi - samples          (Reverb's "diff")
    error = diff - min_size_to_sample * spi  (0 when the ratio is exactly on target)

Stage 1 (inserts < min_size_to_sample): inserts always allowed, samples never.
Stage 2: an insert is allowed while error <= +error_buffer, a sample while
error >= -error_buffer. The offset min_size*spi is Reverb's: the transitions inserted
before sampling could start do not count as sample debt.

Check BEFORE the operation (differs from Reverb): Reverb admits one item at a time
and checks the diff AFTER it (`(inserts+1)*spi - samples <= max_diff`). We admit
whole batches and check the CURRENT state, so the decision does not depend on n: a
service can decide to read the next Experience message before knowing its size, and
a batch larger than the window is still admitted (it only overshoots). Consequences:
  * No deadlock, for any batch sizes and any error_buffer >= 0, with one inserter and
    one sampler. If an insert is refused then inserts >= min_size and
    error > +error_buffer >= -error_buffer, so a sample is allowed. If a sample is
    refused then either inserts < min_size (inserts allowed in stage 1) or
    error < -error_buffer <= +error_buffer, so an insert is allowed.
  * The ratio is held: in stage 2, with a fixed config,
        -error_buffer - max_sample_batch <= error <= error_buffer + spi * max_insert_batch,
    so samples / inserts -> spi over a long run.
`error_buffer` must still be >= max(1, spi), Reverb's minimum (its window, 2*error_buffer,
must be >= 2*max(1, spi)): a window narrower than one inserted transition's credit
(spi) or one sampled transition (1) would force the two sides into strict lockstep
(and deadlock Reverb's after-the-fact check); keeping Reverb's bound also keeps
configs portable. In practice use a few sampler batches' worth of credit.

`samples_per_insert` None or 0 means no limit: inserts never blocked, samples allowed
once min_size_to_sample transitions were inserted (for benchmarks).

Not thread-safe: the replay service owns one limiter from one event loop.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any

from spreeze.common.errors import ConfigError
from spreeze.proto.errors import SpreezeError


class RateLimitedError(SpreezeError, RuntimeError):
    """`insert`/`sample` was called while the limiter refuses that side (check first)."""


@dataclass(frozen=True)
class RateLimiterConfig:
    """Update-to-data ratio control for replay (see the module docstring)."""

    # Sampled transitions per inserted transition (batch 256, 1 update per env step: 256).
    # None or 0: no limit.
    samples_per_insert: float | None
    min_size_to_sample: int  # no sampling until this many transitions were inserted (>= 1)
    error_buffer: float  # allowed |error|, in sampled transitions, before a side blocks; >= max(1, spi)

    @property
    def limited(self) -> bool:
        """Whether the ratio is enforced at all."""
        return bool(self.samples_per_insert)

    @property
    def spi(self) -> float:
        """samples_per_insert as a float, 0.0 when unlimited."""
        return float(self.samples_per_insert or 0.0)

    @property
    def offset(self) -> float:
        """Reverb's offset: the diff at which the error is zero."""
        return self.min_size_to_sample * self.spi

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field and its value."""
        spi = self.samples_per_insert
        if spi is not None and not _finite_non_negative(spi):
            raise ConfigError(
                f"samples_per_insert={spi!r} must be a finite number >= 0 (0 or None: no limit)"
            )
        m = self.min_size_to_sample
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ConfigError(f"min_size_to_sample={m!r} must be an integer >= 1")
        eb = self.error_buffer
        if not _finite_non_negative(eb):
            raise ConfigError(f"error_buffer={eb!r} must be a finite number >= 0")
        if self.limited and eb < max(1.0, self.spi):
            raise ConfigError(
                f"error_buffer={eb!r} must be >= max(1, samples_per_insert)={max(1.0, self.spi)!r}: "
                "a smaller window cannot hold one inserted transition's sample credit and forces lockstep"
            )


def _finite_non_negative(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and x >= 0


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"batch size n={n!r} must be a positive integer")


class RateLimiter:
    """Admits inserts and samples so that samples ~= samples_per_insert * inserts."""

    def __init__(self, cfg: RateLimiterConfig) -> None:
        cfg.validate()
        self._cfg = cfg
        self.inserts = 0  # transitions inserted, all time
        self.samples = 0  # transitions sampled, all time
        self.insert_stalls = 0  # refused insert attempts (try_insert / insert)
        self.sample_stalls = 0  # refused sample attempts (try_sample / sample)
        # diff = base_diff + (inserts - base_inserts) * spi - (samples - base_samples):
        # exactly Reverb's inserts*spi - samples until a reconfigure rebases it.
        self._base_inserts = 0
        self._base_samples = 0
        self._base_diff = 0.0

    @property
    def config(self) -> RateLimiterConfig:
        """The config in force."""
        return self._cfg

    @property
    def diff(self) -> float:
        """Reverb's diff, inserts*spi - samples, rebased by reconfigure (unused when unlimited)."""
        cfg = self._cfg
        new_inserts = self.inserts - self._base_inserts
        return self._base_diff + new_inserts * cfg.spi - (self.samples - self._base_samples)

    @property
    def error(self) -> float:
        """diff minus Reverb's offset: > 0 means samplers are behind, < 0 inserters are."""
        return self.diff - self._cfg.offset if self._cfg.limited else 0.0

    def can_insert(self, n: int = 1) -> bool:
        """Whether an insert of n transitions is admitted now (n does not change the answer)."""
        _check_n(n)
        cfg = self._cfg
        return not cfg.limited or self.inserts < cfg.min_size_to_sample or self.error <= cfg.error_buffer

    def can_sample(self, n: int = 1) -> bool:
        """Whether a sample of n transitions is admitted now (n does not change the answer)."""
        _check_n(n)
        cfg = self._cfg
        if self.inserts < cfg.min_size_to_sample:
            return False
        return not cfg.limited or self.error >= -cfg.error_buffer

    def try_insert(self, n: int) -> bool:
        """Record an insert of n if admitted; else count a stall. Returns whether admitted."""
        if not self.can_insert(n):
            self.insert_stalls += 1
            return False
        self.inserts += int(n)
        return True

    def try_sample(self, n: int) -> bool:
        """Record a sample of n if admitted; else count a stall. Returns whether admitted."""
        if not self.can_sample(n):
            self.sample_stalls += 1
            return False
        self.samples += int(n)
        return True

    def insert(self, n: int) -> None:
        """Record an insert of n; raise RateLimitedError (and count a stall) if refused."""
        if not self.try_insert(n):
            raise RateLimitedError(
                f"insert of {n} refused: error={self.error:.1f} > error_buffer={self._cfg.error_buffer}"
            )

    def force_insert(self, n: int) -> None:
        """Record an insert of n whether admitted or not: at a run's end replay stores what the
        samplers still have in flight, and no learner samples any more (proto/SPEC.md §6)."""
        _check_n(n)
        self.inserts += int(n)

    def sample(self, n: int) -> None:
        """Record a sample of n; raise RateLimitedError (and count a stall) if refused."""
        if not self.try_sample(n):
            raise RateLimitedError(
                f"sample of {n} refused: inserts={self.inserts} (min {self._cfg.min_size_to_sample}), "
                f"error={self.error:.1f} < -error_buffer={-self._cfg.error_buffer}"
            )

    def reconfigure(self, cfg: RateLimiterConfig) -> None:
        """Switch config while running (the supervisor re-tunes the update ratio).

        Counters are kept. In stage 2 of both configs the current error carries over,
        clamped into the new window; otherwise the error restarts at 0 at the moment
        stage 2 begins, as it would for a fresh limiter.
        """
        cfg.validate()
        old, i, s = self._cfg, self.inserts, self.samples
        carried = self.error if old.limited and i >= old.min_size_to_sample else 0.0
        self._cfg, self._base_inserts, self._base_samples = cfg, i, s
        if i < cfg.min_size_to_sample:
            self._base_diff = i * cfg.spi  # stage 1 under the new config: error 0 when min_size is reached
        else:
            self._base_diff = cfg.offset + min(cfg.error_buffer, max(-cfg.error_buffer, carried))

    def counters(self) -> dict[str, float]:
        """Counters for metrics."""
        return {
            "inserts": self.inserts, "samples": self.samples, "insert_stalls": self.insert_stalls,
            "sample_stalls": self.sample_stalls, "error": self.error,
        }

    def state_dict(self) -> dict[str, Any]:
        """Counters, bookkeeping and the config they were made under (plain values)."""
        return {
            "config": asdict(self._cfg), "inserts": self.inserts, "samples": self.samples,
            "insert_stalls": self.insert_stalls, "sample_stalls": self.sample_stalls,
            "base_inserts": self._base_inserts, "base_samples": self._base_samples,
            "base_diff": self._base_diff,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; if the saved config differs from ours, rebase as `reconfigure` would."""
        mine = self._cfg
        saved = RateLimiterConfig(**state["config"])
        saved.validate()
        self._cfg = saved
        for key in ("inserts", "samples", "insert_stalls", "sample_stalls"):
            setattr(self, key, int(state[key]))
        self._base_inserts = int(state["base_inserts"])
        self._base_samples = int(state["base_samples"])
        self._base_diff = float(state["base_diff"])
        if saved != mine:
            self.reconfigure(mine)
