"""common/video.py and the evaluator's video hook: real MuJoCo offscreen rendering, real MP4 files.

Tests that film need a working offscreen GL (Debian's libosmesa6, or egl with a GPU) and
skip, saying why, where there is none. The tests of a machine without GL make it so on
purpose (an unusable MUJOCO_GL) and run everywhere.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest

from spreeze.common.envs import make_env
from spreeze.common.errors import VideoError
from spreeze.common.numpy_policy import NumpyActor
from spreeze.common.video import VIDEO_SIZE, EpisodeRecorder, choose_gl, record_episode
from spreeze.proto.messages import Event
from spreeze.services.evaluator.main import Evaluator
from tests.helpers import Harness, config, parts, recv_until, run
from tests.test_evaluator import actor, subscribed

pytestmark = pytest.mark.timeout(120)

ENV = "InvertedPendulum-v5"  # MuJoCo, cheap, and an untrained policy drops the pole within a few dozen steps


@pytest.fixture
def no_gl(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine where no offscreen GL library loads (MuJoCo refuses the value at import)."""
    monkeypatch.setenv("MUJOCO_GL", "nonesuch")


@pytest.fixture
def offscreen_gl(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The backend this machine renders with; the test is skipped, saying why, when none works."""
    monkeypatch.delenv("MUJOCO_GL", raising=False)  # restored after the test, as choose_gl sets it
    chosen = choose_gl()
    if not chosen.backend:
        pytest.skip(chosen.reason)
    yield chosen.backend


def untrained(tmp_path: Path) -> NumpyActor:
    cfg = config(tmp_path, f"env={ENV}")
    a, _ = parts(cfg)
    return NumpyActor(a.actor_state(), cfg.algo, np.array([-3.0], np.float32), np.array([3.0], np.float32))


def read_back(path: Path) -> tuple[dict, list[np.ndarray]]:
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    w, h = meta["size"]
    return meta, [np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in reader]


def test_recorded_episode_is_a_valid_mp4_with_its_frames(tmp_path: Path, offscreen_gl: str) -> None:
    path = tmp_path / "episode.mp4"
    frames = record_episode(ENV, untrained(tmp_path), path, seed=3)
    assert frames >= 2
    assert path.read_bytes()[4:8] == b"ftyp"  # an ISO media file
    meta, images = read_back(path)
    assert meta["codec"].startswith("h264") and tuple(meta["size"]) == VIDEO_SIZE
    assert len(images) == frames
    assert images[0].std() > 5  # a rendered scene, not a blank frame
    assert not list(tmp_path.glob("*.partial"))


def test_without_offscreen_gl_the_recorder_is_off_from_the_start_and_says_why(tmp_path: Path, no_gl: None) -> None:
    rec = EpisodeRecorder(ENV, str(tmp_path), every=1, seed=0)
    assert rec.backend == "" and not rec.due(1)
    assert "MUJOCO_GL='nonesuch'" in rec.off_reason and "libosmesa6" in rec.off_reason
    assert os.environ["MUJOCO_GL"] == "disable"
    env = make_env("HalfCheetah-v5", seed=0)  # plain environments do not care
    env.reset(seed=0)
    assert env.step(env.action_space.sample())[0].shape == (17,)


def test_environments_load_whatever_mujoco_gl_says() -> None:
    """MuJoCo's first import under an unusable MUJOCO_GL (here, in a fresh process): osmesa on a
    machine without libOSMesa crashes it, as does a value MuJoCo does not know."""
    values = ["nonesuch"] + ([] if ctypes.util.find_library("OSMesa") else ["osmesa"])
    code = ("from spreeze.common.envs import make_env; e = make_env('HalfCheetah-v5', seed=0); e.reset(seed=0); "
            "import os; print(os.environ['MUJOCO_GL'])")
    for value in values:
        done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MUJOCO_GL": value},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == value  # left as the user set it, for the renderer to report


def test_recorder_films_the_first_and_every_nth_evaluation(tmp_path: Path, offscreen_gl: str) -> None:
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "eval-0005-steps-9.mp4.partial").write_bytes(b"cut short by a kill")
    rec = EpisodeRecorder(ENV, str(tmp_path), every=3, seed=0)
    assert not list((tmp_path / "videos").iterdir())  # the stale partial file is gone
    assert [n for n in range(1, 11) if rec.due(n)] == [1, 4, 7, 10]
    assert not any(EpisodeRecorder(ENV, str(tmp_path), every=0, seed=0).due(n) for n in range(1, 5))


def test_a_stopped_recording_leaves_no_file_and_no_complaint(tmp_path: Path, offscreen_gl: str) -> None:
    async def body() -> None:
        rec = EpisodeRecorder("HalfCheetah-v5", str(tmp_path), every=1, seed=0)  # 1000 steps: long enough
        cfg = config(tmp_path, "env=HalfCheetah-v5")
        a, _ = parts(cfg)
        actor = NumpyActor(a.actor_state(), cfg.algo, -np.ones(6, np.float32), np.ones(6, np.float32))
        film = rec.start(actor, "x.mp4")
        assert rec.busy and not rec.due(1)  # one video at a time
        await asyncio.sleep(0.5)
        rec.stop()
        with pytest.raises(VideoError, match="stopped"):
            await film
        assert not rec.busy and rec.off_reason == ""
        assert not list((tmp_path / "videos").iterdir())

    run(body(), timeout=60)


def test_evaluator_records_every_nth_evaluation_and_tells_the_bus(tmp_path: Path, offscreen_gl: str) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, f"env={ENV}", "eval.video_every=2")) as h:
            metrics = h.metrics()
            ev = h.build(Evaluator)
            await subscribed(ev, metrics)
            for version in (1, 2, 3):
                ev.newest = actor(h, version, 10 * version, env_steps=100.0 * version)
                await ev.evaluate()
                if ev.video_task is not None:
                    await ev.video_task  # filming runs in the background
            names = sorted(p.name for p in (tmp_path / "videos").iterdir())
            assert names == ["eval-0001-steps-100.mp4", "eval-0003-steps-300.mp4"]
            got = await recv_until(metrics, lambda m: isinstance(m, Event) and m.kind == "video", 10)
            assert got.data == {"path": "videos/eval-0001-steps-100.mp4", "env_steps": 100}
            _, images = read_back(tmp_path / "videos" / names[1])
            assert images

    run(body(), timeout=100)


def test_evaluator_without_gl_goes_on_and_announces_why(tmp_path: Path, no_gl: None) -> None:
    async def body() -> None:
        async with Harness(config(tmp_path, f"env={ENV}", "eval.video_every=1")) as h:
            metrics = h.metrics()
            ev = h.build(Evaluator)
            await subscribed(ev, metrics)
            ev.newest = actor(h, 1, 10)
            assert await ev.evaluate() is not None
            assert ev.video_task is None  # nothing to film with
            got = await recv_until(metrics, lambda m: isinstance(m, Event) and m.kind == "video_unavailable", 10)
            assert got.data == {"notify": True} and "libosmesa6" in got.reason
            ev.newest = actor(h, 2, 20)
            assert await ev.evaluate() is not None and ev.evaluations == 2  # evaluation goes on
            assert (tmp_path / "checkpoints" / "best.pt").is_file()

    run(body(), timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_mujoco_run_without_gl_evaluates_and_keeps_every_service(tmp_path: Path) -> None:
    """`spreeze train` on a MuJoCo task with videos on and no usable GL: no service fails."""
    run_dir = tmp_path / "run"
    spreeze = Path(sys.executable).with_name("spreeze")
    cmd = [str(spreeze), "train", "--env", ENV, "--run-dir", str(run_dir), "--total-steps", "2500",
           "sampler.warmup_steps=500", "replay.min_size=500", "eval.every_updates=300", "eval.episodes=2",
           "eval.video_every=1", "supervisor.progress_every=2"]
    done = subprocess.run(cmd, env={**os.environ, "MUJOCO_GL": "nonesuch"}, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r for r in rows if r["kind"] == "eval"], "no evaluation was recorded"
    events = [r.get("event") for r in rows if r["kind"] == "event"]
    assert "restart" not in events, events
    assert "video_unavailable" in events, events
    assert (run_dir / "checkpoints" / "best.pt").is_file()
