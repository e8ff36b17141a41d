"""Evaluator: follow actor versions, evaluate every M updates or T seconds, checkpoint.

Results go out on the metrics bus (EvalResult). After each evaluation it writes
checkpoints/latest.pt, and checkpoints/best.pt when the return is the best so far; each
holds the evaluated actor, the learners' newest full states (optimizers, temperature,
counters), the eval record and the config, written atomically (temp file + rename).
On shutdown it evaluates the newest actor once more if that version is not evaluated yet.
Its own record (best return, evaluations, last version evaluated) is kept in
checkpoints/evaluator.json and restored at start, so a resumed run keeps its best.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import numpy as np
import torch

from spreeze.common.config import to_dict
from spreeze.common.evaluation import run_episodes
from spreeze.common.envs import make_env
from spreeze.common.checkpoint_files import readable, save_checkpoint
from spreeze.common.disk import write_atomically
from spreeze.common.learner_io import checkpoint_dir
from spreeze.common.errors import VideoError
from spreeze.common.numpy_policy import NumpyActor
from spreeze.common.service import Service
from spreeze.common.video import EpisodeRecorder
from spreeze.common.weights import WeightsFollower, to_state
from spreeze.proto.messages import EvalResult, Event, Weights
from spreeze.proto.names import LEARNER_ROLES

log = logging.getLogger(__name__)

LEARNER_FILES = tuple(f"{role}.pt" for role in LEARNER_ROLES)  # their checkpoints, kept with the best actor
POLL_S = 0.1  # seconds between checks for new weights


class Evaluator(Service):
    ROLE = "evaluator"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # first: it picks MuJoCo's GL backend (or none), which must be set before any env loads MuJoCo
        self.videos = EpisodeRecorder(self.cfg.env_source, self.cfg.run_dir, self.cfg.eval.video_every,
                                      self.cfg.seed + 20_000)
        self.video_announced = False  # a video_unavailable event went out
        self.env = make_env(self.cfg.env_source, seed=self.cfg.seed + 10_000)
        self.newest: Weights | None = None
        self.evaluated_version = -1
        self.last_eval_updates = 0
        self.last_eval_time = time.monotonic()
        self.best = -np.inf
        self.evaluations = 0
        self.started_wall = time.time()
        self.video_task: asyncio.Task[None] | None = None
        self.restore()

    @property
    def record_path(self) -> Any:
        return checkpoint_dir(self.cfg.run_dir) / "evaluator.json"

    def restore(self) -> None:
        """Best return, evaluation count and last evaluated version of an earlier incarnation."""
        if not self.record_path.is_file():
            return
        try:
            rec = json.loads(self.record_path.read_text())
        except (OSError, ValueError) as exc:  # (written atomically: damaged since)
            log.warning("%s cannot be read (%s): evaluation counts start again", self.record_path, exc)
            return
        self.best = float(rec["best"]) if rec["best"] is not None else -np.inf
        self.evaluations = int(rec["evaluations"])
        self.evaluated_version, self.last_eval_updates = int(rec["version"]), int(rec["updates"])
        log.info("restored evaluator record: %d evaluations, best %.1f", self.evaluations, self.best)

    def save_record(self) -> None:
        rec = {"best": None if self.best == -np.inf else self.best, "evaluations": self.evaluations,
               "version": self.evaluated_version, "updates": self.last_eval_updates}
        write_atomically(self.record_path, json.dumps(rec).encode())

    def counters(self) -> dict[str, Any]:
        return {"evaluations": self.evaluations, "best": float(self.best)}

    async def serve(self) -> None:
        follower = WeightsFollower(self.channel("weights", binding=False, name="actor_weights"))
        while self.running:
            got = follower.poll().get("actor")
            if got is not None:
                self.newest = got
            if self.due():
                await self.evaluate()
            await asyncio.sleep(POLL_S)

    def due(self) -> bool:
        if self.newest is None or self.newest.version == self.evaluated_version:
            return False
        ec = self.cfg.eval
        by_updates = ec.every_updates > 0 and self.newest.updates - self.last_eval_updates >= ec.every_updates
        by_time = ec.every_seconds > 0 and time.monotonic() - self.last_eval_time >= ec.every_seconds
        return by_updates or by_time

    async def evaluate(self) -> EvalResult | None:
        msg = self.newest
        if msg is None:
            return None
        state = to_state(msg)
        space = self.env.action_space
        actor = NumpyActor(msg.policy, state, space.low, space.high)
        # in a thread, so heartbeats and control keep flowing during long evaluations
        returns, lengths = await asyncio.to_thread(run_episodes, self.env, actor, self.cfg.eval.episodes)
        result = EvalResult(actor_version=msg.version, env_steps=int(msg.extras.get("env_steps", 0)),
                            updates=msg.updates, return_mean=float(np.mean(returns)),
                            return_std=float(np.std(returns)), length_mean=float(np.mean(lengths)),
                            episodes=len(returns), returns=[float(r) for r in returns])
        await self.metrics_out.send(result)
        self.evaluated_version, self.last_eval_updates = msg.version, msg.updates
        self.last_eval_time = time.monotonic()
        self.evaluations += 1
        await asyncio.to_thread(self.save, state, msg.policy, result)  # reads learner checkpoints: seconds under load
        if self.running and self.videos.due(self.evaluations):  # not on the way out: it takes a while
            self.video_task = asyncio.create_task(self.record_video(actor, result))
        elif self.videos.off_reason and not self.video_announced:  # no GL at start: say so once
            await self.announce_no_videos(self.videos.off_reason)
        return result

    async def announce_no_videos(self, reason: str) -> None:
        log.warning("no evaluation videos: %s", reason)
        self.video_announced = True
        await self.metrics_out.send(Event("video_unavailable", f"no evaluation videos: {reason}", {"notify": True}))

    async def record_video(self, actor: NumpyActor, result: EvalResult) -> None:
        """One deterministic episode as MP4; an Event either way (a failure is printed and shown)."""
        name = f"eval-{self.evaluations:04d}-steps-{result.env_steps}.mp4"
        try:
            await self.videos.start(actor, name)  # in the background: evaluations go on
        except VideoError as exc:
            if self.running:  # else abandoned on shutdown
                await self.announce_no_videos(str(exc))
            return
        await self.metrics_out.send(Event("video", f"recorded videos/{name}",
                                          {"path": f"videos/{name}", "env_steps": result.env_steps}))

    def save(self, state: dict[str, np.ndarray], policy: dict[str, Any], result: EvalResult) -> None:
        ckpt = checkpoint_dir(self.cfg.run_dir)
        payload = {"actor": {k: torch.from_numpy(np.array(v)) for k, v in state.items()}, "policy": policy,
                   "eval": {"return_mean": result.return_mean, "return_std": result.return_std,
                            "env_steps": result.env_steps, "updates": result.updates,
                            "actor_version": result.actor_version},
                   "learners": self.learner_states(), "config": to_dict(self.cfg)}
        self.disk.attempt("checkpoint latest.pt", lambda: save_checkpoint(payload, ckpt / "latest.pt"))
        if result.return_mean > self.best and self.disk.attempt(
                "checkpoint best.pt", lambda: save_checkpoint(payload, ckpt / "best.pt")):
            self.best = result.return_mean  # (not written: the next evaluation above the old best writes it)
        self.disk.attempt("evaluator.json", self.save_record)

    def learner_states(self) -> dict[str, Any]:
        out = {}
        for name in LEARNER_FILES:
            try:
                path = readable(checkpoint_dir(self.cfg.run_dir) / name)
                if path is not None:
                    out[name.removesuffix(".pt")] = torch.load(path, weights_only=False)
            except Exception as exc:  # a learner may be replacing it right now
                log.warning("could not read %s for the checkpoint: %s", name, exc)
        return out

    async def close(self) -> None:
        self.videos.stop()
        if self.newest is not None and self.newest.version != self.evaluated_version:
            await self.evaluate()
        self.env.close()
