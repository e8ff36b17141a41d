"""The run's ledger: per sampler, env steps made against those replay stored.

Every sampler's heartbeats carry the env steps its current incarnation made; a restarted
one registers again and counts from 0, so what its earlier incarnations made is kept
aside. Replay's metrics carry, per sender, the rows it inserted and rejected, and the env
steps its batches say were made (each batch carries its incarnation's count). A SIGKILLed
incarnation's last heartbeat lags what it sent after it, so a sampler made the larger of
the two counts. A sampler that exits while the run goes on (stopped by its owner) says in
its last heartbeat how many of its env steps it leaves unstored: sent while the run's rate
limiter held experience back (replay never accepted them) or never sent. At a clean end
made = stored + rejected + left unstored for every sampler: nothing accepted was lost (a
batch stored whose ack did not reach the sampler before it left counts as left unstored
too: then stored + rejected lies between made - left unstored and made).
"""

from __future__ import annotations

from typing import Any


class Ledger:
    def __init__(self) -> None:
        self.made: dict[str, int] = {}  # sampler id -> env steps its current incarnation made
        self.made_before: dict[str, int] = {}  # sampler id -> env steps its earlier incarnations made
        self.left: dict[str, int] = {}  # sampler id -> env steps its current incarnation left unstored at exit
        self.left_before: dict[str, int] = {}  # ... and its earlier incarnations

    def registered(self, sid: str) -> None:
        """A sampler (re)registered: a new incarnation counts its env steps from 0."""
        self.made_before[sid] = self.made_before.get(sid, 0) + self.made.get(sid, 0)
        self.left_before[sid] = self.left_before.get(sid, 0) + self.left.get(sid, 0)
        self.made[sid] = self.left[sid] = 0

    def heard(self, sid: str, counters: dict[str, Any]) -> None:
        """A heartbeat from a registered sampler with its env-step counter."""
        if sid in self.made and "env_steps" in counters:
            self.made[sid] = int(counters["env_steps"])
            self.left[sid] = int(counters.get("left_unstored", 0))

    def record(self, replay: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The ledger record from replay's newest ledger metrics, and its one-line summary."""
        rows = {}
        for sid in sorted(self.made):
            inserted, rejected = replay.get(f"ledger/{sid}/inserted", 0), replay.get(f"ledger/{sid}/rejected", 0)
            made = max(self.made_before.get(sid, 0) + self.made[sid], replay.get(f"ledger/{sid}/env_steps", 0))
            rows[sid] = {"made": made, "stored": inserted - rejected, "rejected": rejected,
                         "left_unstored": self.left_before.get(sid, 0) + self.left[sid],
                         "random": replay.get(f"ledger/{sid}/random", 0)}
        record = {"samplers": rows, "warmup_granted": replay.get("warmup_granted", 0)}
        lost = [sid for sid, r in rows.items() if not balanced(r)]
        if lost:
            return record, "ledger: not stored: " + ", ".join(
                f"{sid} made {rows[sid]['made']:,}, stored {rows[sid]['stored']:,}"
                + (f", left {rows[sid]['left_unstored']:,} unstored" if rows[sid]["left_unstored"] else "")
                for sid in lost)
        left = sum(r["left_unstored"] for r in rows.values())
        return record, (f"ledger: made = stored for {len(rows)} sampler(s), "
                        f"{sum(r['stored'] for r in rows.values()):,} env steps"
                        + (f" ({left:,} more left unstored by samplers that exited mid-run: the run had not "
                           "accepted them)" if left else ""))


def balanced(row: dict[str, int]) -> bool:
    """Whether a sampler's ledger row shows nothing lost and nothing stored twice."""
    taken = row["stored"] + row["rejected"]
    return row["made"] - row["left_unstored"] <= taken <= row["made"]
