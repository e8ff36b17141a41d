"""A clean end of a run loses nothing a sampler made, and the warm-up is the run's.

Real `spreeze train` processes on real ipc:// sockets: two local samplers, a budget stop
while replay's rate limiter holds inserts back. The ledger record must show made = stored
for every sampler, and the random steps of all samplers must add up to warmup_steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.test_integration import records, train


@pytest.mark.timeout(200)
def test_budget_stop_stores_everything_made_and_warmup_is_exact(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = train(run, "--total-steps", "2500", "sampler.num_samplers=2", "sampler.warmup_steps=700",
                 "replay.min_size=500", "replay.tolerance=0.05", "eval.every_updates=100000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "budget of 2,500 env steps reached" in proc.stdout
    [ledger] = records(run, "ledger")
    rows = ledger["samplers"]
    assert set(rows) == {"sampler-0", "sampler-1"}, ledger
    for sid, row in rows.items():
        assert row["made"] > 0 and row["made"] == row["stored"] and row["rejected"] == 0, (sid, row)
    assert sum(row["random"] for row in rows.values()) == 700 == ledger["warmup_granted"]
    assert "ledger: made = stored for 2 sampler(s)" in proc.stdout
    for sid in rows:
        log = (run / "logs" / f"{sid}.log").read_text()
        assert "not acknowledged as stored" not in log, log[-2000:]
    replay = [r for r in records(run, "metrics") if r.get("service") == "replay"][-1]
    assert replay["inserted"] == sum(row["stored"] for row in rows.values())
    # replay reads nothing past the budget: beyond it only what the samplers had in flight (the
    # window of unacknowledged pushes), the push being made, and one more push that a sampler may
    # finish before the stop reaches it (seen with eager learners: 3,196 = 2,500 + 11 pushes of 64)
    sc = yaml.safe_load((run / "config.yaml").read_text())["sampler"]
    batch, window = sc["steps_per_push"] * sc["envs_per_sampler"], sc["ack_window"]
    assert replay["inserted"] <= 2500 + 2 * (window + 2) * batch, replay["inserted"]


@pytest.mark.timeout(120)
def test_a_run_stops_at_its_budget_and_promptly(tmp_path: Path) -> None:
    """One sampler: replay's count ends on the budget itself (the sampler stops there), and the
    run is over within seconds of reaching it, the evaluator's last evaluation included."""
    run = tmp_path / "run"
    proc = train(run, "--total-steps", "3000", "learner.compile=false", "eval.episodes=1",
                 "sampler.num_samplers=1", "supervisor.progress_every=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    replay = [r for r in records(run, "metrics") if r.get("service") == "replay"]
    assert replay[-1]["inserted"] == 3000, replay[-1]
    reached = next(r["wall_time"] for r in replay if r["inserted"] >= 3000)
    [ledger] = records(run, "ledger")
    assert ledger["wall_time"] - reached < 10, (reached, ledger["wall_time"])  # not a 20 s stop grace
    at_budget = [line for line in proc.stdout.splitlines() if "steps 3,000/3,000" in line]
    assert at_budget and all(line.endswith("| left finishing") for line in at_budget), at_budget


def test_a_budget_the_warmup_uses_up_is_refused(tmp_path: Path) -> None:
    proc = train(tmp_path / "run", "--total-steps", "900", timeout=60)  # replay.min_size=1000
    assert proc.returncode == 2
    assert ("total_steps=900 is under the 1000-step warm-up (replay.min_size=1000): the learner would make no update"
            in proc.stderr), proc.stderr
    assert not (tmp_path / "run").exists()
