"""The dashboard's series stay bounded over a long run, and an open page follows a thinning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spreeze.common.metric_series import MetricSeries
from spreeze.services.visualizer.web import Cursor


class Page:
    """The visualizer's side of a stream (services/visualizer/web.py's Source)."""

    def __init__(self, series: MetricSeries) -> None:
        self.series, self.videos_dir, self.push_every, self.running = series, Path("."), 1.0, True

    def wall_time(self) -> float:
        return 0.0

    def health(self) -> list[dict[str, Any]]:
        return []

    def video(self) -> dict[str, Any]:
        return {}


def replay_row(t: float, inserted: int) -> dict[str, Any]:
    return {"kind": "metrics", "wall_time": t, "service": "replay", "inserted": inserted, "replay_size": inserted,
            "insert_stall_s": 0.1}


def test_a_series_over_its_bound_keeps_every_second_point_and_its_newest() -> None:
    s = MetricSeries(replay_capacity=1_000_000, max_points=100)
    for i in range(1, 1001):
        s.take(replay_row(float(i), i * 10))
    fill = s.points["replay:fill"]
    assert 50 <= len(fill) <= 100
    assert fill[-1] == [1000.0, 10_000 / 1_000_000]  # the newest point is always kept
    assert fill[0][0] <= 16  # the start of the run is still drawn
    steps = [p[0] for p in fill]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert s.generation > 0


def test_events_over_their_bound_keep_the_newest_half() -> None:
    s = MetricSeries(max_events=10)
    for i in range(25):
        s.take({"kind": "event", "wall_time": float(i), "event": "restart", "reason": f"r{i}"})
    assert [e["reason"] for e in s.events][-1] == "r24"
    assert 5 <= len(s.events) <= 10 and s.generation == 3


def test_an_open_page_is_sent_everything_anew_after_a_thinning() -> None:
    s = MetricSeries(replay_capacity=1000, max_points=10)
    page, cursor = Page(s), Cursor()
    for i in range(1, 9):
        s.take(replay_row(float(i), i))
    first = cursor.update(page)
    assert first["reset"] and len(first["points"]["replay:fill"]) == 8
    s.take(replay_row(9.0, 9))
    assert cursor.update(page)["points"]["replay:fill"] == [[9.0, 0.009]]  # only what is new
    s.take(replay_row(10.0, 10))
    s.take(replay_row(11.0, 11))  # 11 points > 10: thinned to 6
    again = cursor.update(page)
    assert again["reset"] and again["points"]["replay:fill"] == s.points["replay:fill"]
    assert not cursor.update(page)["reset"]
