"""Supervisor: start every service, watch it, restart it, stop at the budget.

Reads top to bottom: `run()` binds the hub sockets, starts the children, then runs four
loops until the budget is spent or a signal arrives: control (registrations and
heartbeats), metrics (metrics.jsonl), watch (crashes, silence, restarts) and progress
(the console line). `shut_down()` (shutdown.py) stops data producers first, then the rest, so the
evaluator's last result and the learners' final checkpoints make it to disk. Right after the
samplers are told to stop, replay is told to drain (store everything, rate limiter and budget
notwithstanding), and at the very end
the ledger record compares, per sampler, the env steps it made with those replay stored.

Services it did not start (compose containers in hub mode, remote samplers attaching
over supervisor.listen) register too; externals.py keeps them, by heartbeats only.
"""

from __future__ import annotations

import asyncio
import json
import os
import logging
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from spreeze.proto.codec import Encoder
from spreeze.common.config import TCP_OFFSETS, Config, to_dict
from spreeze.common.curve_auth import (CurveKeys, Refusals, client_keys, server_keys, start_authenticator,
                                      watch_refusals)
from spreeze.common.disk import DiskWrites, write_atomically
from spreeze.common.errors import ConfigError, TransportTimeout
from spreeze.common.health import serve_health
from spreeze.common.health_probe import ENV_HEALTH
from spreeze.common.service import ENV_KEYS
from spreeze.common.transport import Channel
from spreeze.proto.messages import (FINISHED, UNREGISTERED, Control, ControlReply, Error, EvalResult, Event, Heartbeat,
                                    Register, Welcome)
from spreeze.proto.names import (ACTOR_LEARNER, CRITIC_LEARNER, LEARNER, REPLAY, SAMPLER)
from spreeze.services.supervisor.endpoints import run_endpoints
from spreeze.services.supervisor.externals import External, Externals
from spreeze.services.supervisor.bus import metrics_proxy
from spreeze.services.supervisor.ledger import Ledger
from spreeze.services.supervisor.sampler_watch import SamplerWatch
from spreeze.services.supervisor.sampler_watch import hint as sampler_hint
from spreeze.services.supervisor.probe import Choice
from spreeze.services.supervisor.processes import (Child, RestartPolicy, ServiceSpec, core_sets, last_log_line,
                                                   roster, spawn)
from spreeze.services.supervisor.progress import Progress
from spreeze.services.supervisor.samplers import SamplerPool
from spreeze.services.supervisor.shutdown import StopSequence
from spreeze.services.supervisor.tuning import TuningLoop
from spreeze.services.supervisor.tuning_host import TuningHostPart

log = logging.getLogger(__name__)

WATCH_EVERY = 0.2  # seconds between liveness checks
STOP_GRACE = 20.0  # seconds a service has to exit after a shutdown command
INTERRUPTED = 128 + signal.SIGINT  # exit status of a run stopped by Ctrl-C, as a shell reports one
HUB_IGNORES = frozenset({"sampler.num_samplers"})  # plan keys a hub does not act on (it starts no sampler)
LATE_WINDOW = 15.0  # a finished hub answers registrations until none came for this long (imports take 2-10 s)


class Supervisor(StopSequence, TuningHostPart):
    # made in `open`, in run(): they command services through the control socket it creates
    samplers: SamplerPool  # the local samplers started and retired while training
    tuning: TuningLoop | None  # the tuner's loop (None: not tuned)

    def __init__(self, cfg: Config, quiet: bool = False, specs: list[ServiceSpec] | None = None,
                 pinned: frozenset[str] = frozenset(), plan: list[Choice] | None = None,
                 stop_grace: float = STOP_GRACE) -> None:
        """`specs`: a custom roster (benchmarks, tests): then nothing is tuned. `pinned`: config
        keys the user set (the tuner leaves them); `plan`: the start plan's choices, published.
        `stop_grace`: seconds each stop group has to exit at the end before SIGTERM (a
        benchmark, which keeps nothing of its services, gives them less)."""
        self.cfg, self.quiet = cfg, quiet  # only the supervisor changes cfg (apply): new services get it
        self.stop_grace = stop_grace
        # a custom roster is not tuned. A hub (compose, Swarm) starts no process, so it neither
        # announces nor tunes the number of samplers, but it publishes the plan that shaped the
        # config it hands out and tunes what its `set` commands reach (envs, batches per request)
        hub = cfg.supervisor.mode == "hub"
        self.plan = [c for c in plan or [] if not (hub and c.key in HUB_IGNORES)] if specs is None else []
        self.tunable = specs is None and cfg.supervisor.tune
        self.pinned = pinned | HUB_IGNORES if hub else pinned  # keys the tuner leaves as they are
        self.run_dir = Path(cfg.run_dir)
        self.disk = DiskWrites(lambda kind, reason: self.say(f"event {kind}: {reason}"))  # full disk: said once
        self.progress = Progress(self.run_dir / "metrics.jsonl", cfg.total_steps, cfg.time_limit, self.disk)
        self.learner_id = LEARNER if cfg.learner.mode == "fused" else CRITIC_LEARNER  # whose updates count
        learners = [LEARNER] if cfg.learner.mode == "fused" else [CRITIC_LEARNER, ACTOR_LEARNER]
        self.cores = (core_sets(learners, cfg.learner.threads, sorted(os.sched_getaffinity(0)))
                      if cfg.learner.own_cores else {})  # service id ("" = any other) -> its cores
        self.sockets = run_endpoints(cfg)
        self.endpoints, self.tcp, self.tcp_only = self.sockets.table, self.sockets.tcp, self.sockets.tcp_only
        self.externals = Externals(any_role_over_tcp=self.tcp_only)
        self.children = {spec.service_id: Child(spec) for spec in (roster(cfg) if specs is None else specs)}
        sc = cfg.supervisor
        self.policy = RestartPolicy(sc.max_restarts, sc.restart_window, sc.backoff)
        self.stop_reason = ""
        self.failure: str | None = None
        self.interrupted = False  # stopped by SIGINT (Ctrl-C) before anything else stopped it
        self.stopping: set[str] = set()  # ids of the children shutdown() has asked (or is asking) to stop
        self.done = asyncio.Event()
        self.encoder = Encoder("supervisor")
        self.next_request = 0
        self.last_ping = 0.0  # monotonic time of the last ping round
        self.ledger = Ledger()
        # a training run says when no sampler feeds it (a custom roster, a benchmark's, may have none)
        self.sampler_watch = SamplerWatch(sampler_hint(hub, cfg.supervisor.listen)) if specs is None else None

    # ------------------------------------------------------------------ main
    async def run(self) -> int:
        """Train until the budget is spent; 0 on success (or SIGTERM: a process manager's stop is a
        clean end), INTERRUPTED (130) after Ctrl-C, 1 when the run failed. Either signal shuts
        down cleanly, so the run can be resumed."""
        self.open()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.on_signal, sig)
        for child in self.children.values():
            self.start(child)
        jobs = [self.metrics_proxy(), self.control_loop(), self.metrics_loop(), self.watch_loop(),
                self.progress_loop()]
        if os.environ.get(ENV_HEALTH):
            jobs.append(serve_health(self.ctx, os.environ[ENV_HEALTH], self.encoder,
                                     lambda: "stopping" if self.done.is_set() else "running"))
        if self.server_keys is not None:
            jobs.append(watch_refusals(self.control.sock, self.control.tcp_endpoints, self.refusals,
                                       lambda text: self.emit("refused_client", f"supervisor {text}", {})))
        if self.plan:
            jobs.append(self.announce_plan())
        if self.tuning:
            jobs.append(self.tuning.run())
        tasks = [asyncio.create_task(c, name=getattr(c, "__qualname__", None)) for c in jobs]
        for task in tasks:
            task.add_done_callback(self.loop_ended)
        await self.done.wait()
        await self.shut_down()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.cfg.supervisor.mode == "hub" and not self.failure and not self.stop_reason.startswith("signal"):
            await self.refuse_late()
        idle = self.no_update()
        if idle is not None:  # the budget is spent, but nothing was learned: not a success
            self.failure = idle
            self.stop_reason += f", but {idle}"
        self.say(self.progress.line())
        self.say(f"stopped: {self.stop_reason}")
        self.progress.close()
        if self.authenticator is not None:
            self.authenticator.stop()
        self.ctx.destroy(linger=0)
        if self.sockets.own_sock_dir:
            shutil.rmtree(self.sockets.sock_dir, ignore_errors=True)
        return 1 if self.failure else INTERRUPTED if self.interrupted else 0

    def open(self) -> None:
        """The sockets, then what sends through them (`tell`, `emit`): the sampler pool and the
        tuning loop. Called by run(), in the event loop the sockets belong to."""
        self.ctx = zmq.asyncio.Context()
        self.server_keys, self.client_keys = self.curve()
        self.refusals = Refusals()  # clients its CURVE control socket refused (a sampler without keys)
        self.control = Channel(self.ctx, "control", self.endpoints["control"], binding=True, encoder=self.encoder,
                               also=self.tcp_also("control"), curve=self.server_keys)
        self.metrics = Channel(self.ctx, "metrics_out", self.endpoints["metrics_out"], binding=False,
                               encoder=self.encoder)
        self.events = Channel(self.ctx, "metrics_in", self.endpoints["metrics_in"], binding=False,
                              encoder=self.encoder, curve=self.client_keys)
        self.samplers = SamplerPool(self.children, self.start, self.tell, self.cfg.sampler.num_samplers, STOP_GRACE)
        self.tuning = TuningLoop(self, self.cfg, self.pinned) if self.tunable else None

    def curve(self) -> tuple[CurveKeys | None, CurveKeys | None]:
        """(server, client) keys of the tcp-facing hub sockets; (None, None) in a run without keys."""
        self.authenticator = None
        keys = self.cfg.supervisor.keys
        if not keys:
            return None, None
        self.authenticator = start_authenticator(self.ctx, keys)
        return server_keys(keys), client_keys(keys)

    def tcp_also(self, name: str) -> tuple[str, ...]:
        """The socket's tcp endpoint when it has one besides its own (ipc transport with listen)."""
        return (self.tcp[name],) if name in self.tcp and self.tcp[name] != self.endpoints[name] else ()

    def on_signal(self, sig: int) -> None:
        self.interrupted = self.interrupted or (sig == signal.SIGINT and not self.done.is_set())
        self.stop(f"signal {signal.Signals(sig).name}")

    async def refuse_late(self) -> None:
        """A hub whose run reached its end tells services still starting (compose starts every
        container at once; one may register after the end) that the run has finished, until
        none has asked for LATE_WINDOW seconds: they exit 0 instead of failing to register and
        being restarted for ever."""
        quiet_until = time.monotonic() + LATE_WINDOW
        while (left := quiet_until - time.monotonic()) > 0:
            try:
                peer, msg = await self.control.recv(timeout=left)
            except TransportTimeout:
                return
            if isinstance(msg, Register) and peer is not None:
                await self.control.send(Error(FINISHED, f"the run in {str(self.run_dir)!r} has finished "
                                                        f"({self.stop_reason})", msg.TYPE), to=peer)
                quiet_until = time.monotonic() + LATE_WINDOW

    def loop_ended(self, task: asyncio.Task[Any]) -> None:
        """A loop of the supervisor that raised stops the run as a failure, naming the error (a
        run whose metrics or watch loop is gone would otherwise wait for ever)."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("the supervisor's %s failed", task.get_name(), exc_info=exc)
        self.stop(f"the supervisor's {task.get_name()} failed: {exc!r}", failure=True)

    def stop(self, reason: str, failure: bool = False) -> None:
        if not self.done.is_set():
            self.stop_reason = reason
            if failure:
                self.failure = reason
            self.done.set()

    def no_update(self) -> str | None:
        """Why a run that used up its budget failed all the same: its learner made no update
        (with the reason where known); None when it made one, was stopped by a signal or
        failed already, or is not one of this supervisor's children."""
        learner = self.children.get(self.learner_id)
        if learner is None or self.failure or self.stop_reason.startswith("signal"):
            return None
        # its metrics (about once a second) or its heartbeats' counters, the last sent as it exits:
        # a short run's learner may stop before its first metrics message
        if self.progress.updates > 0 or int(learner.counters.get("updates", 0)) > 0:
            return None
        if self.progress.updates_before > 0:  # a resumed run whose budget was spent already
            return None
        inserted = int(max((float(v.get("inserted", 0)) for v in self.progress.by_role(REPLAY)), default=0))
        if learner.last_error:
            why = f"restarted {learner.total_restarts} time(s) after crashes, the last with: {learner.last_error}"
        elif inserted < self.cfg.replay.min_size:
            why = (f"replay stored {inserted:,} transitions, under replay.min_size={self.cfg.replay.min_size:,} "
                   f"(its first batch)")
        else:
            why = "it did not report one"
        return f"the learner made no update ({why}); see {self.run_dir / 'logs' / f'{self.learner_id}.log'}"

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)
        log.info(text)

    async def metrics_proxy(self) -> None:
        await metrics_proxy(self.ctx, {name: (self.endpoints[name], *self.tcp_also(name))
                                       for name in ("metrics_in", "metrics_out")}, self.server_keys)

    # ------------------------------------------------------------------ children
    def start(self, child: Child) -> None:
        extra = {ENV_KEYS: str(Path(self.cfg.supervisor.keys).resolve())} if self.cfg.supervisor.keys else {}
        cpus = self.cores.get(child.spec.service_id, self.cores.get("", frozenset()))
        child.proc = spawn(child.spec, self.endpoints["control"], self.run_dir / "logs", extra, cpus)
        child.started, child.registered, child.state, child.restart_at = time.monotonic(), False, "starting", 0.0
        child.last_heartbeat = 0.0
        log.info("started %s (pid %d)", child.spec.service_id, child.proc.pid)
        self.write_roster()

    def write_roster(self) -> None:
        """run_dir/services.json: pid, state, restarts and last heartbeat (unix time) of every
        service (for the dashboard, tools and tests); rewritten once per heartbeat interval."""
        now, unix = time.monotonic(), time.time()
        rows = {sid: {"role": c.spec.role, "pid": c.proc.pid if c.proc else None, "state": c.state,
                      "restarts": c.total_restarts,
                      "last_heartbeat": unix - (now - c.last_heartbeat) if c.last_heartbeat else None}
                for sid, c in self.children.items()}
        rows.update(self.externals.rows())
        data = json.dumps(rows, indent=1).encode()
        self.disk.attempt("services.json", lambda: write_atomically(self.run_dir / "services.json", data))

    def crashed(self, child: Child, why: str) -> None:
        """Schedule a restart with backoff, or stop the run after too many."""
        if child.alive:
            child.proc.kill()  # type: ignore[union-attr]
            child.proc.wait()  # type: ignore[union-attr]
        now = time.monotonic()
        delay = self.policy.next_delay(child, now)
        sid = child.spec.service_id
        log_file = self.run_dir / "logs" / f"{sid}.log"
        child.last_error = last_log_line(log_file)
        said = f" (its log ends: {child.last_error})" if child.last_error else ""  # why, in its own words
        if delay is None:
            times = self.policy.max_restarts + 1
            self.emit("give_up", f"{sid} failed {times} time{'s' if times > 1 else ''} within "
                                 f"{self.policy.window:.0f}s; last: {why}{said}; see {log_file}",
                      {"service": sid, "log": str(log_file), "last_error": child.last_error})
            fails = "keeps failing" if self.policy.max_restarts else "failed"  # 0: no restart allowed
            self.stop(f"{sid} {fails} ({why}){said}; see {log_file}", failure=True)
            return
        child.restarts.append(now)
        child.total_restarts += 1
        child.restart_at, child.state, child.registered = now + delay, "restarting", False
        self.emit("restart", f"{sid} {why}{said}; restarting in {delay:.1f}s",
                  {"service": sid, "delay": delay, "last_error": child.last_error})

    def emit(self, kind: str, reason: str, data: dict[str, Any]) -> None:
        self.say(f"event {kind}: {reason}")
        self.events.send_nowait(Event(kind, reason, data))  # comes back through the proxy to jsonl

    # ------------------------------------------------------------------ loops
    async def control_loop(self) -> None:
        while True:
            peer, msg = await self.control.recv()
            sid = peer.decode(errors="replace") if peer else ""
            child = self.children.get(sid)
            if isinstance(msg, Heartbeat):
                self.ledger.heard(sid, msg.counters)
            if isinstance(msg, Register):
                if msg.role == SAMPLER:
                    self.ledger.registered(sid)
                await self.welcome(peer, sid, msg)  # type: ignore[arg-type]
            elif isinstance(msg, Heartbeat) and child is not None:
                self.child_heartbeat(child, msg)
            elif isinstance(msg, Heartbeat):
                if not self.external_heartbeat(sid, msg) and msg.state not in ("stopping", "stopped"):
                    await self.control.send(Error(UNREGISTERED, f"{sid!r} is not registered with this supervisor "
                                                  "(it restarted): register again", msg.TYPE), to=peer)
            elif isinstance(msg, ControlReply) and not msg.ok:
                log.warning("%s refused control request %d: %s", sid, msg.request_id, msg.detail)

    @staticmethod
    def child_heartbeat(child: Child, msg: Heartbeat) -> None:
        """Take a heartbeat of a service this supervisor started. One still queued from an
        incarnation it took for dead (killed, restart pending) is dropped: it would mark a dead
        service running."""
        if child.registered and not child.restart_at:
            child.last_heartbeat, child.state, child.counters = time.monotonic(), msg.state, msg.counters

    async def welcome(self, peer: bytes, sid: str, msg: Register) -> None:
        child = self.children.get(sid)
        if child is None:
            await self.admit(peer, sid, msg)
            return
        child.registered, child.state = True, "registered"  # running from its first heartbeat on
        self.write_roster()
        await self.send_welcome(peer, sid, child.spec.role, self.endpoints)
        if sid in self.stopping:  # it registered while the run stops (Ctrl-C at start-up): it stops too
            self.tell(sid, "shutdown")

    async def send_welcome(self, peer: bytes, sid: str, role: str, endpoints: dict[str, str]) -> None:
        await self.control.send(Welcome(sid, endpoints, self.welcome_config(role),
                                        self.cfg.supervisor.heartbeat_interval, self.tcp), to=peer)

    # ------------------------------------------------------------------ services it did not start
    async def admit(self, peer: bytes, sid: str, msg: Register) -> None:
        """Welcome a service started elsewhere (compose container, remote sampler), or refuse it."""
        if msg.remote and not self.tcp:
            return  # cannot happen: a remote registrant reached us over a tcp endpoint we bind
        try:
            ext = self.externals.join(sid, msg, time.monotonic())
        except ConfigError as exc:
            log.warning("registration refused: %s", exc)
            await self.control.send(Error("refused", str(exc), msg.TYPE), to=peer)
            return
        endpoints = {n: self.tcp[n] for n in TCP_OFFSETS} if msg.remote and not self.tcp_only else self.endpoints
        self.emit("join", f"{sid} ({msg.role}, pid {msg.pid} on {msg.host}{', over tcp' if msg.remote else ''}) "
                          f"registered" + (f" again ({ext.joins - 1} restarts)" if ext.joins > 1 else ""),
                  {"service": sid, "role": msg.role, "host": msg.host, "pid": msg.pid, "remote": msg.remote})
        self.write_roster()
        await self.send_welcome(peer, sid, msg.role, endpoints)

    def external_heartbeat(self, sid: str, msg: Heartbeat) -> bool:
        """Take a heartbeat of a service this supervisor did not start; False: it is not registered."""
        was = self.externals.by_id.get(sid)
        old_state = was.state if was is not None else None
        ext = self.externals.beat(sid, msg, time.monotonic())
        if ext is None:
            log.warning("heartbeat from unregistered service %r: asked to register again", sid)
            return False
        if ext.state == "stopped":
            self.leave(ext, "exited")
        elif old_state != ext.state:
            if old_state == "gone":
                self.emit("rejoin", f"{sid} is heard again", {"service": sid})
            self.write_roster()
        return True

    def leave(self, ext: External, why: str) -> None:
        """An external left (exited or went silent): out of the run's accounting."""
        self.progress.forget(ext.service_id)
        self.emit("leave", f"{ext.service_id} {why}", {"service": ext.service_id, "role": ext.role})
        self.write_roster()

    def check_externals(self, now: float, silence: float) -> None:
        for ext in self.externals.sweep(now, silence):
            self.leave(ext, f"sent no heartbeat for {silence:.1f}s")

    def welcome_config(self, role: str) -> dict[str, Any]:
        """The run config as a service of `role` gets it: the current (tuned) values. (Warm-up
        steps are granted by replay in its acks, for the run as a whole: proto/SPEC.md §6.)"""
        return to_dict(self.cfg)

    async def metrics_loop(self) -> None:
        while True:
            for _, msg in await self.metrics.recv_many(256):
                self.progress.take(msg)
                if isinstance(msg, Event) and msg.data.get("notify") is True:  # e.g. the dashboard URL
                    self.say(f"{msg.kind}: {msg.reason}")
                target = self.cfg.stop_at_return
                if isinstance(msg, EvalResult) and target is not None and msg.return_mean >= target:
                    self.stop(f"evaluation return {msg.return_mean:,.1f} reached stop_at_return={target:,.1f} "
                              f"at {msg.env_steps:,} env steps")
            if self.progress.env_steps >= self.cfg.total_steps:
                self.stop(f"budget of {self.cfg.total_steps:,} env steps reached")

    async def watch_loop(self) -> None:
        sc = self.cfg.supervisor
        silence = sc.liveness * sc.heartbeat_interval
        while True:
            await asyncio.sleep(WATCH_EVERY)
            now = time.monotonic()
            for child in self.children.values():
                self.check(child, now, silence)
            self.samplers.reap(now)
            if not self.done.is_set():
                self.check_externals(now, silence)
                said = self.sampler_watch.check(self.sampler_count(), now) if self.sampler_watch else None
                if said is not None:
                    self.emit(*said, {"notify": False})  # (emit prints it: notify would print it twice)
            if self.cfg.time_limit and self.progress.elapsed >= self.cfg.time_limit:
                self.stop(f"time limit of {self.cfg.time_limit:.0f}s reached")
            await self.ping_all()

    def sampler_count(self) -> int:
        """Samplers feeding the run now: its own and the ones that registered on their own."""
        own = sum(c.spec.role == SAMPLER and c.registered and c.alive for c in self.children.values())
        return own + len(self.externals.live((SAMPLER,)))

    def check(self, child: Child, now: float, silence: float) -> None:
        if self.done.is_set():
            return  # stopping: exits are expected now
        if child.restart_at:
            if now >= child.restart_at:
                self.start(child)
            return
        if not child.alive:
            self.crashed(child, f"exited with code {child.proc.returncode}")  # type: ignore[union-attr]
        elif not child.last_heartbeat:  # still coming up: registering, then building itself (imports, networks)
            if now - child.started > self.cfg.supervisor.start_timeout:
                done = "sent no heartbeat" if child.registered else "did not register"
                self.crashed(child, f"{done} within {self.cfg.supervisor.start_timeout:.0f}s of its start")
        elif now - child.last_heartbeat > silence:
            self.crashed(child, f"sent no heartbeat for {silence:.1f}s")

    async def ping_all(self) -> None:
        """Supervisor heartbeat: lets services notice a dead supervisor and exit."""
        if time.monotonic() - self.last_ping >= self.cfg.supervisor.heartbeat_interval:
            self.last_ping = time.monotonic()
            self.write_roster()
            for child in self.children.values():
                if child.registered and child.alive:
                    self.tell(child.spec.service_id, "ping")
            for ext in self.externals.by_id.values():
                if ext.state != "stopped":  # gone ones too: a recovered one must hear from us again
                    self.tell(ext.service_id, "ping")

    def tell(self, service_id: str, command: str, key: str = "", value: Any = None) -> None:
        """Send a Control command (never blocks: the control socket's HWM is large, replies come
        back to control_loop)."""
        self.next_request += 1
        self.control.send_nowait(Control(command, self.next_request, key, value), to=service_id.encode())

    async def progress_loop(self) -> None:
        stalled = False  # announced once: the line keeps saying it
        while True:
            await asyncio.sleep(self.cfg.supervisor.progress_every)
            self.say(self.progress.line())
            why = self.progress.stall()
            if why is not None and not stalled:
                self.emit("stalled", why, {"notify": True})
            stalled = why is not None

    def set_all(self, roles: tuple[str, ...], key: str, value: Any) -> None:
        """Tell every running service of `roles` to set `key`: the ones it started and the ones
        that registered on their own (compose containers, remote samplers)."""
        for child in list(self.children.values()):
            if child.spec.role in roles and child.registered and child.alive:
                self.tell(child.spec.service_id, "set", key, value)
        for ext in self.externals.live(roles):
            self.tell(ext.service_id, "set", key, value)
