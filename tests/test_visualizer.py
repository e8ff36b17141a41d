"""services/visualizer: real HTTP against a real visualizer fed real messages on real sockets."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from spreeze.common.errors import ConfigError
from spreeze.proto.messages import EvalResult, Event, Metrics
from spreeze.services.visualizer.main import VIDEO_OFF, Visualizer
from tests.helpers import Harness, config, recv_until, run, until

pytestmark = pytest.mark.timeout(60)

ROSTER = {"replay": {"role": "replay", "pid": 11, "state": "running", "restarts": 0},
          "learner": {"role": "learner", "pid": 12, "state": "running", "restarts": 2},
          "sampler-0": {"role": "sampler", "pid": 13, "state": "restarting", "restarts": 1},
          "visualizer": {"role": "visualizer", "pid": 14, "state": "running", "restarts": 0}}

BUS = [Metrics("learner", {"updates": 400, "update_frame_rate": 25_600.0, "critic_loss": 1.5, "actor_loss": -3.0,
                           "policy_lag": 0, "sparsity/actor": 0.5, "topology/actor/adaptations": 2.0,
                           "mode": "text is not drawn"}),
       Metrics("replay", {"inserted": 1000, "replay_size": 1000, "insert_stall_s": 0.5, "sample_stall_s": 0.0}),
       Metrics("sampler-0", {"env_steps": 1000, "episode_return": -1200.0}),
       EvalResult(3, 1000, 400, -900.0, 50.0, 200.0, 3),
       Event("tune", "more samplers: replay starves", {"num_samplers": 2}),
       Metrics("learner", {"updates": 1400, "update_frame_rate": 30_000.0, "critic_loss": float("nan"),
                           "compiling": 1.0, "compile_cold": 1.0, "compile_expected_s": 30.0,
                           "compile_elapsed_s": 12.0}),
       Metrics("replay", {"inserted": 2000, "replay_size": 2000, "insert_stall_s": 0.7, "sample_stall_s": 0.1})]


def small_mp4(path: Path) -> bytes:
    """A real 3-frame H.264 MP4."""
    import imageio_ffmpeg
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = imageio_ffmpeg.write_frames(str(path), (64, 48), fps=10, codec="libx264", pix_fmt_out="yuv420p")
    writer.send(None)
    for i in range(3):
        writer.send(np.full((48, 64, 3), 60 * i, np.uint8))
    writer.close()
    return path.read_bytes()


def write_roster(run_dir: Path) -> None:
    beat = time.time()
    rows = {sid: {**row, "last_heartbeat": beat if row["state"] == "running" else None} for sid, row in ROSTER.items()}
    (run_dir / "services.json").write_text(json.dumps(rows))


async def feed(h: Harness, messages: list[Any]) -> Any:
    """An XPUB where the supervisor's proxy binds: wait for the visualizer's subscription, then send."""
    bus = h.channel("metrics_out", binding=True, sender="supervisor")
    assert await bus.sock.poll(10_000), "the visualizer never subscribed"
    await bus.sock.recv()  # the subscription frame
    for msg in messages:
        await bus.send(msg)
    return bus


async def get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200, (url, resp.status)
        return await resp.json()


def test_data_endpoints_serve_what_the_bus_carried(tmp_path: Path) -> None:
    write_roster(tmp_path)

    async def body() -> None:
        async with Harness(config(tmp_path, "visualizer.tensorboard=false", "visualizer.push_every=0.1",
                                  "replay.capacity=4000")) as h:
            announced = h.metrics()
            vis = h.build(Visualizer)
            vis.series.rate_window = 0.0  # rates from two reports 50 ms apart
            h.start(vis.serve())
            event = await recv_until(announced, lambda m: isinstance(m, Event) and m.kind == "dashboard", 10)
            url = (tmp_path / "dashboard.url").read_text().strip()
            assert url.startswith("http://127.0.0.1:") and event.data == {"url": url, "notify": True}
            bus = await feed(h, BUS[:5])
            await until(lambda: vis.series.events, 5, "the first messages taken")
            await asyncio.sleep(0.05)  # rates need time to pass between two replay reports
            for msg in BUS[5:]:
                await bus.send(msg)
            async with aiohttp.ClientSession() as s:
                await until(lambda: "stalls:sample_stall_s" in vis.series.points and
                            len(vis.series.points.get("updates:learner", [])) == 2, 5, "all messages taken")
                points = (await get(s, url + "api/series"))["points"]
                assert points["eval_steps:return"] == [[1000.0, -900.0, 50.0]]
                assert points["eval_time:return"][0][1:] == [-900.0, 50.0]
                assert [p[1] for p in points["replay:fill"]] == [0.25, 0.5]
                assert points["utd:update-to-data"][0][1] == 1.0  # 1000 more updates over 1000 more env steps
                assert len(points["sampling:env steps/s"]) == 1
                assert points["losses:critic_loss"] == [[400.0, 1.5]]  # NaN left out
                assert points["losses:actor_loss"] == [[400.0, -3.0]]
                assert [p[1] for p in points["updates:learner"]] == [25_600.0, 30_000.0]
                assert points["lag:policy_lag"][0][1] == 0.0
                assert points["sparsity:sparsity/actor"] == [[400.0, 0.5]]
                assert points["topology:actor/adaptations"] == [[400.0, 2.0]]
                assert points["train_return:sampler-0"][0][1] == -1200.0
                assert not any("mode" in name for name in points)

                write_roster(tmp_path)  # fresh heartbeats: the liveness window here is 0.25 s
                health = {r["service"]: r for r in (await get(s, url + "api/health"))["services"]}
                assert set(health) == set(ROSTER)
                assert health["learner"]["restarts"] == 2 and health["learner"]["alive"]
                assert health["learner"]["note"] == "compiling (cold, ~30s) 12s" and health["replay"]["note"] == ""
                assert not health["sampler-0"]["alive"] and health["sampler-0"]["heartbeat_age_s"] is None
                assert health["replay"]["metrics_age_s"] is not None and health["visualizer"]["metrics_age_s"] is None

                events = (await get(s, url + "api/events"))["events"]
                assert any(e["event"] == "tune" and e["num_samplers"] == 2 for e in events)
                video = await get(s, url + "api/video")
                assert video["url"] is None and video["note"] == VIDEO_OFF  # the test config has videos off
                mp4 = small_mp4(tmp_path / "videos" / "eval-0001-steps-1000.mp4")
                video = await get(s, url + "api/video")
                assert video["url"] == "/videos/eval-0001-steps-1000.mp4"
                async with s.get(url + video["url"].lstrip("/")) as resp:
                    assert resp.status == 200 and resp.headers["Content-Type"] == "video/mp4"
                    assert await resp.read() == mp4

                async with s.get(url + "api/stream") as resp:
                    assert resp.headers["Content-Type"].startswith("text/event-stream")
                    first = json.loads((await resp.content.readline()).decode().removeprefix("data: "))
                    assert first["reset"] and first["points"]["eval_steps:return"] == [[1000.0, -900.0, 50.0]]
                    assert {r["service"] for r in first["health"]} == set(ROSTER)
                    await resp.content.readline()  # the blank line ending the event
                    second = json.loads((await resp.content.readline()).decode().removeprefix("data: "))
                    assert not second["reset"] and second["points"] == {} and second["events"] == []

                async with s.get(url) as resp:
                    assert resp.status == 200 and "dashboard.js" in await resp.text()
                for path in ("static/dashboard.js", "static/index.html"):
                    async with s.get(url + path) as resp:
                        assert resp.status == 200
                for path in ("static/..%2Fmain.py", "videos/..%2Fservices.json", "videos/nothing.mp4"):
                    async with s.get(url + path) as resp:
                        assert resp.status == 404, path

    run(body(), timeout=45)


def test_bad_bus_messages_are_counted_and_serving_goes_on(tmp_path: Path) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, "visualizer.tensorboard=false")) as h:
            vis = h.build(Visualizer)
            h.start(vis.serve())
            bus = await feed(h, [])
            await bus.sock.send_multipart([b"\xc1not msgpack"])
            await bus.sock.send_multipart([b"\x81\xa1v\x01", b"stray frame"])
            await bus.send(EvalResult(1, 500, 100, -700.0, 0.0, 200.0, 1))
            await until(lambda: "eval_steps:return" in vis.series.points, 5, "the good message after bad ones")
            assert sum(vis.bus.errors.values()) == 2

    run(body(), timeout=30)


def test_history_in_metrics_jsonl_is_shown_after_a_restart(tmp_path: Path) -> None:
    start = time.time() - 100
    rows = [{"kind": "start", "wall_time": 0.0, "unix_time": start},
            {"kind": "eval", "wall_time": 50.0, "env_steps": 3000, "return_mean": -500.0, "return_std": 9.0},
            {"kind": "event", "wall_time": 60.0, "event": "restart", "reason": "sampler-0 exited",
             "service": "sampler-0"}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + '\n{"kind": "metr')

    async def body() -> None:
        async with Harness(config(tmp_path, "visualizer.tensorboard=false")) as h:
            vis = h.build(Visualizer)
            assert vis.series.points["eval_steps:return"] == [[3000.0, -500.0, 9.0]]
            assert vis.series.events[0]["event"] == "restart"
            assert 99 <= vis.wall_time() <= 130  # time counts from the run's start

    run(body(), timeout=30)


def test_a_taken_port_is_refused_by_name(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]

    async def body() -> None:
        async with Harness(config(tmp_path, "visualizer.tensorboard=false", f"visualizer.port={port}")) as h:
            vis = h.build(Visualizer)
            with pytest.raises(ConfigError, match=f"visualizer.port={port}"):
                await vis.serve()

    try:
        run(body(), timeout=30)
    finally:
        taken.close()


def test_tensorboard_reads_the_event_files_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    async def body() -> None:
        async with Harness(config(tmp_path, "visualizer.tensorboard=true")) as h:
            vis = h.build(Visualizer)
            h.start(vis.serve())
            await feed(h, [Metrics("replay", {"inserted": 500, "replay_size": 500}),
                           EvalResult(1, 500, 100, -700.0, 10.0, 200.0, 1),
                           Metrics("replay", {"inserted": 1500, "replay_size": 1500}),
                           EvalResult(2, 1500, 900, -300.0, 10.0, 200.0, 1),
                           Event("restart", "sampler-0 exited with code -9", {"service": "sampler-0"})])
            await until(lambda: len(vis.series.events) == 1, 5, "all messages taken")
            await h.stop(vis, h.tasks[0])
            await vis.close()

    run(body(), timeout=45)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    evals = acc.Scalars("eval_steps/return")
    assert [(e.step, e.value) for e in evals] == [(500, -700.0), (1500, -300.0)]
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("replay/fill")] == [(500, 0.1), (1500, 0.3)]
    assert "events/text_summary" in acc.Tags()["tensors"]  # the restart event


def test_visualizer_config_is_validated() -> None:
    for override, named in [("visualizer.port=70000", "visualizer.port=70000"),
                            ("visualizer.push_every=0", "visualizer.push_every=0"),
                            ("visualizer.host=''", "visualizer.host=''"),
                            ("eval.video_every=-1", "eval.video_every=-1")]:
        with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
            config("/tmp/x", override)


def wandb_records(path: Path) -> list[Any]:
    """The records of a W&B offline run file (run-*.wandb): a LevelDB-style log after a 7-byte header,
    in 32 KiB blocks of chunks, each with a 7-byte header (crc32, length, type: full/first/middle/last)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block, records, pending = path.read_bytes(), 32 * 1024, [], b""
    assert data[:4] == b":W&B", data[:7]
    pos = 7
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            break  # the unwritten rest
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, last: a record is whole
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_run_holds_the_metrics_and_events(tmp_path: Path) -> None:
    pytest.importorskip("wandb")

    async def body() -> None:
        async with Harness(config(tmp_path, "visualizer.tensorboard=false", "visualizer.wandb=true",
                                  "visualizer.wandb_mode=offline", "visualizer.wandb_project=spreeze-test")) as h:
            vis = h.build(Visualizer)
            h.start(vis.serve())
            await feed(h, [Metrics("replay", {"inserted": 500, "replay_size": 500}),
                           EvalResult(1, 500, 100, -700.0, 10.0, 200.0, 1),
                           Metrics("replay", {"inserted": 1500, "replay_size": 1500}),
                           EvalResult(2, 1500, 900, -300.0, 10.0, 200.0, 1),
                           Event("restart", "sampler-0 exited with code -9", {"service": "sampler-0"})])
            await until(lambda: len(vis.series.events) == 1, 5, "all messages taken")
            await h.stop(vis, h.tasks[0])
            await vis.close()

    run(body(), timeout=90)
    run_id = (tmp_path / "wandb-run-id").read_text().strip()
    files = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(files) == 1, list((tmp_path / "wandb").rglob("*"))
    rows = []
    for record in wandb_records(files[0]):
        if record.WhichOneof("record_type") == "history":
            rows.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                         for item in record.history.item})
    evals = [(row["env_steps"], row["eval_steps/return"]) for row in rows if "eval_steps/return" in row]
    assert evals == [(500, -700.0), (1500, -300.0)]
    assert [(row["env_steps"], round(row["replay/fill"], 6)) for row in rows if "replay/fill" in row] == \
        [(500, 0.1), (1500, 0.3)]
    tables = [row for row in rows if "events/path" in row]  # the events table, once per event
    assert [(row["env_steps"], row["events/nrows"]) for row in tables] == [(1500, 1)], tables
    table = json.loads((files[0].parent / "files" / tables[0]["events/path"]).read_text())
    assert table["data"] == [[1500, "restart", "sampler-0 exited with code -9"]]


def test_wandb_config_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="visualizer.wandb_mode='cloud'"):
        config(tmp_path, "visualizer.wandb_mode=cloud")
    with pytest.raises(ConfigError, match="needs visualizer.enabled=true"):
        config(tmp_path, "visualizer.wandb=true", "visualizer.enabled=false")


def test_wandb_without_its_package_is_refused_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs the wandb package: pip install 'spreeze\[wandb\]'"):
        config(tmp_path, "visualizer.wandb=true")
