"""Saying loudly that no sampler feeds the run (and when one is back).

Without a sampler a run trains on nothing new: replay's rate limiter holds the learners
and the progress line shows `sampling 0 Hz`. The supervisor restarts the samplers it
started, but a sampler container that `docker kill` stopped is not restarted by Docker
(a kill counts as a manual stop), and a remote sampler is its owner's to start: the run
says so once per stretch without samplers, with how to add one.
"""

from __future__ import annotations

NO_SAMPLER_S = 20.0  # seconds without any sampler before the run says so (a start or restart takes 2-10 s)


class SamplerWatch:
    def __init__(self, hint: str, after_s: float = NO_SAMPLER_S) -> None:
        self.hint, self.after_s = hint, after_s
        self.none_since: float | None = None  # monotonic time the last sampler went
        self.said = False

    def check(self, samplers: int, now: float) -> tuple[str, str] | None:
        """The event to emit now, (kind, reason), or None."""
        if samplers:
            self.none_since = None
            if self.said:
                self.said = False
                return "samplers_back", f"{samplers} sampler{'s' if samplers > 1 else ''} attached again"
            return None
        if self.none_since is None:
            self.none_since = now
        if not self.said and now - self.none_since >= self.after_s:
            self.said = True
            return "no_sampler", (f"no sampler has fed the run for {now - self.none_since:.0f}s: training waits for "
                                  f"experience; {self.hint}")
        return None


def hint(hub: bool, listen: str) -> str:
    """How to add a sampler to this run."""
    remote = f"`spreeze sampler --connect {listen}`" if listen else ""
    if hub:
        return ("start one: `docker compose up -d --scale sampler=N` (Docker does not restart a killed "
                "container)" + (f", or {remote} from another machine" if remote else ""))
    if remote:
        return f"attach one: {remote}"
    return "the supervisor restarts its own samplers: see logs/sampler-*.log for why they keep failing"
