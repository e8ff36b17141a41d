"""The tables of `spreeze results` (bench/results.py): one summary row per variant over its
seeds, the Markdown section of a command (provenance, table, which ds sparsity matches
dense, what the numbers are) and the raw JSON beside it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from spreeze.bench.runs import median_reached

Record = dict[str, Any]


# ------------------------------------------------------------------ summary

def summarize(records: list[Record]) -> list[Record]:
    """One row per variant (in first-seen order) over its successful runs."""
    groups: dict[tuple[Any, ...], list[Record]] = {}
    for r in records:
        if "error" not in r:
            groups.setdefault((r["algo"], r["network"], r["sparsity_target"]), []).append(r)
    return [summary_row(runs) for runs in groups.values()]


def mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample std (0 with one value) of the values present; (None, None) without any."""
    present = [v for v in values if v is not None]
    if not present:
        return None, None
    return statistics.fmean(present), statistics.stdev(present) if len(present) > 1 else 0.0


def summary_row(runs: list[Record]) -> Record:
    """Mean ± sample std of the runs' returns, time to threshold, median wall-clock, the networks' sizes."""
    returns = [r["return"] for r in runs if r["return"] is not None]
    flops = [r["flops_ratio"] for r in runs if r["flops_ratio"] is not None]
    first = runs[0]
    mean, std = mean_std(returns)
    final_mean, final_std = mean_std([r.get("final_return") for r in runs])
    best_mean, best_std = mean_std([r.get("best_return") for r in runs])
    steps = [r.get("steps_to_threshold") for r in runs]
    return {"algo": first["algo"], "network": first["network"], "sparsity_target": first["sparsity_target"],
            "sparsity": first["sparsity"], "seeds": len(runs), "returns": len(returns),
            "return_mean": mean, "return_std": std, "final_mean": final_mean, "final_std": final_std,
            "best_mean": best_mean, "best_std": best_std, "threshold": first.get("threshold"),
            "reached": sum(v is not None for v in steps), "steps_to_threshold": median_reached(steps),
            "seconds_to_threshold": median_reached([r.get("seconds_to_threshold") for r in runs]),
            "last_evals": min(r["last_evals"] for r in runs), "params": first["params"],
            "nonzero": first["nonzero"], "flops_ratio": statistics.fmean(flops) if flops else None,
            "wall_s": statistics.median(r["wall_s"] for r in runs)}


def dense_row(rows: list[Record], algo: str) -> Record | None:
    return next((r for r in rows if r["algo"] == algo and r["network"] == "dense"
                 and r["return_mean"] is not None), None)


def matches_dense(row: Record, dense: Record) -> bool:
    """Not worse than dense by more than dense's std (better than dense counts as matching)."""
    return row["return_mean"] is not None and row["return_mean"] >= dense["return_mean"] - dense["return_std"]


def highest_matching(rows: list[Record], algo: str) -> Record | None:
    """The ds row of ``algo`` with the highest sparsity that matches dense, if any."""
    dense = dense_row(rows, algo)
    if dense is None:
        return None
    ok = [r for r in rows if r["algo"] == algo and r["network"] == "ds" and matches_dense(r, dense)]
    return max(ok, key=lambda r: r["sparsity"], default=None)


def match_line(rows: list[Record], algo: str) -> str | None:
    """The sentence about ``algo``'s highest ds sparsity matching dense (None: nothing to compare)."""
    dense = dense_row(rows, algo)
    if dense is None or not any(r["algo"] == algo and r["network"] == "ds" and r["return_mean"] is not None
                                for r in rows):
        return None
    best = highest_matching(rows, algo)
    ref = f"dense {_return(dense)}"
    if best is None:
        return f"{algo}: no ds sparsity is within one std of dense ({ref})."
    return (f"{algo}: highest ds sparsity within one std of dense: {_pct(best['sparsity'])} "
            f"({_return(best)} vs {ref}).")


# ------------------------------------------------------------------ Markdown and JSON

COLUMNS = ("algo", "network", "sparsity", "return", "final", "best", "steps to", "seconds to", "seeds",
           "params", "non-zero", "train FLOPs vs dense", "wall s (median)")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _return(row: Record, key: str = "return") -> str:
    mean, std = row.get(f"{key}_mean"), row.get(f"{key}_std")
    return "n/a" if mean is None else f"{mean:.1f} ± {std:.1f}"


def _to_threshold(row: Record, key: str, fmt: str) -> str:
    """Median to threshold with how many seeds reached it, e.g. '48,000 (3/3)' or 'no (1/3)'."""
    if row.get("threshold") is None:
        return "n/a"
    value = row.get(key)
    return f"{'no' if value is None else format(value, fmt)} ({row.get('reached', 0)}/{row['seeds']})"


def table(rows: list[Record], last: int) -> str:
    """The Markdown table of the summary rows."""
    threshold = next((r["threshold"] for r in rows if r.get("threshold") is not None), None)
    to = f" {threshold:g}" if threshold is not None else " threshold"
    heads = [f"return (last {last} evals)" if c == "return" else f"{c}{to} (median)" if c.endswith(" to") else c
             for c in COLUMNS]
    lines = ["| " + " | ".join(heads) + " |", "|---|---|" + "---:|" * (len(COLUMNS) - 2)]
    for r in rows:
        ret = _return(r) + (f" (last {r['last_evals']})" if r["last_evals"] < last else "")
        cells = [r["algo"], r["network"], "-" if r["network"] == "dense" else _pct(r["sparsity"]), ret,
                 _return(r, "final"), _return(r, "best"), _to_threshold(r, "steps_to_threshold", ",.0f"),
                 _to_threshold(r, "seconds_to_threshold", ".0f"), str(r["seeds"]), f"{r['params']:,}",
                 f"{r['nonzero']:,}",
                 "n/a" if r["flops_ratio"] is None else f"{r['flops_ratio']:.2f}x", f"{r['wall_s']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markers(key: str) -> tuple[str, str]:
    return f"<!-- spreeze-results {key} -->", f"<!-- /spreeze-results {key} -->"


def section(meta: Record, records: list[Record], planned: int) -> str:
    """This command's section: title, provenance, table, the matching-dense lines, definitions."""
    rows = summarize(records)
    start, end = markers(meta["key"])
    m = meta["machine"]
    status = "" if len(records) == planned else " (stopped)" if meta.get("stopped") else " (in progress)"
    done = f"{len(records)}/{planned} runs done{status}"
    failed = [f"{r['variant']} seed {r['seed']}" for r in records if "error" in r]
    title = (f"## {' '.join(meta['algos'])}: {', '.join(meta['modes'])} on {meta['env']} "
             f"({meta['total_steps']:,} steps, seeds {' '.join(map(str, meta['seeds']))})")
    lines = [start, title, "",
             f"- command: `{meta['command']}`", f"- date: {meta['date']}",
             f"- machine: {m['cores']} cores, {m['cpu']}; GPU: {m['gpu']}",
             f"- commit: {meta['commit'] or 'unknown'}",
             f"- {done}; run dirs under `{meta['runs_dir']}`; raw numbers: `{meta['json']}` key `{meta['key']}`"]
    if meta.get("curves"):
        lines.append(f"- learning curves per row: `{meta['curves']}/<row>/learning_curves.png`")
    if failed:
        lines.append(f"- failed runs (errors in the JSON): {', '.join(failed)}")
    lines += ["", table(rows, meta["last"]), ""]
    found = [line for algo in meta["algos"] if (line := match_line(rows, algo))]
    if found:
        lines += [*found, ""]
    lines += [definitions(meta["last"]), end]
    return "\n".join(lines)


def definitions(last: int) -> str:
    """The paragraph under every table saying what its numbers are."""
    return (f"Return: per run the mean of its last {last} evaluations (fewer when it has fewer: shown "
            "as \"last k\"), then mean ± sample std over seeds; final and best: each run's last and highest "
            "evaluation, mean ± std over seeds. Steps and seconds to the threshold: each run's first "
            "evaluation at or above it (seconds since the command started), median over seeds (\"no\" when "
            "most seeds never reached it), with the seeds that did. Params: actor + twin critics (online "
            "networks). Sparsity: zeros of the sparse hidden layers together. FLOPs: the learners' "
            "flops_ratio of actor and critics, weighted by each network's dense training FLOPs per "
            "critic update. Within one std of dense: mean >= dense mean - dense std.")


def replace_section(text: str, key: str, body: str, header: str) -> str:
    """``text`` with the section of ``key`` replaced by ``body``, or ``body`` appended."""
    start, end = markers(key)
    i = text.find(start)
    j = text.find(end, i) if i >= 0 else -1
    if j >= 0:
        return text[:i] + body + text[j + len(end):]
    return (text.rstrip("\n") + "\n\n" if text.strip() else header) + body + "\n"


def write_results(md: Path, meta: Record, records: list[Record], planned: int) -> None:
    """Write (or replace) this command's section in ``md`` and its raw numbers in the JSON."""
    md.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Spreeze results: {meta['env']}\n\nWritten by `spreeze results`, one section per "
              "command (rerunning a command replaces its section).\n\n")
    old = md.read_text() if md.exists() else ""
    md.write_text(replace_section(old, meta["key"], section(meta, records, planned), header))
    path = Path(meta["json"])
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError:
        data = {}
    data[meta["key"]] = {**meta, "planned_runs": planned, "runs": records, "rows": summarize(records)}
    path.write_text(json.dumps(data, indent=1) + "\n")
