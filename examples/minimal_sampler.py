"""A complete Spreeze sampler written from proto/SPEC.md alone: pyzmq, msgpack, numpy and
gymnasium, nothing of the project. Usage: python minimal_sampler.py tcp://HOST:PORT [ID]
(the address of `spreeze train --listen`; no CURVE keys). Acts with the published actor by
running its acting policy (§4.4: whatever the algorithm), within replay's warm-up grant at
random, keeps every batch until it is durable and re-sends after a gap, a replay restart or
an ack timeout."""
import os
import socket
import sys
import time

import gymnasium as gym
import msgpack
import numpy as np
import zmq

DTYPES = {"float32": "<f4", "int32": "<i4", "float64": "<f8", "int64": "<i8", "uint8": "u1", "bool": "b1"}


class Peer:
    """Frames in and out: frame 0 a msgpack header map, then one raw array per descriptor."""

    def __init__(self, sid: str) -> None:
        self.sid, self.session, self.seq = sid, os.urandom(8).hex(), 0

    def frames(self, mtype: str, body: dict, arrays: dict | None = None) -> list:
        self.seq += 1
        arrays = {k: np.ascontiguousarray(v, "<f4") for k, v in (arrays or {}).items()}
        head = {"v": 1, "type": mtype, "sender": self.sid, "session": self.session, "seq": self.seq,
                "ts": time.time(), "arrays": [[k, "float32", list(a.shape)] for k, a in arrays.items()], "body": body}
        return [msgpack.packb(head), *arrays.values()]


def parse(frames: list) -> tuple[str, dict, dict]:
    head = msgpack.unpackb(frames[0])
    arrays = {}
    for (name, dtype, shape), buf in zip(head["arrays"], frames[1:]):
        arrays[name] = np.frombuffer(buf, DTYPES[dtype]).reshape(shape)
    return head["type"], head["body"], arrays


def weights(body: dict, arrays: dict) -> dict:
    """The actor's tensors: dense ones as they come, sparse ones rebuilt from idx/val (§4.4)."""
    state = {k[len("dense/"):]: v for k, v in arrays.items() if k.startswith("dense/")}
    for name, shape in body.get("shapes", {}).items():
        flat = np.zeros(int(np.prod(shape)), np.float32)
        flat[arrays["idx/" + name]] = arrays["val/" + name]
        state[name] = flat.reshape(shape)
    return state


def act(policy: dict, w: dict, obs: np.ndarray, rng: np.random.Generator, low: np.ndarray,
        high: np.ndarray) -> np.ndarray:
    """The acting policy (§4.4): its ops in order on x = obs, then its head, exploring."""
    x, slots = obs.astype(np.float32), {}
    for op in policy["ops"]:
        kind, get = op["op"], op.get
        if kind == "obs_norm":
            x = np.clip((x - w[op["mean"]]) / np.sqrt(w[op["var"]] + op["eps"]), -op["clip"], op["clip"])
        elif kind == "linear":
            x = x @ w[op["weight"]].T + w.get(get("bias"), 0)
        elif kind == "layer_norm":
            x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + op["eps"])
            x = x * w.get(get("weight"), 1) + w.get(get("bias"), 0)
        elif kind in ("relu", "tanh", "elu", "silu"):
            x = {"relu": np.maximum(x, 0), "tanh": np.tanh(x), "silu": x / (1 + np.exp(-x)),
                 "elu": np.where(x > 0, x, get("alpha", 1.0) * np.expm1(np.minimum(x, 0)))}[kind]
        elif kind == "save":
            slots[op["slot"]] = x
        elif kind == "add":
            x = x + slots[op["slot"]]
        elif kind == "squash":  # the deterministic action plus Gaussian noise, in half action ranges
            scale = w[op["scale"]]
            x = np.tanh(x) * scale + w[op["bias"]] + rng.standard_normal(x.shape) * op["exploration_noise"] * abs(scale)
        elif kind == "tanh_gaussian":  # first half mean, second half log-std squashed into [lo, hi]
            n, lo, hi = len(w[op["scale"]]), op["log_std_min"], op["log_std_max"]
            log_std = lo + 0.5 * (hi - lo) * (np.tanh(x[:, n:]) + 1)
            x = np.tanh(x[:, :n] + np.exp(log_std) * rng.standard_normal((len(x), n))) * w[op["scale"]] + w[op["bias"]]
        else:
            raise ValueError(f"unknown policy op {kind!r}")
    return np.clip(x, low, high).astype(np.float32)


def main(control_ep: str, sid: str) -> int:
    ctx, me = zmq.Context(), Peer(sid)
    control = ctx.socket(zmq.DEALER)
    control.setsockopt(zmq.IDENTITY, sid.encode())  # the service id is the DEALER identity (§4.9)
    control.connect(control_ep)
    control.send_multipart(me.frames("register", {"role": "sampler", "pid": os.getpid(), "host": socket.gethostname(),
                                                  "service_id": sid, "remote": control_ep.startswith("tcp://")}))
    if not control.poll(30_000):
        raise TimeoutError(f"no welcome from {control_ep} within 30 s")
    kind, welcome, _ = parse(control.recv_multipart())
    if kind != "welcome":
        raise RuntimeError(f"registration refused: {welcome}")
    cfg, host = welcome["config"], control_ep.rsplit(":", 1)[0]
    ep = {k: v.replace("tcp://0.0.0.0", host).replace("tcp://*", host) for k, v in welcome["endpoints"].items()}
    sc, hb = cfg["sampler"], welcome["heartbeat_interval"]
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(ep["actor_weights"])
    exp = ctx.socket(zmq.DEALER)  # no empty delimiter frame on a DEALER (§2)
    exp.connect(ep["experience"])
    envs = gym.make_vec(cfg["env"], num_envs=sc["envs_per_sampler"], vectorization_mode="sync")
    envs.reset(seed=int.from_bytes(os.urandom(4), "little"))  # autoreset on the next step after an episode end
    rng, obs, ended = np.random.default_rng(), envs.reset()[0], np.zeros(envs.num_envs, bool)
    space: gym.spaces.Box = envs.single_action_space  # type: ignore[assignment]
    o_dim, a_dim, low, high = obs.shape[1], space.shape[0], space.low, space.high
    actor, policy, version, made, random_taken, granted = None, {}, -1, 0, 0, 0
    kept: dict[int, list] = {}  # batch number -> frames, until durable
    sent = stored = durable = resend_from = resent_upto = 0
    moved, last_hb, stopping, flush_until = time.monotonic(), 0.0, False, 0.0

    def send(number: int, rows: np.ndarray, random: int, version: int) -> None:
        kept[number] = me.frames("experience", {"obs_dim": o_dim, "act_dim": a_dim, "env_steps": made,
                                                "actor_version": version, "batch": number,
                                                "random_steps": random}, {"transitions": rows})
        exp.send_multipart(kept[number], copy=False)

    sent = 1  # batches are numbered 1, 2, ... per session
    send(1, np.zeros((0, 2 * o_dim + a_dim + 2), np.float32), 0, -1)  # the opening batch brings a grant
    while True:
        now = time.monotonic()
        if now - last_hb >= hb:
            last_hb = now
            control.send_multipart(me.frames("heartbeat", {"service_id": sid, "state": "stopping" if stopping
                                                           else "running", "counters": {"env_steps": made}}))
        while control.poll(0):
            kind, body, _ = parse(control.recv_multipart())
            if kind == "control":
                stopping = stopping or body["command"] == "shutdown"
                flush_until = flush_until or (now + 5.0 if stopping else 0.0)
                ok = body["command"] in ("ping", "shutdown")
                control.send_multipart(me.frames("control_reply", {"request_id": body["request_id"], "ok": ok,
                                                                   "detail": "" if ok else "not supported"}))
        while sub.poll(0):
            kind, body, arrays = parse(sub.recv_multipart())
            if kind == "weights" and body["net"] == "actor" and body["version"] >= version:
                actor, policy, version = weights(body, arrays), body["policy"], body["version"]
        while exp.poll(0):
            kind, body, _ = parse(exp.recv_multipart())
            if kind != "experience_ack":
                continue  # an `error` precedes a `rejected` ack: the ack is what counts
            if body["stored"] != stored:
                moved = now
            stored, granted = body["stored"], max(granted, body.get("warmup", 0))
            durable = max(durable, body["durable"])
            kept = {b: f for b, f in kept.items() if b > durable}
            if resend_from and stored >= resend_from:
                resend_from = stored + 1
            if body["status"] == "gap" and body["batch"] > resent_upto:
                resend_from, resent_upto = stored + 1, sent
        if sent > stored and now - moved > sc["ack_timeout"] and kept:  # no progress: send the kept again
            resend_from, resent_upto, stored, moved = min(kept), sent, min(kept) - 1, now
        if stopping and (stored >= sent or now > flush_until):
            break
        front = resend_from - 1 if resend_from else sent
        if front - stored >= sc["ack_window"]:
            exp.poll(20)
            continue
        if resend_from:
            if resend_from in kept and resend_from <= sent:
                exp.send_multipart(kept[resend_from], copy=False)
                resend_from += 1
            else:
                resend_from = 0
            continue
        if stopping or (actor is None and granted - random_taken < envs.num_envs):
            exp.poll(20)  # nothing to act with: wait for weights or a grant
            continue
        rows, random = [], 0
        for _ in range(sc["steps_per_push"]):
            k = min(max(granted - random_taken, 0), envs.num_envs)  # envs 0..k-1 act at random
            if actor is None and k < envs.num_envs:
                break
            a = act(policy, actor, obs, rng, low, high) if actor is not None else np.zeros((envs.num_envs, a_dim))
            a[:k] = rng.uniform(low, high, (k, a_dim))
            nxt, reward, term, trunc, _ = envs.step(a)
            for i in np.flatnonzero(~ended):  # envs that stepped (the others were reset by autoreset)
                rows.append(np.concatenate([obs[i], a[i], [reward[i]], nxt[i], [float(term[i])]]))
                random, random_taken = random + int(i < k), random_taken + int(i < k)
            obs, ended = nxt, np.logical_or(term, trunc)
        made += len(rows)
        if sent == stored:
            moved = now  # the ack clock starts with the first unacknowledged batch
        sent += 1
        send(sent, np.array(rows, np.float32).reshape(-1, 2 * o_dim + a_dim + 2), random, version if actor else -1)
    control.send_multipart(me.frames("heartbeat", {"service_id": sid, "state": "stopped",
                                                   "counters": {"env_steps": made}}))
    envs.close()
    ctx.destroy(linger=1000)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else f"minimal-{socket.gethostname()}-{os.getpid()}"))
