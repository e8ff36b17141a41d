"""`spreeze bench transport`: the codec's cost over bare pyzmq, sender -> receiver over ipc://.

One sender process pushes Experience batches to one receiver process (DEALER/ROUTER, socket
types of transport.ROLES["experience"], queue depth BENCH_HWM; no acks: this measures the
one-way path, the acks are a few dozen bytes per batch). Two paths move the same bytes:
  codec: Experience -> to_frames -> send_multipart(copy=False) -> recv_multipart(copy=False)
         -> decode -> from_envelope -> count rows;
  bare:  a prebuilt header frame + the same array buffer, counted from the frame length.
Both use the same copy flags, so the ratio codec/bare is the codec's overhead alone.
The paths are interleaved (a, b, a, b, ...) `repeats` times; medians are reported, with
the CPU time (user+sys, all threads, sender + receiver) per message, which drifts less
than throughput when other programs share the cores.

    python -m spreeze.bench.transport [--batch-sizes 256 4096] [--seconds 3] [--repeats 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import shutil
import statistics
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np
import zmq

from spreeze.common.transport import ROLES, ipc_endpoint, make_ipc_dir
from spreeze.proto.codec import Encoder, decode
from spreeze.proto.messages import Experience, from_envelope, to_frames

# Queue depth for the measurement. The training system keeps at most sampler.ack_window
# unacknowledged batches in flight (freshness of data); a throughput measurement of the
# codec needs enough depth that neither side waits on the other's scheduling.
BENCH_HWM = 64

OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah
WIDTH = 2 * OBS_DIM + ACT_DIM + 2
ROW_BYTES = WIDTH * 4
WARMUP_S = 0.5  # long enough for both processes to reach steady state
STALL_S = 10.0  # a receiver waiting this long for a frame means the sender is gone
CHECK_EVERY = 32  # sender looks at its command pipe once per this many messages
PATHS = ("codec", "bare")
END = b"END"  # one-frame sentinel: the sender's last message of a measurement


# ------------------------------------------------------------------ child processes

def _socket(ctx: zmq.Context, binding: bool, endpoint: str) -> zmq.Socket:
    spec = ROLES["experience"][0 if binding else 1]
    sock = ctx.socket(spec.kind)
    sock.setsockopt(zmq.SNDHWM, BENCH_HWM)
    sock.setsockopt(zmq.RCVHWM, BENCH_HWM)
    sock.setsockopt(zmq.LINGER, spec.linger_ms)
    sock.setsockopt(zmq.RCVTIMEO, int(STALL_S * 1000))  # no wait outlives a dead peer
    sock.setsockopt(zmq.SNDTIMEO, int(STALL_S * 1000))
    if binding:
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)
    return sock


def _child(target: Any, conn: Connection, endpoint: str, binding: bool) -> None:
    """Run one bench child; report any failure on the pipe and exit non-zero."""
    ctx = zmq.Context()
    try:
        sock = _socket(ctx, binding, endpoint)
        conn.send(("ready",))
        target(conn, sock)
    except BaseException as exc:  # report everything, then die: the parent cleans up
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
    finally:
        ctx.destroy(linger=0)


def receiver_main(conn: Connection, endpoint: str) -> None:
    _child(_receiver_loop, conn, endpoint, binding=True)


def sender_main(conn: Connection, endpoint: str) -> None:
    _child(_sender_loop, conn, endpoint, binding=False)


def _cpu() -> float:
    """CPU seconds of this process, all threads (zmq's I/O thread included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _receiver_loop(conn: Connection, sock: zmq.Socket) -> None:
    while (cmd := conn.recv())[0] == "measure":
        _, path, warmup, seconds = cmd
        rows, msgs, elapsed, cpu = _measure(sock, path, warmup, seconds)
        conn.send(("rate", rows / elapsed, cpu / msgs))
        _drain(sock)
        conn.send(("drained",))


def _recv(sock: zmq.Socket) -> list[Any]:
    """One message's frames, without the routing id a ROUTER prepends."""
    frames = sock.recv_multipart(copy=False)
    return frames[1:] if sock.type == zmq.ROUTER else frames


def _measure(sock: zmq.Socket, path: str, warmup: float,
             seconds: float) -> tuple[int, int, float, float]:
    """Receive for `warmup` then `seconds` of wall time; rows, messages and CPU seconds
    are counted in the second window."""
    def codec_rows(frames: list[Any]) -> int:
        return from_envelope(decode(frames)).transitions.shape[0]  # type: ignore[attr-defined]

    def bare_rows(frames: list[Any]) -> int:
        return len(frames[1]) // ROW_BYTES

    count = codec_rows if path == "codec" else bare_rows

    def recv(copy: bool = False) -> list[Any]:
        return _recv(sock)

    count(recv(copy=False))
    start = time.perf_counter()
    while time.perf_counter() - start < warmup:
        count(recv(copy=False))
    rows, msgs, cpu, start = 0, 0, _cpu(), time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        rows += count(recv(copy=False))
        msgs += 1
    return rows, msgs, now - start, _cpu() - cpu


def _drain(sock: zmq.Socket) -> None:
    while len(_recv(sock)) != 1:
        pass


def _sender_loop(conn: Connection, sock: zmq.Socket) -> None:
    while (cmd := conn.recv())[0] == "send":
        _, path, batch = cmd
        cpu = _cpu()
        sent = _send_until_stopped(conn, sock, path, batch)
        conn.send(("stopped", (_cpu() - cpu) / sent))
        sock.send(END)


def _send_until_stopped(conn: Connection, sock: zmq.Socket, path: str, batch: int) -> int:
    """Send until the parent says stop; the number of messages sent."""
    arr = np.random.default_rng(0).standard_normal((batch, WIDTH), dtype=np.float32)
    arr[:, -1] = 0.0  # the done column: 0 or 1 (receivers refuse anything else)
    enc = Encoder("bench-sender")
    header = to_frames(Experience(arr, OBS_DIM, ACT_DIM, 0), enc)[0]
    send, sent = sock.send_multipart, 0
    while not conn.poll():
        if path == "codec":
            for _ in range(CHECK_EVERY):
                sent += 1
                send(to_frames(Experience(arr, OBS_DIM, ACT_DIM, sent * batch), enc), copy=False)
        else:
            for _ in range(CHECK_EVERY):
                sent += 1
                send([header, arr], copy=False)  # type: ignore[list-item]  # pyzmq sends any buffer
    conn.recv()  # the "stop"
    return sent


# ------------------------------------------------------------------ parent

class _Pair:
    """The receiver and sender processes, their pipes, and the ipc directory."""

    def __init__(self) -> None:
        self.dir = make_ipc_dir("spzb-")
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []

    def start(self) -> None:
        """Start both children; wait until each has its socket ready."""
        endpoint = ipc_endpoint(self.dir, "exp")
        ctx = mp.get_context("spawn")
        for main in (receiver_main, sender_main):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=main, args=(theirs, endpoint), daemon=True)
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)
        self.expect(0, "ready", 60)
        self.expect(1, "ready", 60)

    def tell(self, who: int, *msg: Any) -> None:
        """Send a command to child `who` (0 receiver, 1 sender)."""
        try:
            self.conns[who].send(msg)
        except OSError:
            proc = self.procs[who]
            raise RuntimeError(f"bench child {proc.name} is gone (exitcode={proc.exitcode})") from None

    def expect(self, who: int, kind: str, timeout: float) -> tuple[Any, ...]:
        """The next report from child `who` (0 receiver, 1 sender), which must be `kind`."""
        conn, proc = self.conns[who], self.procs[who]
        if not conn.poll(timeout):
            raise RuntimeError(f"bench child {proc.name} sent nothing within {timeout:.0f}s "
                               f"(alive={proc.is_alive()}, exitcode={proc.exitcode})")
        try:
            msg = conn.recv()
        except EOFError:
            raise RuntimeError(f"bench child {proc.name} died (exitcode={proc.exitcode})") from None
        if msg[0] != kind:
            raise RuntimeError(f"bench child {proc.name} reported {msg!r}, expected {kind!r}")
        return msg

    def close(self) -> None:
        """Stop the children (politely, then by force) and remove the ipc directory."""
        for conn in self.conns:
            try:
                conn.send(("quit",))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for conn in self.conns:
            conn.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _one(pair: _Pair, path: str, batch: int, warmup: float, seconds: float) -> tuple[float, float]:
    """Transitions per second, and CPU seconds per message (sender + receiver), of one run."""
    pair.tell(0, "measure", path, warmup, seconds)
    pair.tell(1, "send", path, batch)
    _, rate, recv_cpu = pair.expect(0, "rate", warmup + seconds + STALL_S + 5)
    pair.tell(1, "stop")
    send_cpu = pair.expect(1, "stopped", STALL_S + 5)[1]
    pair.expect(0, "drained", STALL_S + 5)
    return float(rate), float(recv_cpu + send_cpu)


def run(batch_sizes: tuple[int, ...] = (256, 4096), seconds: float = 3.0, repeats: int = 3,
        json_path: str | None = None) -> dict[str, Any]:
    """Measure both paths, interleaved; print a table; return (and maybe write) the results."""
    pair = _Pair()
    try:
        pair.start()
        runs: dict[int, dict[str, list[tuple[float, float]]]] = {b: {p: [] for p in PATHS} for b in batch_sizes}
        for batch in batch_sizes:
            for _ in range(repeats):
                for path in PATHS:
                    runs[batch][path].append(_one(pair, path, batch, min(WARMUP_S, seconds), seconds))
    finally:
        pair.close()
    result = _summarize(runs, seconds, repeats)
    print(_table(result))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return result


def _summarize(runs: dict[int, dict[str, list[tuple[float, float]]]], seconds: float,
               repeats: int) -> dict[str, Any]:
    rows = []
    med = statistics.median
    for batch, by_path in runs.items():
        codec_tps, codec_cpu, bare_tps, bare_cpu = ([run[i] for run in by_path[p]] for p in PATHS for i in (0, 1))
        rows.append({
            "batch": batch, "codec_tps": med(codec_tps), "bare_tps": med(bare_tps),
            "ratio": med(codec_tps) / med(bare_tps),
            "paired_ratio": med(c / b for c, b in zip(codec_tps, bare_tps)),
            "codec_cpu_us_per_msg": med(codec_cpu) * 1e6, "bare_cpu_us_per_msg": med(bare_cpu) * 1e6,
            "cpu_ratio": med(bare_cpu) / med(codec_cpu),
            "codec_tps_runs": codec_tps, "bare_tps_runs": bare_tps,
            "codec_cpu_runs": codec_cpu, "bare_cpu_runs": bare_cpu,
        })
    return {"bench": "transport", "transport": "ipc", "obs_dim": OBS_DIM, "act_dim": ACT_DIM,
            "seconds": seconds, "repeats": repeats, "results": rows}


def _table(result: dict[str, Any]) -> str:
    lines = [f"{'batch':>6} {'codec tr/s':>13} {'bare tr/s':>13} {'codec/bare':>10} {'paired':>7}"
             f" {'codec cpu/msg':>13} {'bare cpu/msg':>12} {'bare/codec cpu':>14}"]
    for r in result["results"]:
        lines.append(f"{r['batch']:>6} {r['codec_tps']:>13,.0f} {r['bare_tps']:>13,.0f} "
                     f"{r['ratio']:>10.3f} {r['paired_ratio']:>7.3f} "
                     f"{r['codec_cpu_us_per_msg']:>11.1f}us {r['bare_cpu_us_per_msg']:>10.1f}us "
                     f"{r['cpu_ratio']:>14.3f}")
    lines.append("medians of interleaved runs; paired: median of per-run ratios; cpu/msg: CPU time "
                 "(user+sys, all threads) of sender + receiver per message")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spreeze bench transport", description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 4096],
                        help="transitions per message (one measurement pair per size)")
    parser.add_argument("--seconds", type=float, default=3.0, help="wall time of each measurement")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved codec/bare pairs per size")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if min(args.batch_sizes) <= 0 or args.seconds <= 0 or args.repeats <= 0:
        parser.error("--batch-sizes, --seconds and --repeats must be positive")
    run(tuple(args.batch_sizes), args.seconds, args.repeats, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
