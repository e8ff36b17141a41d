"""Where every socket of a run is: what the supervisor names in each Welcome.

transport=ipc (one host): ipc:// paths in the run's private socket directory.
transport=tcp (Docker Swarm, several hosts): tcp://HOST:PORT for every socket, where HOST
is the name of the service that binds it (its Swarm/compose service name, resolved by the
engine's DNS; supervisor.tcp_hosts renames) and PORT is supervisor.tcp_port plus the
socket's place in config.TCP_PORT_ORDER. The binder binds the port on its own container
(common.transport.bind_address); everyone else connects by name, never by a container IP.
"""

from __future__ import annotations

from common.config import TCP_PORT_ORDER, Config, tcp_host_map
from common.transport import ipc_endpoint
from proto.names import ACTOR_LEARNER, CRITIC_LEARNER, LEARNER, REPLAY, SOCKETS

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
