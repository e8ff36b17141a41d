"""Per-service health for the dashboard: the supervisor's services.json plus what the bus shows.

The supervisor rewrites run_dir/services.json (pid, state, restarts, last heartbeat as unix
time) about once per heartbeat interval; heartbeats themselves reach only the supervisor.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LIVE_STATES = ("running", "paused")


def read_roster(run_dir: Path) -> dict[str, dict[str, Any]]:
    """services.json as a dict; {} while it does not exist or is being replaced."""
    try:
        data = json.loads((run_dir / "services.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def health_rows(run_dir: Path, last_seen: dict[str, float], wall_time: float,
                silence_s: float, notes: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per service: alive, state, restarts, seconds since its last heartbeat and
    metrics, and a note (a learner's: whether its update steps compile, run compiled or eager).

    ``last_seen``: service id -> wall_time of its newest metrics; ``silence_s``: heartbeat
    age past which a service counts as dead (the supervisor's liveness window)."""
    now = time.time()
    rows = []
    for sid, info in sorted(read_roster(run_dir).items()):
        if not isinstance(info, dict):
            continue
        beat = info.get("last_heartbeat")
        beat_age = round(now - beat, 1) if isinstance(beat, (int, float)) else None
        seen = last_seen.get(sid)
        rows.append({
            "service": sid, "role": info.get("role", ""), "pid": info.get("pid"),
            "state": info.get("state", "?"), "restarts": info.get("restarts", 0),
            "alive": info.get("state") in LIVE_STATES and (beat_age is None or beat_age <= silence_s),
            "heartbeat_age_s": beat_age,
            "metrics_age_s": None if seen is None else round(max(wall_time - seen, 0.0), 1),
            "note": (notes or {}).get(sid, ""),
        })
    return rows
