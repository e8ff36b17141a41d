"""The run's ledger: per sampler, env steps made against those replay stored.

Every sampler's heartbeats carry the env steps its current incarnation made; a restarted
one registers again and counts from 0, so what its earlier incarnations made is kept
aside. Replay's metrics carry, per sender, the rows it inserted and rejected, and the env
steps its batches say were made (each batch carries its incarnation's count). A SIGKILLed
incarnation's last heartbeat lags what it sent after it, so a sampler made the larger of
the two counts. At a clean end made = stored + rejected for every sampler: nothing
accepted was lost.
"""

from __future__ import annotations

from typing import Any


class Ledger:
    def __init__(self) -> None:
        self.made: dict[str, int] = {}  # sampler id -> env steps its current incarnation made
        self.made_before: dict[str, int] = {}  # sampler id -> env steps its earlier incarnations made

    def registered(self, sid: str) -> None:
        """A sampler (re)registered: a new incarnation counts its env steps from 0."""
        self.made_before[sid] = self.made_before.get(sid, 0) + self.made.get(sid, 0)
        self.made[sid] = 0

    def heard(self, sid: str, counters: dict[str, Any]) -> None:
        """A heartbeat from a registered sampler with its env-step counter."""
        if sid in self.made and "env_steps" in counters:
            self.made[sid] = int(counters["env_steps"])

    def record(self, replay: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The ledger record from replay's newest ledger metrics, and its one-line summary."""
        rows = {}
        for sid in sorted(self.made):
            inserted, rejected = replay.get(f"ledger/{sid}/inserted", 0), replay.get(f"ledger/{sid}/rejected", 0)
            made = max(self.made_before.get(sid, 0) + self.made[sid], replay.get(f"ledger/{sid}/env_steps", 0))
            rows[sid] = {"made": made, "stored": inserted - rejected,
                         "rejected": rejected, "random": replay.get(f"ledger/{sid}/random", 0)}
        record = {"samplers": rows, "warmup_granted": replay.get("warmup_granted", 0)}
        lost = [sid for sid, r in rows.items() if r["made"] - r["stored"] - r["rejected"]]
        if lost:
            return record, "ledger: not stored: " + ", ".join(
                f"{sid} made {rows[sid]['made']:,}, stored {rows[sid]['stored']:,}" for sid in lost)
        return record, (f"ledger: made = stored for {len(rows)} sampler(s), "
                        f"{sum(r['stored'] for r in rows.values()):,} env steps")
