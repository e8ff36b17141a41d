"""The dashboard's HTTP side (aiohttp): one static page, JSON data endpoints, a live stream.

| path | what |
|---|---|
| `/` | the page (static/index.html + static/dashboard.js, no build step, nothing fetched from outside) |
| `/api/series` | every chart point so far: `{"points": {"<chart>:<label>": [[x, y(, std)], ...]}}` |
| `/api/health` | `{"services": [{service, role, pid, state, restarts, alive, heartbeat_age_s, metrics_age_s, note}]}` |
| `/api/events` | `{"events": [metrics.jsonl event rows]}`: restarts, tuning decisions, videos, ... |
| `/api/video` | `{"url": latest MP4 or null, "note": why there is none}` |
| `/api/stream` | Server-Sent Events: every `visualizer.push_every` s the new points and events, health, video |
| `/videos/<name>.mp4` | a recorded evaluation episode |
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from spreeze.common.metric_series import MetricSeries

STATIC = Path(__file__).parent / "static"
VIDEO_NAME = re.compile(r"^[\w.-]+\.mp4$")


class Source(Protocol):
    """What the pages are made of (the Visualizer service)."""

    series: MetricSeries
    videos_dir: Path
    push_every: float

    @property
    def running(self) -> bool: ...

    def wall_time(self) -> float: ...

    def health(self) -> list[dict[str, Any]]: ...

    def video(self) -> dict[str, Any]: ...


def make_app(src: Source) -> web.Application:
    async def page(_: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def static(request: web.Request) -> web.FileResponse:
        path = STATIC / request.match_info["name"]
        if path.parent != STATIC or not path.is_file():
            raise web.HTTPNotFound(text=f"no static file {request.match_info['name']!r}")
        return web.FileResponse(path)

    async def video_file(request: web.Request) -> web.FileResponse:
        name = request.match_info["name"]
        path = src.videos_dir / name
        if not VIDEO_NAME.match(name) or not path.is_file():
            raise web.HTTPNotFound(text=f"no video {name!r}")
        return web.FileResponse(path, headers={"Content-Type": "video/mp4"})

    async def series(_: web.Request) -> web.Response:
        return web.json_response({"wall_time": src.wall_time(), "points": src.series.points})

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"services": src.health()})

    async def events(_: web.Request) -> web.Response:
        return web.json_response({"events": src.series.events})

    async def video(_: web.Request) -> web.Response:
        return web.json_response(src.video())

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        cursor = Cursor()
        try:
            while src.running:
                await resp.write(f"data: {json.dumps(cursor.update(src))}\n\n".encode())
                await asyncio.sleep(src.push_every)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the page was closed, or we are shutting down
        return resp

    app = web.Application()
    app.add_routes([web.get("/", page), web.get("/static/{name}", static), web.get("/videos/{name}", video_file),
                    web.get("/api/series", series), web.get("/api/health", health),
                    web.get("/api/events", events), web.get("/api/video", video), web.get("/api/stream", stream)])
    return app


class Cursor:
    """What one open page has been sent: its next update carries only what is new.

    The first update of a stream has ``reset: true`` and everything so far, so a page
    that reconnects (EventSource does so by itself) starts over cleanly."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.events = 0
        self.first = True
        self.generation = 0

    def update(self, src: Source) -> dict[str, Any]:
        if src.series.generation != self.generation:  # series were thinned: counts sent are void
            self.sent, self.events, self.first, self.generation = {}, 0, True, src.series.generation
        points = {}
        for name, pts in list(src.series.points.items()):
            n = self.sent.get(name, 0)
            if len(pts) > n:
                points[name] = pts[n:]
                self.sent[name] = len(pts)
        events = src.series.events[self.events:]
        out = {"reset": self.first, "wall_time": src.wall_time(), "points": points, "events": events,
               "health": src.health(), "video": src.video()}
        self.events += len(events)
        self.first = False
        return out
