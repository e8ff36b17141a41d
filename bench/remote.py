"""`spreeze bench remote`: what a remote sampler's link costs: experience over tcp:// and
tcp:// with CURVE against ipc://, side by side.

One process, one PUSH and one PULL Channel per path (the socket types and options of
transport.ROLES["experience"], the codec included), `--messages` Experience batches of
`--rows` HalfCheetah transitions each. The three paths are interleaved (ipc, tcp, curve,
ipc, ...) `--repeats` times and the medians reported with their ratio to ipc.

    python -m spreeze.bench.remote [--rows 1024] [--messages 400] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time

import numpy as np
import zmq
import zmq.asyncio

from spreeze.proto.codec import Encoder
from spreeze.common.curve_auth import client_keys, make_keys, server_keys, start_authenticator
from spreeze.common.transport import Channel, ipc_endpoint, make_ipc_dir
from spreeze.proto.messages import Experience

OBS, ACT = 17, 6  # HalfCheetah-v5


async def throughput(ctx: zmq.asyncio.Context, endpoint: str, keys: str | None, rows: int, n: int) -> float:
    """Transitions per second from one PUSH to one PULL over `endpoint`."""
    pull = Channel(ctx, "experience", endpoint, binding=True, encoder=Encoder("replay"),
                   curve=server_keys(keys) if keys else None)
    bound = pull.sock.getsockopt_string(zmq.LAST_ENDPOINT)
    push = Channel(ctx, "experience", bound, binding=False, encoder=Encoder("sampler"),
                   curve=client_keys(keys) if keys else None)
    m = np.random.default_rng(0).random((rows, 2 * OBS + ACT + 2), np.float32)
    m[:, -1] = 0.0  # the done column: 0 or 1 (receivers refuse anything else)
    msg = Experience(m, OBS, ACT, rows)
    await push.send(msg)
    await pull.recv(timeout=30)  # connected (and CURVE handshake done) before the clock starts

    async def send_all() -> None:
        for _ in range(n):
            await push.send(msg)
    sender = asyncio.create_task(send_all())
    t0 = time.perf_counter()
    for _ in range(n):
        await pull.recv(timeout=30)
    rate = n * rows / (time.perf_counter() - t0)
    await sender
    push.close()
    pull.close()
    return rate


async def run(rows: int, n: int, repeats: int) -> dict[str, list[float]]:
    directory = make_ipc_dir("spzb-")
    keys = str(make_keys(f"{directory}/keys"))
    ctx = zmq.asyncio.Context()
    auth = start_authenticator(ctx, keys)
    rates: dict[str, list[float]] = {"ipc": [], "tcp": [], "tcp+curve": []}
    try:
        for r in range(repeats):
            rates["ipc"].append(await throughput(ctx, ipc_endpoint(directory, f"e{r}"), None, rows, n))
            rates["tcp"].append(await throughput(ctx, "tcp://127.0.0.1:*", None, rows, n))
            rates["tcp+curve"].append(await throughput(ctx, "tcp://127.0.0.1:*", keys, rows, n))
    finally:
        auth.stop()
        ctx.destroy(linger=0)
        shutil.rmtree(directory, ignore_errors=True)
    return rates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spreeze bench remote", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1024, help="transitions per Experience message")
    p.add_argument("--messages", type=int, default=400, help="messages per measurement")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds; medians reported")
    args = p.parse_args(argv)
    rates = asyncio.run(run(args.rows, args.messages, args.repeats))
    base = statistics.median(rates["ipc"])
    print(f"experience, {args.rows} HalfCheetah transitions per message, median of {args.repeats} rounds:")
    for path, values in rates.items():
        m = statistics.median(values)
        print(f"  {path:10s} {m / 1e6:6.2f} M transitions/s  {m / base:4.2f} of ipc   "
              f"(rounds: {', '.join(f'{v / 1e6:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
