"""MP4 videos of deterministic evaluation episodes, rendered offscreen by MuJoCo.

Evaluation never depends on GL. Environments need none: common.envs imports MuJoCo with
GL disabled, and gymnasium's renderer loads the backend named by `MUJOCO_GL` only when a
frame is asked for. That backend is set only after a short subprocess has rendered one
frame with it (`probe_gl`), since some crash where their library is missing (osmesa
without libOSMesa raises AttributeError): the user's `MUJOCO_GL` when set, else `egl` on
a machine with an NVIDIA GPU, then `osmesa` (software, Debian's libosmesa6). When none
works, the recorder is off from the start and `off_reason` says why (the evaluator
announces it as a `video_unavailable` event); evaluations and checkpoints go on.
`EpisodeRecorder.start` films in a low-priority daemon thread, one video at a time, so
evaluations go on meanwhile and a shutdown never waits for a video. Frames are streamed
to ffmpeg (the binary shipped by imageio-ffmpeg), H.264 in yuv420p so that browsers play
it, written to a temp name and renamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np

from spreeze.common.env_source import EnvSource
from spreeze.common.envs import GL_OFF, is_mujoco, make_env
from spreeze.common.errors import ConfigError, EnvArgumentError, VideoError
from spreeze.common.numpy_policy import NumpyActor

log = logging.getLogger(__name__)

VIDEO_SIZE = (256, 192)  # width, height: multiples of 16 (H.264 blocks); software GL renders this in ~30 ms
FRAME_EVERY = 2  # film every 2nd env step: half the rendering cost, still smooth (HalfCheetah: 10 fps)
MAX_FRAMES = 5_000  # an episode without a time limit stops being filmed here
RENDER_NICE = 10  # the filming thread yields the CPU to training: videos are the least urgent work
GL_HINT = ("to record videos install Debian's libosmesa6 and set MUJOCO_GL=osmesa (CPU), or set "
           "MUJOCO_GL=egl on a machine with a GPU; eval.video_every=0 turns videos off")


PROBE_TIMEOUT_S = 60.0  # one frame of a one-geom scene: ~1 s with software GL, more on a loaded machine
PROBE = """
import mujoco
model = mujoco.MjModel.from_xml_string('<mujoco><worldbody><geom size=".1"/></worldbody></mujoco>')
data = mujoco.MjData(model)
mujoco.mj_forward(model, data)
with mujoco.Renderer(model, 16, 16) as renderer:
    renderer.update_scene(data)
    assert renderer.render().shape == (16, 16, 3)
"""


@dataclass(frozen=True)
class GLChoice:
    """The offscreen backend this process uses: `backend` works, or it is "" and `reason` says why."""

    backend: str
    reason: str = ""


def gl_candidates() -> list[str]:
    """Backends to try, in order: the user's MUJOCO_GL alone when set, else egl (GPU) and osmesa."""
    wanted = os.environ.get("MUJOCO_GL", "").strip()
    if wanted and wanted.lower() != GL_OFF:
        return [wanted]
    return (["egl"] if Path("/dev/nvidiactl").exists() else []) + ["osmesa"]


def probe_gl(backend: str) -> str:
    """"" when MuJoCo renders a frame with `backend` in a fresh subprocess, else why not."""
    env = {**os.environ, "MUJOCO_GL": backend, "LP_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"MUJOCO_GL={backend!r}: rendering one frame took over {PROBE_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return ""
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return f"MUJOCO_GL={backend!r}: {lines[-1] if lines else f'exit status {done.returncode}'}"


_chosen: GLChoice | None = None  # once per process: MuJoCo reads MUJOCO_GL once per process


def choose_gl() -> GLChoice:
    """Set MUJOCO_GL to the first backend that renders (see the module doc), or to GL_OFF.

    Call before anything in this process imports MuJoCo."""
    global _chosen
    if _chosen is not None and os.environ.get("MUJOCO_GL") == (_chosen.backend or GL_OFF):
        return _chosen
    failures = []
    for backend in gl_candidates():
        reason = probe_gl(backend)
        if not reason:
            _chosen = GLChoice(backend)
            break
        failures.append(reason)
    else:
        _chosen = GLChoice("", f"no offscreen GL works ({'; '.join(failures)}); {GL_HINT}")
    os.environ["MUJOCO_GL"] = _chosen.backend or GL_OFF
    if _chosen.backend == "osmesa":
        os.environ.setdefault("LP_NUM_THREADS", "1")  # Mesa's llvmpipe: one thread, never oversubscribe
    return _chosen


def _render_env(env_id: str | EnvSource, seed: int) -> gym.Env:
    try:
        try:
            return make_env(env_id, seed=seed, render_mode="rgb_array", width=VIDEO_SIZE[0], height=VIDEO_SIZE[1])
        except EnvArgumentError:  # classic-control envs take no frame size
            return make_env(env_id, seed=seed, render_mode="rgb_array")
    except ConfigError:
        raise
    except Exception as exc:  # MuJoCo checks MUJOCO_GL when it first loads
        reason = f"cannot be made for rendering with {_gl_failure(exc)}"
    # outside `except`: no reference to the failed objects
    raise VideoError(f"{EnvSource.of(env_id).describe()} {reason}")


def _frame(env: gym.Env, env_id: str | EnvSource) -> np.ndarray:
    try:
        frame = env.render()
    except gym.error.DependencyNotInstalled as exc:
        reason = f"cannot render: {exc}"
    except Exception as exc:  # GL libraries raise anything from ImportError to mujoco.FatalError
        reason = f"cannot render offscreen with {_gl_failure(exc)}"
    else:
        if isinstance(frame, np.ndarray) and frame.ndim == 3:
            return np.ascontiguousarray(frame[:, :, :3])
        reason = f"rendered {type(frame).__name__}, not an RGB image; {GL_HINT}"
    # raised outside `except`, so the error holds no traceback into the half-built renderer:
    # its finalizer must run when record_episode drops it, not at some later allocation
    raise VideoError(f"{EnvSource.of(env_id).describe()} {reason}")


def _gl_failure(exc: Exception) -> str:
    return f"MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}: {type(exc).__name__}: {exc}; {GL_HINT}"


def record_episode(env_id: str | EnvSource, actor: NumpyActor, path: Path, seed: int,
                   stop: threading.Event | None = None) -> int:
    """Film one deterministic episode into the MP4 `path` (every FRAME_EVERY-th step and the
    last); returns the number of frames. `stop` set: give up at the next frame, no file."""
    import imageio_ffmpeg

    env = _render_env(env_id, seed)
    tmp = path.with_name(path.name + ".partial")
    frames, writer = 0, None
    try:
        obs, _ = env.reset(seed=seed)
        frame = _frame(env, env_id)
        fps = float(env.metadata.get("render_fps") or 30) / FRAME_EVERY
        writer = imageio_ffmpeg.write_frames(str(tmp), (frame.shape[1], frame.shape[0]), fps=fps,
                                             codec="libx264", pix_fmt_out="yuv420p", macro_block_size=16,
                                             output_params=["-f", "mp4", "-movflags", "+faststart"])
        writer.send(None)  # start ffmpeg
        rng = np.random.default_rng(0)  # unused by deterministic acting, required by the API
        done, steps = False, 0
        while True:
            if stop is not None and stop.is_set():
                raise VideoError(f"filming {path.name} was stopped")
            writer.send(frame)
            frames += 1
            if done or frames >= MAX_FRAMES:
                break
            for _ in range(FRAME_EVERY):
                action = actor.act(np.asarray(obs, np.float32)[None], rng, explore=False)[0]
                obs, _, terminated, truncated, _ = env.step(action)
                steps += 1
                done = terminated or truncated
                if done:
                    break
            frame = _frame(env, env_id)
        writer.close()
        os.replace(tmp, path)
    except OSError as exc:
        raise VideoError(f"cannot write the video {str(path)!r}: {exc}") from None
    finally:
        if writer is not None:
            writer.close()  # stops ffmpeg, also when the episode failed half way
        with contextlib.suppress(Exception):  # a renderer that never got a GL context fails to close
            env.close()
        if not frames:
            # ... and its __del__ raises again: collect it here, not inside some later allocation
            # (a finalizer raising during compile() trips CPython 3.11's AST depth check)
            del env
            gc.collect()
        tmp.unlink(missing_ok=True)
    return frames


class EpisodeRecorder:
    """Films the 1st evaluation and every `every`-th after it into run_dir/videos (every=0: never).

    `start` films in a daemon thread of low priority, one video at a time, so evaluations
    go on meanwhile and a shutdown never waits for a video (`stop()` abandons it)."""

    def __init__(self, env_id: str | EnvSource, run_dir: str, every: int, seed: int) -> None:
        if every < 0:
            raise ConfigError(f"eval.video_every={every!r} must be >= 0")
        self.env_id, self.every, self.seed = env_id, every, seed
        self.dir = Path(run_dir) / "videos"
        for stale in self.dir.glob("*.partial"):  # a previous incarnation was killed while filming
            stale.unlink(missing_ok=True)
        self.off_reason = ""  # set when videos cannot be made: no further attempts
        self.backend = ""
        if every and is_mujoco(EnvSource.of(env_id).id):
            chosen = choose_gl()
            self.backend, self.off_reason = chosen.backend, chosen.reason
        self.busy = False  # a video is being filmed
        self.stopping = threading.Event()

    def due(self, evaluations: int) -> bool:
        return (self.every > 0 and not self.off_reason and not self.busy
                and (evaluations - 1) % self.every == 0)

    def start(self, actor: NumpyActor, name: str) -> asyncio.Future[Path]:
        """Film in the background; the future gets the MP4's path or the VideoError."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Path] = loop.create_future()

        def settle(result: Path | None, exc: BaseException | None) -> None:
            self.busy = False
            if not done.done():
                done.set_exception(exc) if exc is not None else done.set_result(result)  # type: ignore[arg-type]

        def work() -> None:
            with contextlib.suppress(OSError):  # this thread only (Linux): training comes first
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), RENDER_NICE)
            result, error = None, None
            try:
                result = self.record(actor, name)
            except VideoError as exc:
                error = exc
            except Exception as exc:  # a bug here must not end the evaluator: report it as the reason
                log.exception("filming %s failed", name)
                self.off_reason = f"filming failed: {type(exc).__name__}: {exc}"
                error = VideoError(self.off_reason)
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process is exiting
                loop.call_soon_threadsafe(settle, result, error)

        self.busy = True
        threading.Thread(target=work, name="video", daemon=True).start()
        return done

    def stop(self) -> None:
        self.stopping.set()

    def record(self, actor: NumpyActor, name: str) -> Path:
        """The MP4's path; raises VideoError (and turns the recorder off) when it cannot be made."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / name
        try:
            record_episode(self.env_id, actor, path, self.seed, self.stopping)
        except VideoError as exc:
            if not self.stopping.is_set():
                self.off_reason = str(exc)
            raise
        return path
