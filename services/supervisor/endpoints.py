"""Where every socket of a run is: what the supervisor names in each Welcome.

transport=ipc (one host): ipc:// paths in the run's private socket directory.
transport=tcp (Docker Swarm, several hosts): tcp://HOST:PORT for every socket, where HOST
is the name of the service that binds it (its Swarm/compose service name, resolved by the
engine's DNS; supervisor.tcp_hosts renames) and PORT is supervisor.tcp_port plus the
socket's place in config.TCP_PORT_ORDER. The binder binds the port on its own container
(common.transport.bind_address); everyone else connects by name, never by a container IP.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from spreeze.common.config import TCP_OFFSETS, TCP_PORT_ORDER, Config, tcp_host_map
from spreeze.common.errors import ConfigError
from spreeze.common.transport import ipc_endpoint, make_ipc_dir, tcp_host, tcp_port
from spreeze.proto.names import ACTOR_LEARNER, CRITIC_LEARNER, LEARNER, REPLAY, SOCKETS

SUPERVISOR = "supervisor"  # the role that binds control and the metrics proxy (it does not register)


def binder(socket: str, cfg: Config) -> str:
    """The role whose service binds `socket`."""
    if socket in ("control", "metrics_in", "metrics_out"):
        return SUPERVISOR
    if socket in ("experience", "sample"):
        return REPLAY
    if socket == "actor_weights":
        return LEARNER if cfg.learner.mode == "fused" else ACTOR_LEARNER
    return {"actor_sync": ACTOR_LEARNER, "critic_sync": CRITIC_LEARNER}[socket]


def ipc_table(directory: str) -> dict[str, str]:
    return {name: ipc_endpoint(directory, name) for name in SOCKETS}


def tcp_table(cfg: Config) -> dict[str, str]:
    """Every socket by its binder's name (transport=tcp)."""
    hosts = tcp_host_map(cfg.supervisor.tcp_hosts)
    out = {}
    for offset, name in enumerate(TCP_PORT_ORDER):
        role = binder(name, cfg)
        out[name] = f"tcp://{hosts.get(role, hosts.get('all', role))}:{cfg.supervisor.tcp_port + offset}"
    return out


@dataclass(frozen=True)
class RunEndpoints:
    """The sockets of one run, as the supervisor hands them out."""

    table: dict[str, str]  # every socket's endpoint, what a Welcome names
    tcp: dict[str, str]  # the tcp endpoints remote services use ({} when the run listens on none)
    sock_dir: str = ""  # directory of the ipc:// sockets ("" with transport=tcp)
    own_sock_dir: bool = False  # the run made sock_dir and removes it at the end

    @property
    def tcp_only(self) -> bool:
        return not self.sock_dir


def run_endpoints(cfg: Config) -> RunEndpoints:
    """transport=tcp: every socket faces tcp, found by name (Swarm). transport=ipc: ipc://
    sockets, plus tcp endpoints for remote samplers when supervisor.listen is set."""
    if cfg.supervisor.transport == "tcp":
        table = tcp_table(cfg)
        return RunEndpoints(table, table)
    directory, own = socket_dir(cfg)
    return RunEndpoints(ipc_table(directory), tcp_endpoints(cfg.supervisor.listen), directory, own)


def socket_dir(cfg: Config) -> tuple[str, bool]:
    """(directory of the ipc:// sockets, whether the run owns it and removes it at the end)."""
    path = cfg.supervisor.socket_dir
    if not path:
        return make_ipc_dir(), True
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"supervisor.socket_dir={path!r} cannot be made: {exc}") from None
    return os.path.abspath(path), False


def tcp_endpoints(listen: str) -> dict[str, str]:
    """supervisor.listen -> the tcp endpoint of each socket remote samplers use (config.TCP_OFFSETS)."""
    if not listen:
        return {}
    host, port = tcp_host(listen), tcp_port(listen)
    return {name: f"tcp://{host}:{port + offset}" for name, offset in TCP_OFFSETS.items()}
