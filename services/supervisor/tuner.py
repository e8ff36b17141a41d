"""The runtime tuner: a pure controller from measurement windows to setting changes.

Goal: the highest update frame rate (batch size x critic updates/s) while replay's rate
limiter holds the target update-to-data ratio. Windows are compared by `Window.score`,
the frame rate corrected for other programs' load on a shared host. Knobs: sampler
processes, envs per sampler, update batches per sample request, and batch size (the one
knob that changes what is learned per env step: the caller pins it unless the user opts
in). A damped hill climb, one knob step at a time:

  * measure the current setting over a window (the caller waits `settle` seconds after
    a change, then `window` seconds, and passes the `Window`);
  * try one move, chosen by what limits the run now: a larger batch first (each update
    then uses more transitions, whoever limits), then, when the learners wait on replay
    (sampling limits), another sampler if the host has idle cores, or more envs per
    sampler; when replay refuses inserts (the learners limit), more batches per sample
    request (fewer messages per update), and with no core idle one sampler fewer;
  * keep the move if the next window's score beats the baseline by `min_gain` and the
    update-to-data ratio held; otherwise go back and measure the old setting again
    (A/B/A): the move is kept after all if it beats the mean of the old setting's
    windows before and after it (the host's load changed meanwhile), else rejected;
  * the undoing of a kept move is blocked for `cooldown` seconds, so no knob swings back
    and forth (hysteresis); a rejected move is blocked for RETRY_SHARE of that, doubled
    with each rejection in a row (one unlucky window does not rule a move out for long,
    a move that keeps failing is tried ever more rarely). With nothing left to try the
    tuner is settled until a block expires or the score drifts down by DRIFT.

Pinned knobs are never moved. Every decision carries its reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# tuner knob -> config key (the key pins it)
KNOB_KEYS = {"samplers": "sampler.num_samplers", "envs": "sampler.envs_per_sampler",
             "batch": "learner.batch_size", "bpr": "learner.batches_per_request"}
UTD_DRIFT = 0.2  # a trial whose update-to-data ratio strays more than this from the target is rejected
DRIFT = 0.25  # a settled tuner starts over when the frame rate fell this much below its baseline...
DRIFT_WINDOWS = 2  # ...in this many windows in a row
STALL = 0.1  # a stall share above this names the bottleneck
IDLE_FOR_SAMPLER = 0.5  # host cores that must be idle before another sampler process is tried
RETRY_SHARE = 0.125  # a move rejected once may be tried again after this share of the cooldown
MAX_LOAD_CORRECTION = 2.0  # most the score scales a frame rate up for other programs' load (an estimate)


@dataclass(frozen=True)
class Setting:
    samplers: int
    envs: int
    batch: int
    bpr: int = 4  # update batches per sample request

    def describe(self) -> str:
        return f"{self.samplers} sampler(s) x {self.envs} envs, batch {self.batch}, {self.bpr} batches/request"


@dataclass(frozen=True)
class Bounds:
    max_samplers: int
    max_envs: int
    min_batch: int
    max_batch: int
    max_bpr: int = 16


@dataclass(frozen=True)
class Window:
    """What one measurement window saw."""

    frame_rate: float  # batch x critic updates per second
    sampling_hz: float  # env steps inserted into replay per second
    update_to_data: float  # critic updates per env step inserted
    insert_stall: float  # share of the window replay refused inserts (the learners limit)
    sample_stall: float  # share of the window learner requests waited in replay (sampling limits)
    idle_cores: float = 0.0  # host cores idle on average
    cpu: dict[str, float] = field(default_factory=dict)  # cores used per service
    host_cores: float = 0.0  # cores of the host (0 = unknown: the score is the raw frame rate)

    @property
    def score(self) -> float:
        """The frame rate as if the run had the whole host: other programs' load on a shared
        host takes cores from us and from the idle pool alike, so scale by cores / (ours + idle)."""
        ours = sum(self.cpu.values()) + self.idle_cores
        if self.host_cores <= 0 or not self.cpu or ours <= 0:
            return self.frame_rate
        return self.frame_rate * min(self.host_cores / ours, MAX_LOAD_CORRECTION)

    def bottleneck(self) -> str:
        if self.insert_stall > STALL and self.insert_stall >= self.sample_stall:
            return "learners"
        if self.sample_stall > STALL:
            return "sampling"
        return "unclear"


@dataclass(frozen=True)
class Decision:
    action: str  # try | keep | revert | reject | settled | restart
    setting: Setting  # the setting to run from now on
    reason: str
    move: str = ""

    def data(self) -> dict[str, object]:
        return {"action": self.action, "move": self.move, **dataclasses.asdict(self.setting)}


INVERSE = {"batch+": "batch-", "batch-": "batch+", "envs+": "envs-", "envs-": "envs+",
           "samplers+": "samplers-", "samplers-": "samplers+", "bpr+": "bpr-", "bpr-": "bpr+"}


class Tuner:
    def __init__(self, setting: Setting, bounds: Bounds, pinned: frozenset[str], target_utd: float,
                 min_gain: float = 0.05, cooldown: float = 300.0) -> None:
        self.setting, self.bounds, self.pinned = setting, bounds, pinned  # pinned: knob names
        self.target_utd, self.min_gain, self.cooldown = target_utd, min_gain, cooldown
        self.baseline: float | None = None  # score of the current setting
        self.trial: tuple[str, Setting, float] | None = None  # (move, setting before, baseline before)
        self.recheck: tuple[str, Setting, float, float] | None = None  # (move, its setting, its score, before)
        self.blocked: dict[str, float] = {}  # move -> time until which it is not tried
        self.rejections: dict[str, int] = {}  # move -> rejections in a row (the block doubles with each)
        self.settled = False
        self.low_windows = 0  # consecutive settled windows below the drift line

    def observe(self, snap: Window, now: float) -> list[Decision]:
        """Take one window's measurement of the current setting; the decisions it leads to."""
        if snap.score <= 0:
            return []  # learners not updating yet (filling replay): nothing to compare
        out: list[Decision] = []
        if self.trial is not None:
            out.append(self.judge(snap, now))
            if out[-1].action == "revert":
                return out  # the next window re-measures the restored setting
        elif self.recheck is not None:
            out.append(self.second_look(snap, now))
            if out[-1].action == "keep":
                return out  # the move is back on: the next window measures it
        elif self.baseline is None:
            self.baseline = snap.score
        elif snap.score < self.baseline * (1 - DRIFT) and self.low_windows + 1 >= DRIFT_WINDOWS:
            self.blocked.clear()
            self.rejections.clear()
            out.append(Decision("restart", self.setting, f"score fell to {snap.score:,.0f} from "
                                f"{self.baseline:,.0f} load-corrected frames/s: every move may be tried again"))
            self.baseline, self.settled, self.low_windows = snap.score, False, 0
        elif snap.score < self.baseline * (1 - DRIFT):
            self.low_windows += 1  # one low window may be noise: wait for the next
            return out
        else:
            self.low_windows = 0
            self.baseline = (self.baseline + snap.score) / 2  # settled: a smoothed reference for drift
        out += self.propose(snap, now)
        return out

    def judge(self, snap: Window, now: float) -> Decision:
        """The window after a tried move: keep it, or go back and look at the old setting again."""
        assert self.trial is not None
        move, before, base = self.trial
        self.trial = None
        gain = snap.score / base - 1
        utd_ok = not self.target_utd or abs(snap.update_to_data / self.target_utd - 1) <= UTD_DRIFT
        numbers = f"{base:,.0f} -> {snap.score:,.0f} load-corrected frames/s ({gain:+.1%})"
        if gain >= self.min_gain and utd_ok:
            self.keep(move, now)
            self.baseline = snap.score
            return Decision("keep", self.setting, f"{move} kept: {numbers}", move)
        tried, self.setting, self.baseline = self.setting, before, None
        if not utd_ok:
            self.block(move, now)
            return Decision("revert", before, f"{move} undone: {numbers}, update-to-data "
                            f"{snap.update_to_data:.2f} strayed from the target {self.target_utd:g}", move)
        self.recheck = (move, tried, snap.score, base)
        return Decision("revert", before, f"{move} undone: {numbers}, less than the +{self.min_gain:.0%} "
                        "needed; measuring the previous setting again", move)

    def second_look(self, snap: Window, now: float) -> Decision:
        """A/B/A: compare the tried move with the old setting measured before AND after it, so a
        change of the host's load during the trial is not taken for the move's effect."""
        assert self.recheck is not None
        move, tried, score, before = self.recheck
        self.recheck = None
        reference = (before + snap.score) / 2
        gain = score / reference - 1
        numbers = (f"{score:,.0f} vs {reference:,.0f} load-corrected frames/s for the previous setting "
                   f"before and after ({gain:+.1%})")
        if gain >= self.min_gain:
            self.keep(move, now)
            self.setting, self.baseline = tried, None
            return Decision("keep", tried, f"{move} kept after a second look: {numbers}", move)
        self.baseline = snap.score
        pause = self.block(move, now)
        return Decision("reject", self.setting, f"{move} rejected: {numbers}; not tried for {pause:.0f}s", move)

    def keep(self, move: str, now: float) -> None:
        self.blocked[INVERSE[move]] = now + self.cooldown  # no swinging back
        self.rejections.pop(move, None)

    def block(self, move: str, now: float) -> float:
        """Block a rejected move: RETRY_SHARE of the cooldown, doubled with each rejection in a row."""
        n = self.rejections[move] = self.rejections.get(move, 0) + 1
        pause = min(self.cooldown, self.cooldown * RETRY_SHARE * 2 ** (n - 1))
        self.blocked[move] = now + pause
        return pause

    def propose(self, snap: Window, now: float) -> list[Decision]:
        for move in self.candidates(snap):
            if self.blocked.get(move, 0.0) > now:
                continue
            new = self.moved(move)
            if new is None:
                continue
            assert self.baseline is not None
            self.trial = (move, self.setting, self.baseline)
            self.setting, self.settled = new, False
            return [Decision("try", new, f"{move}: {snap.bottleneck()} limit (insert stall "
                             f"{snap.insert_stall:.0%}, sample stall {snap.sample_stall:.0%}, "
                             f"{snap.idle_cores:.1f} idle cores) at {self.baseline:,.0f} "
                             "load-corrected frames/s", move)]
        if self.settled:
            return []
        self.settled = True
        return [Decision("settled", self.setting, f"no move left to try: {self.setting.describe()} at "
                         f"{self.baseline:,.0f} load-corrected frames/s")]

    def candidates(self, snap: Window) -> list[str]:
        """Moves worth trying now, most promising first (what limits the run decides)."""
        idle = snap.idle_cores >= IDLE_FOR_SAMPLER
        if snap.bottleneck() == "learners":
            order = ["batch+", "bpr+"] + (["samplers-"] if not idle and self.setting.samplers > 1 else [])
        elif snap.bottleneck() == "sampling":  # a larger batch still multiplies what each update uses
            order = ["batch+"] + (["samplers+", "envs+"] if idle else ["envs+", "batch-"])
        else:
            order = ["batch+", "bpr+", "envs+"] + (["samplers+"] if idle else [])
        return [m for m in order if KNOB_OF[m] not in self.pinned]

    def moved(self, move: str) -> Setting | None:
        """The setting after `move`, or None where a bound stops it."""
        s, b = self.setting, self.bounds
        new = {"batch+": dataclasses.replace(s, batch=min(s.batch * 2, b.max_batch)),
               "batch-": dataclasses.replace(s, batch=max(s.batch // 2, b.min_batch)),
               "envs+": dataclasses.replace(s, envs=min(s.envs * 2, b.max_envs)),
               "envs-": dataclasses.replace(s, envs=max(s.envs // 2, 1)),
               "samplers+": dataclasses.replace(s, samplers=min(s.samplers + 1, b.max_samplers)),
               "samplers-": dataclasses.replace(s, samplers=max(s.samplers - 1, 1)),
               "bpr+": dataclasses.replace(s, bpr=min(s.bpr * 2, b.max_bpr)),
               "bpr-": dataclasses.replace(s, bpr=max(s.bpr // 2, 1))}[move]
        return None if new == s else new


KNOB_OF = {move: move[:-1] for move in INVERSE}  # "batch+" -> "batch"
