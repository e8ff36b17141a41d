"""The layers of DESIGN.md, one way only, checked over every module's imports (lazy ones too).

proto/ imports nothing of the project; common/ imports proto only (and itself); services/
import spreeze.common and proto, never one another, except that the learner services share
services/learner/base.py; bench/ and the command line (cli/) sit on top, cli/ above all.
No import cycles among the project's modules. `spreeze health` stays light (no torch), and so
do the services that do not train.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("proto", "common", "services", "bench", "cli")
LEARNER_SERVICES = ("spreeze.services.learner", "spreeze.services.actor_learner", "spreeze.services.critic_learner")
LEARNER_BASE = "spreeze.services.learner.base"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports(name: str) -> set[str]:
    """Project modules `name` imports anywhere in its body (functions and TYPE_CHECKING blocks too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t.split(".")[0] in PACKAGES)
    return found - {name}


GRAPH = {name: imports(name) for name in MODULES}


def layer_violation(importer: str, imported: str) -> str | None:
    top, target = importer.split(".")[0], imported.split(".")[0]
    if top == "proto" and target != "proto":
        return "proto/ imports nothing of the project"
    if top == "common" and target not in ("common", "proto"):
        return "common/ imports proto/ (and common/) only"
    if top == "services":
        if target not in ("services", "common", "proto"):
            return "services/ import common/ and proto/ only"
        own, other = ".".join(importer.split(".")[:2]), ".".join(imported.split(".")[:2])
        if target == "services" and other != own and not (own in LEARNER_SERVICES and imported == LEARNER_BASE):
            return "services/ never import one another (the learner services share services/learner/base.py)"
    if top == "bench" and target == "cli":
        return "bench/ sits below the command line"
    return None


def test_every_package_was_found() -> None:
    assert {"spreeze.proto.codec", "spreeze.proto.messages", "spreeze.common.transport", "spreeze.services.supervisor.main", "spreeze.cli.main",
            "spreeze.bench.update"} <= set(MODULES)
    assert "spreeze.services.learner.base" in GRAPH["spreeze.services.actor_learner.main"]


def test_imports_follow_the_layers() -> None:
    bad = [f"{a} imports {b}: {why}" for a, targets in sorted(GRAPH.items()) for b in sorted(targets)
           if (why := layer_violation(a, b)) is not None]
    assert not bad, "\n".join(bad)


def test_the_rules_catch_what_they_forbid() -> None:
    assert layer_violation("spreeze.proto.messages", "spreeze.common.errors")
    assert layer_violation("spreeze.common.cli", "spreeze.services.supervisor.main")
    assert layer_violation("spreeze.common.config", "spreeze.bench.system")
    assert layer_violation("spreeze.services.replay.main", "spreeze.services.sampler.main")
    assert layer_violation("spreeze.services.evaluator.main", "spreeze.services.learner.base")
    assert layer_violation("spreeze.services.actor_learner.main", "spreeze.services.learner.main")
    assert layer_violation("spreeze.services.supervisor.main", "spreeze.cli.main")
    assert layer_violation("spreeze.bench.update", "spreeze.cli.main")
    assert layer_violation("spreeze.services.critic_learner.main", "spreeze.services.learner.base") is None
    assert layer_violation("spreeze.cli.train", "spreeze.services.supervisor.start") is None
    assert layer_violation("spreeze.bench.update", "spreeze.services.supervisor.main") is None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), as sorted lists."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles(GRAPH) == []


@pytest.mark.parametrize("command", ["health", "keys", "sampler", "conformance"])
def test_light_commands_import_no_torch(command: str) -> None:
    """The command line imports a command's module only when it runs: `spreeze health` (a
    container's health check) must not pay for torch, gymnasium or the run config."""
    code = (f"import sys\nfrom spreeze.cli.main import parser\nparser({command!r})\n"
            "heavy = sorted(m for m in ('torch', 'gymnasium', 'spreeze.common.config') if m in sys.modules)\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("module", ["spreeze.services.sampler.main", "spreeze.services.replay.main",
                                    "spreeze.services.visualizer.main", "spreeze.services.supervisor.main"])
def test_services_that_do_not_train_import_no_torch(module: str) -> None:
    """Only learners (and the evaluator, which writes torch checkpoints) import torch: the run
    config and the algorithm descriptors are torch-free, so a sampler host needs no torch and a
    run's start-up spends its CPU on the learner's compile, not on four more torch imports."""
    code = f"import sys\nimport {module}\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr


def test_a_health_check_run_imports_nothing_heavy(tmp_path: Path) -> None:
    """Docker runs `spreeze health` in every container every few seconds: the whole command,
    run against a socket nobody answers, loads neither torch, gymnasium, asyncio nor the config."""
    code = ("import sys\nfrom spreeze.cli.main import main\n"
            f"status = main(['health', 'ipc://{tmp_path}/nobody', '--timeout', '0.05'])\n"
            "heavy = sorted(m for m in ('torch', 'gymnasium', 'asyncio', 'spreeze.common.config') if m in sys.modules)\n"
            "print(status, heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "1 []", out.stdout + out.stderr


EXAMPLE_IMPORTS = {"gymnasium", "msgpack", "numpy", "zmq"}  # what an outside implementation may need


def test_examples_import_nothing_of_the_project() -> None:
    """examples/ show what a third party writes from proto/SPEC.md alone: the standard library
    and pyzmq, msgpack, numpy, gymnasium, nothing of Spreeze (and at most 200 lines)."""
    for path in sorted((ROOT / "examples").glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                found.add((node.module or ".").split(".")[0])
        outside = found - EXAMPLE_IMPORTS - set(sys.stdlib_module_names)
        assert not outside, f"{path.name} imports {sorted(outside)}"
        assert len(path.read_text().splitlines()) <= 200, path.name
