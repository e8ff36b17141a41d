"""supervisor.transport=tcp: every socket on tcp://, announced by the binder's name (Docker Swarm).

Unit: the endpoint table, where a binder binds, and config errors naming the bad value.
Integration: a whole local run with every socket on tcp (names mapped to 127.0.0.1) trains
to its budget and leaves no ipc socket anywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spreeze.common.config import TCP_OFFSETS, TCP_PORT_ORDER
from spreeze.common.errors import ConfigError
from spreeze.common.transport import bind_address
from spreeze.services.supervisor.endpoints import tcp_table
from tests.helpers import config, free_port_base
from tests.test_integration import best_eval, records, train


def test_every_socket_is_named_by_its_binder_and_numbered_from_tcp_port(tmp_path: Path) -> None:
    cfg = config(tmp_path, "supervisor.transport=tcp", "supervisor.tcp_port=7000", "learner.mode=split")
    table = tcp_table(cfg)
    assert table == {"control": "tcp://supervisor:7000", "metrics_in": "tcp://supervisor:7001",
                     "experience": "tcp://replay:7002", "actor_weights": "tcp://actor_learner:7003",
                     "metrics_out": "tcp://supervisor:7004", "sample": "tcp://replay:7005",
                     "actor_sync": "tcp://actor_learner:7006", "critic_sync": "tcp://critic_learner:7007"}
    assert set(table) == set(TCP_PORT_ORDER)
    assert all(table[name].endswith(str(7000 + off)) for name, off in TCP_OFFSETS.items())  # as listen has them
    fused = tcp_table(config(tmp_path, "supervisor.transport=tcp", "learner.mode=fused",
                             "supervisor.tcp_hosts=all=127.0.0.2, replay=db"))
    assert fused["actor_weights"] == "tcp://127.0.0.2:5558" and fused["sample"] == "tcp://db:5560"


def test_a_binder_binds_its_own_port_when_announced_by_name() -> None:
    assert bind_address("tcp://replay:5557") == "tcp://*:5557"
    assert bind_address("tcp://127.0.0.1:5557") == "tcp://127.0.0.1:5557"
    assert bind_address("tcp://[::1]:5557") == "tcp://[::1]:5557"
    assert bind_address("tcp://localhost:5557") == "tcp://localhost:5557"
    assert bind_address("ipc:///tmp/x/control") == "ipc:///tmp/x/control"


@pytest.mark.parametrize("override, named", [
    ("supervisor.transport=udp", "supervisor.transport='udp'"),
    ("supervisor.tcp_hosts=replay", "'replay'"),
    ("supervisor.tcp_hosts=reply=db", "'reply=db'"),
    ("supervisor.tcp_port=65530", "supervisor.tcp_port=65530"),
])
def test_bad_tcp_settings_are_refused_by_name(tmp_path: Path, override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("[", r"\[")):
        config(tmp_path, "supervisor.transport=tcp", override)


def test_listen_has_no_use_with_tcp_transport(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="supervisor.listen='tcp://0.0.0.0:6000' has no use"):
        config(tmp_path, "supervisor.transport=tcp", "supervisor.listen=tcp://0.0.0.0:6000")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_with_every_socket_on_tcp_trains_split_learners(tmp_path: Path) -> None:
    run, sockets = tmp_path / "tcp", tmp_path / "no-ipc"
    base = free_port_base(len(TCP_PORT_ORDER))
    proc = train(run, "--total-steps", "4000", "learner.mode=split", "supervisor.transport=tcp",
                 f"supervisor.tcp_port={base}", "supervisor.tcp_hosts=all=127.0.0.1",
                 f"supervisor.socket_dir={sockets}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "budget of 4,000 env steps reached" in proc.stdout
    assert best_eval(run) > -1600  # it evaluated (learning is the other tests' business)
    assert not sockets.exists()  # no ipc socket directory: nothing shared but tcp
    assert not [e for e in records(run, "event") if e.get("event") == "restart"]
