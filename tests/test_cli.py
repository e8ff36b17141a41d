"""The command line's own edges: --version, help texts, argument checks, eval's messages."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from spreeze.bench import results
from spreeze.cli.main import COMMANDS, docs_line, parser

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(60)


def spreeze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spreeze.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_version_is_the_installed_packages() -> None:
    proc = spreeze("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"spreeze {metadata.version('spreeze')}"


def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_command_and_argument_has_help() -> None:
    top = parser()
    assert all(name in (top.epilog or "") for name in ("README.md", "docs/index.md", "proto/SPEC.md"))
    commands = subparsers(top)
    assert set(commands) == set(COMMANDS)
    for name, p in commands.items():  # each names its docs pages, and they exist
        assert p.epilog and p.epilog.splitlines()[-1] == docs_line(name), f"spreeze {name} --help names no docs page"
        pages = p.epilog.splitlines()[-1].removeprefix("docs: ").split(", ")
        assert all((ROOT / page).is_file() for page in pages), pages
    commands["results"] = results.parser()  # parsed by bench.results itself
    for name, p in commands.items():
        assert p.description, f"spreeze {name} --help has no description"
        bare = [a.dest for a in p._actions if not a.help]
        assert not bare, f"spreeze {name}: no help text for {bare}"


@pytest.mark.parametrize("command", ["results", "eval", "plot", "bench"])
def test_help_imports_nothing_heavy(command: str) -> None:
    """--help answers at once: torch, gymnasium, matplotlib and numpy are imported when a
    command runs, not to describe it (`spreeze results --help` took 2.6 s with them)."""
    code = ("import contextlib, io, sys\nfrom spreeze.cli.main import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    main([{command!r}, '--help'])\n"
            "print(sorted(m for m in ('torch', 'gymnasium', 'matplotlib', 'numpy') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_results_help_names_its_docs_page() -> None:
    proc = spreeze("results", "--help")  # parsed by bench.results, not by the subparser above
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == docs_line("results") and "--modes" in proc.stdout


def test_config_help_does_not_promise_an_installed_configs_folder() -> None:
    text = subparsers(parser("train"))["train"].format_help()
    assert "the repository's configs/ has examples" in " ".join(text.split())


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_eval_refuses_a_bad_episode_count_by_name(value: str, tmp_path: Path) -> None:
    proc = spreeze("eval", str(tmp_path), "--episodes", value)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("spreeze eval: error: argument --episodes:") and value in last, proc.stderr
    assert "nan" not in proc.stdout + proc.stderr and "Warning" not in proc.stderr


def test_eval_says_a_missing_run_directory_does_not_exist(tmp_path: Path) -> None:
    proc = spreeze("eval", str(tmp_path / "nowhere"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"spreeze eval: error: {str(tmp_path / 'nowhere')!r} does not exist"


def test_eval_of_a_run_without_checkpoint_says_so(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("env: Pendulum-v1\n")
    proc = spreeze("eval", str(tmp_path), "--checkpoint", "latest")
    assert proc.returncode == 2
    assert "no latest checkpoint in" in proc.stderr and "has the run evaluated at least once?" in proc.stderr


@pytest.mark.parametrize("args", [["health", "--timeout", "0"], ["conformance", "replay", "ipc:///tmp/x",
                                                                  "--timeout", "-1"],
                                  ["train", "--total-steps", "0"]])
def test_other_numbers_are_checked_by_argparse(args: list[str]) -> None:
    proc = spreeze(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"spreeze {args[0]}: error: argument "), proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_or_resume_starts_a_run_continues_it_and_leaves_a_finished_one_finished(tmp_path: Path) -> None:
    """What a container's `spreeze train --or-resume` does: a new run where there is none, the same
    run continued after a restart, a finished one ended at once, and a different run refused."""
    from tests.test_integration import FAST, records

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "spreeze.cli", "train", "--or-resume", "--run-dir", str(run_dir), *FAST]
    first = subprocess.run([*cmd, "--total-steps", "2000"], capture_output=True, text=True, timeout=200)
    assert first.returncode == 0 and "training td3 on Pendulum-v1" in first.stdout, first.stdout + first.stderr
    again = subprocess.run([*cmd, "--total-steps", "2000"], capture_output=True, text=True, timeout=200)
    assert again.returncode == 0 and "resuming td3 on Pendulum-v1" in again.stdout, again.stdout + again.stderr
    assert "budget of 2,000 env steps reached" in again.stdout  # finished: it stays finished
    more = subprocess.run([*cmd, "--total-steps", "3000"], capture_output=True, text=True, timeout=200)
    assert more.returncode == 0 and "budget of 3,000 env steps reached" in more.stdout, more.stdout + more.stderr
    spent = subprocess.run([*cmd, "--total-steps", "500"], capture_output=True, text=True, timeout=200)
    assert spent.returncode == 0 and "budget of 500 env steps reached" in spent.stdout, spent.stdout + spent.stderr
    assert len([r for r in records(run_dir, "start")]) == 4  # (a budget under the warm-up: this run is past it)
    other = subprocess.run([sys.executable, "-m", "spreeze.cli", "train", "--or-resume", "--run-dir", str(run_dir),
                            *FAST, "--algo", "sac"], capture_output=True, text=True, timeout=60)
    assert other.returncode == 2 and "--or-resume: the run in" in other.stderr and "algo" in other.stderr, other.stderr
