"""`spreeze results`: run reading, summary statistics, the matching-dense rule and the results
file, on run directories fabricated in tmp_path; and one tiny end-to-end run on Pendulum."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from spreeze.bench import results as R
from spreeze.bench import results_table as T
from spreeze.bench.runs import FINISHED, finished_seed, git_commit, read_evals
from spreeze.common.config import load_config, to_dict

pytestmark = pytest.mark.timeout(60)
SMALL = ["env=Pendulum-v1", "td3.hidden=[32,32]"]
# Pendulum (obs 3, act 1), hidden 32-32: actor 3*32+32 + 32*32+32 + 32+1, twin critics 2 x (4*32+32 + 1056 + 33)
DENSE_PARAMS = 1217 + 2 * 1249


def fake_run(run_dir: Path, returns: list[float], *overrides: str, learner: dict[str, float] | None = None,
             service: str = "learner") -> Path:
    """A run dir as `spreeze train` leaves it: config.yaml and metrics.jsonl with these evals."""
    run_dir.mkdir(parents=True)
    cfg = load_config(None, [*SMALL, f"run_dir={run_dir}", *overrides])
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    rows: list[dict[str, Any]] = [{"kind": "start", "wall_time": 0.0, "unix_time": 1.7e9}]
    for i, ret in enumerate(returns):
        rows.append({"kind": "metrics", "wall_time": i + 0.5, "service": service, "updates": 100 * i,
                     **(learner or {})})
        rows.append({"kind": "eval", "wall_time": i + 1.0, "env_steps": 1000 * (i + 1), "updates": 100 * i,
                     "return_mean": ret, "return_std": 0.0, "length_mean": 200.0, "episodes": 1,
                     "actor_version": i})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def sparse_metrics(sparsity: float, ra: float, rc: float) -> dict[str, float]:
    return {"sparsity/actor": sparsity, "sparsity/critic": sparsity, "flops_ratio/actor": ra,
            "flops_ratio/critic": rc, "dense_flops/actor": 100.0, "dense_flops/critic": 300.0}


# ------------------------------------------------------------------ one run

def test_a_finished_seed_is_kept_and_an_unfinished_one_removed(tmp_path: Path) -> None:
    """A run directory holding a finished run of this commit is read back (its measured
    seconds); one without that record, or from other code, is removed to be trained afresh."""
    done = tmp_path / "done"
    done.mkdir()
    (done / FINISHED).write_text(json.dumps({"command_wall_s": 812.5, "start_s": 3.25, "commit": git_commit()}))
    assert finished_seed(done) == {"command_wall_s": 812.5, "start_s": 3.25, "kept": True}
    for name, marker in (("unfinished", None), ("other-code", {"command_wall_s": 1, "start_s": 1, "commit": "0" * 40}),
                         ("corrupt", "{not json")):
        run_dir = tmp_path / name
        (run_dir / "logs").mkdir(parents=True)
        if marker is not None:
            (run_dir / FINISHED).write_text(marker if isinstance(marker, str) else json.dumps(marker))
        assert finished_seed(run_dir) is None and not run_dir.exists()
    assert finished_seed(tmp_path / "never-made") is None


def test_last_mean_takes_the_last_n_or_all_when_fewer() -> None:
    evals = [{"return_mean": float(x)} for x in range(1, 13)]
    assert R.last_mean(evals, 10) == (statistics.fmean(range(3, 13)), 10)
    assert R.last_mean(evals[:4], 10) == (2.5, 4)
    assert R.last_mean([], 10) == (None, 0)


def test_reads_only_the_newest_run_of_a_reused_dir(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "r", [-900.0])
    with open(run / "metrics.jsonl", "a") as f:  # a second run in the same dir appends
        f.write(json.dumps({"kind": "start", "wall_time": 0.0, "unix_time": 2e9}) + "\n")
        f.write(json.dumps({"kind": "eval", "wall_time": 3.0, "env_steps": 500, "updates": 1,
                            "return_mean": -100.0}) + "\n")
    evals, started = read_evals(run)
    assert started == 2e9 and [e["return_mean"] for e in evals] == [-100.0]


def test_run_record_dense(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "d", [-1500.0, -1000.0, -400.0, -200.0])
    rec = R.run_record(R.Variant("td3", "dense"), 0, run, 12.34, last=3, threshold=-500.0, start_s=1.5)
    assert (rec["return"], rec["last_evals"], rec["evals"], rec["final_return"], rec["best_return"]) == (
        pytest.approx(-1600 / 3), 3, 4, -200.0, -200.0)
    # the first evaluation at or above -500 is the third: 3,000 env steps, 3 s into the run + 1.5 s start-up
    assert (rec["steps_to_threshold"], rec["seconds_to_threshold"]) == (3000, 4.5)
    never = R.run_record(R.Variant("td3", "dense"), 0, run, 12.34, last=3, threshold=0.0)
    assert (never["steps_to_threshold"], never["seconds_to_threshold"]) == (None, None)
    assert (rec["params"], rec["nonzero"], rec["sparsity"], rec["flops_ratio"]) == (
        DENSE_PARAMS, DENSE_PARAMS, 0.0, 1.0)
    assert rec["wall_s"] == 12.3 and rec["variant"] == "td3-dense"


def test_run_record_sparse_split_learners(tmp_path: Path) -> None:
    critic = {k: v for k, v in sparse_metrics(0.5, 0.4, 0.6).items() if k.endswith("/critic")}
    run = fake_run(tmp_path / "s", [-300.0], "sparse.network=ds", "sparse.sparsity=0.5",
                   "learner.mode=split", service="critic_learner", learner=critic)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    actor = {"sparsity/actor": 0.5, "flops_ratio/actor": 0.2, "dense_flops/actor": 100.0}
    rows.insert(1, {"kind": "metrics", "wall_time": 0.1, "service": "actor_learner", **actor})
    rows.append({"kind": "metrics", "wall_time": 9.0, "service": "replay", "flops_ratio/actor": 9.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec = R.run_record(R.Variant("td3", "ds", 0.5), 1, run, 1.0, last=10)
    # the two learners' metrics merged; replay's number is not a learner's
    assert rec["flops_ratio"] == pytest.approx((0.2 * 100 + 0.6 * 300) / 400)
    assert (rec["sparsity_actor"], rec["sparsity_critic"]) == (0.5, 0.5)
    assert rec["sparsity"] == pytest.approx(0.5, abs=0.01) and rec["params"] == DENSE_PARAMS
    zeros = rec["params"] - rec["nonzero"]  # only the hidden weights are sparse
    hidden = (3 * 32 + 32 * 32) + 2 * (4 * 32 + 32 * 32)
    assert zeros == pytest.approx(hidden * rec["sparsity"], abs=1)
    assert (rec["return"], rec["last_evals"], rec["sparsity_target"]) == (-300.0, 1, 0.5)


# ------------------------------------------------------------------ summary and rule

def records_for(tmp_path: Path) -> list[dict[str, Any]]:
    """3 seeds dense and ds at 0.5 / 0.8 / 0.9, with 12 evals each (last 10 averaged)."""
    plan = {R.Variant("td3", "dense"): [-200.0, -300.0, -250.0],
            R.Variant("td3", "ds", 0.5): [-180.0, -220.0, -260.0],
            R.Variant("td3", "ds", 0.8): [-280.0, -290.0, -300.0],
            R.Variant("td3", "ds", 0.9): [-400.0, -500.0, -450.0]}
    out = []
    for v, finals in plan.items():
        for seed, final in enumerate(finals):
            extra = [f"sparse.network={v.network}", *v.overrides()]
            returns = [-1500.0, -1500.0] + [final] * 10  # the first two fall outside the last 10
            learner = sparse_metrics(v.sparsity, 0.5, 0.5) if v.sparsity else None
            run = fake_run(tmp_path / f"{v.name}-s{seed}", returns, *extra, learner=learner)
            out.append(R.run_record(v, seed, run, 10.0 + seed, last=10, threshold=THRESHOLD))
    return out


THRESHOLD = -275.0  # dense reaches it in seeds 0 and 2 (final -200, -250), at their third evaluation


def test_summary_means_stds_and_rule(tmp_path: Path) -> None:
    records = records_for(tmp_path)
    records.append({**R.Variant("td3", "ds", 0.8).fields(), "seed": 9, "run_dir": "x", "error": "boom"})
    rows = T.summarize(records)
    assert [(r["network"], r["sparsity_target"], r["seeds"]) for r in rows] == [
        ("dense", None, 3), ("ds", 0.5, 3), ("ds", 0.8, 3), ("ds", 0.9, 3)]  # the failed run is left out
    dense = rows[0]
    assert dense["return_mean"] == pytest.approx(-250.0) and dense["return_std"] == pytest.approx(50.0)
    assert rows[2]["return_std"] == pytest.approx(statistics.stdev([-280, -290, -300]))
    assert dense["wall_s"] == 11.0 and dense["last_evals"] == 10 and dense["flops_ratio"] == 1.0
    assert rows[1]["flops_ratio"] == pytest.approx(0.5)
    assert [round(r["sparsity"], 2) for r in rows] == [0.0, 0.5, 0.8, 0.9]
    assert (dense["final_mean"], dense["best_mean"]) == (pytest.approx(-250.0), pytest.approx(-250.0))
    assert (dense["reached"], dense["steps_to_threshold"], dense["seconds_to_threshold"]) == (2, 3000, 3.0)
    assert (rows[3]["reached"], rows[3]["steps_to_threshold"]) == (0, None)  # ds 0.9 never: no median
    # dense -250 ± 50: ds 0.8 (-290) is within one std, 0.9 (-450) is not
    best = T.highest_matching(rows, "td3")
    assert best is not None and best["sparsity_target"] == 0.8
    line = T.match_line(rows, "td3")
    assert line is not None and "80.0%" in line and "-290.0 ± 10.0 vs dense -250.0 ± 50.0" in line


def row(network: str, sparsity: float, mean: float | None, std: float = 0.0) -> dict[str, Any]:
    return {"algo": "td3", "network": network, "sparsity": sparsity, "return_mean": mean, "return_std": std}


def test_rule_counts_better_than_dense_and_can_find_none() -> None:
    rows = [row("dense", 0.0, 100.0, 10.0), row("ds", 0.5, 85.0), row("ds", 0.9, 150.0), row("static", 0.95, 99.0)]
    best = T.highest_matching(rows, "td3")
    assert best is not None and best["sparsity"] == 0.9  # beating dense is matching it; static is no candidate
    rows = [row("dense", 0.0, 100.0, 10.0), row("ds", 0.5, 89.9), row("ds", 0.8, None)]
    assert T.highest_matching(rows, "td3") is None
    assert T.match_line(rows, "td3") == "td3: no ds sparsity is within one std of dense (dense 100.0 ± 10.0)."
    assert T.match_line([row("dense", 0.0, 1.0)], "td3") is None  # nothing to compare
    assert T.match_line([row("ds", 0.5, 1.0)], "td3") is None
    assert T.highest_matching([row("dense", 0.0, 100.0), row("ds", 0.5, 100.0)], "td3") is not None  # one seed: std 0


# ------------------------------------------------------------------ the files

def meta(tmp_path: Path, key: str, command: str) -> dict[str, Any]:
    return {"key": key, "command": command, "date": "2025-01-02T03:04:05+00:00",
            "machine": {"cores": 2, "cpu": "Test CPU 3000", "gpu": "none"}, "commit": "abc123",
            "env": "Pendulum-v1", "algos": ["td3"], "modes": ["dense", "ds"], "seeds": [0, 1, 2],
            "total_steps": 12000, "last": 10, "sparsities": [0.5, 0.8, 0.9], "config": None,
            "overrides": [], "runs_dir": "runs/x", "json": str(tmp_path / "Pendulum-v1.json")}


def test_results_file_sections_and_json(tmp_path: Path) -> None:
    records = records_for(tmp_path / "runs")
    md = tmp_path / "Pendulum-v1.md"
    first = meta(tmp_path, "aaaa", "spreeze results --env Pendulum-v1 --sparsities 0.5 0.8 0.9")
    T.write_results(md, first, records[:5], 12)
    text = md.read_text()
    assert text.startswith("# Spreeze results: Pendulum-v1") and "5/12 runs done (in progress)" in text
    T.write_results(md, first, records, 12)  # same command: its section is replaced
    text = md.read_text()
    assert text.count("<!-- spreeze-results aaaa -->") == 1 and "12/12 runs done;" in text
    for needed in ("- command: `spreeze results --env Pendulum-v1 --sparsities 0.5 0.8 0.9`",
                   "- date: 2025-01-02T03:04:05+00:00", "- machine: 2 cores, Test CPU 3000; GPU: none",
                   "- commit: abc123", "td3: highest ds sparsity within one std of dense: 80.0%"):
        assert needed in text
    table = [line for line in text.splitlines() if line.startswith("| td3 ")]
    assert len(table) == 4
    assert table[0] == (f"| td3 | dense | - | -250.0 ± 50.0 | -250.0 ± 50.0 | -250.0 ± 50.0 | 3,000 (2/3) | 3 (2/3) "
                        f"| 3 | {DENSE_PARAMS:,} | {DENSE_PARAMS:,} | 1.00x | 11 |")
    assert table[2].startswith("| td3 | ds | 80.0% | -290.0 ± 10.0 | ") and "| no (0/3) | no (0/3) | 3 |" in table[2]
    assert "| 0.50x |" in table[2] and "steps to -275 (median)" in text
    T.write_results(md, meta(tmp_path, "bbbb", "spreeze results --last 3"), records[:3], 3)  # another command
    text = md.read_text()
    assert text.index("spreeze-results aaaa") < text.index("spreeze-results bbbb") and text.count("# Spreeze") == 1
    assert "| td3 | dense | - | -250.0 ± 50.0 |" in text.split("spreeze-results bbbb -->")[1]
    data = json.loads((tmp_path / "Pendulum-v1.json").read_text())
    assert sorted(data) == ["aaaa", "bbbb"] and len(data["aaaa"]["runs"]) == 12
    assert data["aaaa"]["machine"]["cpu"] == "Test CPU 3000" and len(data["aaaa"]["rows"]) == 4


def test_learning_curves_per_row(tmp_path: Path) -> None:
    records = records_for(tmp_path / "runs")
    records.append({**R.Variant("td3", "ds", 0.8).fields(), "seed": 9, "run_dir": "x", "error": "boom"})
    paths = R.draw_curves(records, tmp_path / "curves")
    assert [p.relative_to(tmp_path / "curves").as_posix() for p in paths] == [
        f"{name}/learning_curves.png" for name in ("td3-dense", "td3-ds-sp0.5", "td3-ds-sp0.8", "td3-ds-sp0.9")]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_fewer_evals_than_last_are_marked(tmp_path: Path) -> None:
    rec = R.run_record(R.Variant("td3", "dense"), 0, fake_run(tmp_path / "r", [-10.0, -20.0]), 1.0, last=10)
    assert "| -15.0 ± 0.0 (last 2) |" in T.table(T.summarize([rec]), last=10)


def test_cpu_model_and_machine(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Fancy CPU @ 3GHz\n\nprocessor\t: 1\n")
    assert R.cpu_model(info) == "Fancy CPU @ 3GHz"
    assert R.cpu_model(tmp_path / "missing")  # platform's guess, never empty
    m = R.machine_info()
    assert m["cores"] >= 1 and m["cpu"] and m["gpu"]


def test_arguments_overrides_anywhere_and_variants() -> None:
    args = R.parse(["--modes", "dense", "ds", "replay.min_size=500", "--seeds", "0", "td3.hidden=[8,8]",
                    "--sparsities", "0.5", "0.9"])
    assert args.modes == ["dense", "ds"] and args.seeds == [0]
    assert args.overrides == ["replay.min_size=500", "td3.hidden=[8,8]"]
    assert [v.name for v in R.variants(["td3"], args.modes, args.sparsities)] == [
        "td3-dense", "td3-ds-sp0.5", "td3-ds-sp0.9"]
    assert R.Variant("td3", "ds", 0.9).overrides() == ["sparse.sparsity=0.9"]
    assert R.experiment_key(args) != R.experiment_key(R.parse(["--modes", "dense", "ds"]))
    with pytest.raises(SystemExit):
        R.parse(["--modes", "dense", "--sparsities", "0.5"])  # a sweep needs ds


def test_plan_stands_for_the_algorithm_the_start_plan_picks(capsys: pytest.CaptureFixture[str]) -> None:
    hopper = R.parse(["--env", "Hopper-v5", "--algos", "plan"])
    assert R.planned_algos(hopper) == ["crossq"]  # ends episodes when it falls
    assert "algo=crossq: Hopper-v5 ends episodes when the agent falls" in capsys.readouterr().out
    assert R.planned_algos(R.parse(["--env", "HalfCheetah-v5", "--algos", "plan", "sac"])) == ["td3", "sac"]
    assert R.planned_algos(R.parse(["--env", "Hopper-v5", "--algos", "plan", "td3.hidden=[8,8]"])) == ["td3"]
    assert R.planned_algos(R.parse(["--env", "Hopper-v5", "--algos", "plan", "crossq"])) == ["crossq"]
    assert R.experiment_key(hopper) != R.experiment_key(R.parse(["--env", "Hopper-v5", "--algos", "crossq"]))
    with pytest.raises(SystemExit):
        R.parse(["--algos", "plans"])


# ------------------------------------------------------------------ end to end

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_results_end_to_end_pendulum(tmp_path: Path) -> None:
    out = tmp_path / "results" / "Pendulum-v1.md"
    cmd = [sys.executable, "-m", "spreeze.cli", "results", "--env", "Pendulum-v1", "--total-steps", "3000",
           "--seeds", "0", "--modes", "dense", "ds", "replay.min_size=500", "sampler.warmup_steps=500",
           "eval.every_updates=300", "eval.episodes=1", "sparse.sparsity=0.5", "--out", str(out),
           "--runs-dir", str(tmp_path / "runs")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=200, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| td3 ")]
    assert len(rows) == 2 and "| dense | - |" in rows[0] and "| ds | 50.0% |" in rows[1]
    assert "- command: `spreeze results --env Pendulum-v1" in text and "- machine: " in text
    assert "2/2 runs done;" in text
    data = json.loads(out.with_suffix(".json").read_text())
    (section,) = data.values()
    dense, ds = section["runs"]
    assert dense["evals"] >= 1 and ds["evals"] >= 1 and "error" not in ds
    assert ds["sparsity_actor"] == pytest.approx(0.5, abs=0.01)  # fused TD3 reports the actor too
    assert 0.4 < ds["flops_ratio"] < 0.7 and ds["nonzero"] < ds["params"] == dense["params"]
    # run again after the ds seed was left unfinished: dense is kept, ds trains afresh in its directory
    (Path(ds["run_dir"]) / FINISHED).unlink()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=200, check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[1/2] td3-dense seed 0 (finished by an earlier run of this command: kept)" in again.stdout
    assert "[2/2] td3-ds-50 seed 0: return" in again.stdout or "[2/2] td3-ds" in again.stdout
    assert "kept" not in [line for line in again.stdout.splitlines() if line.startswith("[2/2]")][0]
    (section,) = json.loads(out.with_suffix(".json").read_text()).values()
    assert section["runs"][0]["wall_s"] == dense["wall_s"] and "error" not in section["runs"][1]
