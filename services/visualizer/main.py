"""Visualizer: the metrics bus made visible, live in the browser, in TensorBoard files and
(optionally) in Weights & Biases.

Reads top to bottom: it subscribes to the bus (metrics_out), loads what metrics.jsonl
already holds (so a restarted visualizer shows the whole run), serves the dashboard over
HTTP (services/visualizer/web.py) and announces its URL with an Event that the supervisor
prints; then every message becomes points of the charts (common/metric_series.py), which
open pages receive as Server-Sent Events and TensorBoard (and W&B) receive as scalars.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from spreeze.common.compile_state import compile_state
from spreeze.common.errors import ConfigError, TransportTimeout
from spreeze.common.disk import write_atomically
from spreeze.common.metric_series import MetricSeries, message_row
from spreeze.common.service import Service
from spreeze.proto.messages import Event, Message
from spreeze.services.visualizer.health import health_rows
from spreeze.services.visualizer.web import make_app

log = logging.getLogger(__name__)

RECV_TIMEOUT = 0.5  # seconds: the loop wakes this often to re-announce and to notice a stop
ANNOUNCE_RETRY = 2.0  # seconds: re-send the URL Event until it comes back on the bus (PUB drops early sends)
VIDEO_OFF = "videos are off: set eval.video_every=N to record one evaluation episode every N evaluations"


class Visualizer(Service):
    ROLE = "visualizer"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_dir = Path(self.cfg.run_dir)
        self.videos_dir = self.run_dir / "videos"
        self.push_every = self.cfg.visualizer.push_every
        self.bus = self.channel("metrics_out", binding=False)  # subscribe first: history, then live
        self.series = MetricSeries(self.cfg.replay.capacity)
        self.start_unix = self.load_history()
        self.sinks = self.open_sinks()  # TensorBoard, W&B: each takes every live point and event
        for sink in self.sinks:
            self.series.listeners.append(sink.scalar)
        self.url = ""
        self.announced, self.announce_at = False, 0.0
        self.runner: web.AppRunner | None = None

    def open_sinks(self) -> list[Any]:
        vc = self.cfg.visualizer
        sinks: list[Any] = []
        if vc.tensorboard:
            from spreeze.services.visualizer.tensorboard import TensorBoardWriter

            sinks.append(TensorBoardWriter(self.run_dir / "tensorboard", self.series, self.disk))
        if vc.wandb:
            from spreeze.services.visualizer.wandb_logger import WandbLogger

            sinks.append(WandbLogger(self.cfg, self.run_dir, self.series))
        return sinks

    def wall_time(self) -> float:
        """Seconds since the run started (the time axis of metrics.jsonl)."""
        return round(time.time() - self.start_unix, 3)

    def load_history(self) -> float:
        """Feed the rows metrics.jsonl holds already; return the run's start (unix time)."""
        start = time.time()
        try:
            lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return start
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line may be half written
            if isinstance(row, dict) and row.get("kind") == "start" and isinstance(row.get("unix_time"), float):
                start = row["unix_time"]
            elif isinstance(row, dict):
                self.series.take(row)
        return start

    # ------------------------------------------------------------ serving
    async def serve(self) -> None:
        await self.start_web()
        while self.running:
            if not self.announced and time.monotonic() >= self.announce_at:
                self.announce()
            try:
                batch = await self.bus.recv_many(256, timeout=RECV_TIMEOUT)
            except TransportTimeout:
                continue
            for _, msg in batch:
                self.take(msg)

    def take(self, msg: Message) -> None:
        row = message_row(msg, self.wall_time())
        if row is None:
            return
        self.series.take(row)
        if row["kind"] == "event":
            if row["event"] == "dashboard" and row.get("url") == self.url:
                self.announced = True
            for sink in self.sinks:
                sink.event(row)

    async def start_web(self) -> None:
        vc = self.cfg.visualizer
        sock = socket.socket(socket.AF_INET6 if ":" in vc.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((vc.host, vc.port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"visualizer.host={vc.host!r} visualizer.port={vc.port}: cannot serve the "
                              f"dashboard there: {exc}") from None
        self.runner = web.AppRunner(make_app(self), access_log=None)
        await self.runner.setup()
        await web.SockSite(self.runner, sock).start()
        host, port = sock.getsockname()[:2]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
        url = (self.url + "\n").encode()
        self.disk.attempt("dashboard.url", lambda: write_atomically(self.run_dir / "dashboard.url", url))
        log.info("dashboard at %s", self.url)

    def announce(self) -> None:
        self.metrics_out.send_nowait(Event("dashboard", f"live dashboard at {self.url}",
                                           {"url": self.url, "notify": True}))
        self.announce_at = time.monotonic() + ANNOUNCE_RETRY

    # ------------------------------------------------------------ what the page shows
    def health(self) -> list[dict[str, Any]]:
        sc = self.cfg.supervisor
        notes = {sid: compile_state(values) for sid, values in self.series.learners.items()}
        return health_rows(self.run_dir, self.series.last_seen, self.wall_time(),
                           sc.liveness * sc.heartbeat_interval, notes)

    def video(self) -> dict[str, Any]:
        """The newest recorded episode, and why there is none when there is none."""
        files = sorted(self.videos_dir.glob("*.mp4"), key=lambda p: p.stat().st_mtime) \
            if self.videos_dir.is_dir() else []
        note = VIDEO_OFF if self.cfg.eval.video_every == 0 else ""
        for row in reversed(self.series.events):
            if row.get("event") == "video_unavailable":
                note = str(row.get("reason", ""))
                break
        latest = files[-1].name if files else None
        return {"url": f"/videos/{latest}" if latest else None, "name": latest, "note": note}

    def counters(self) -> dict[str, Any]:
        return {"series": len(self.series.points), "events": len(self.series.events)}

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        for sink in self.sinks:
            sink.close()
