"""Checkpoint files that survive a crash mid-write and say when they were damaged since.

A checkpoint (checkpoints/<name>.pt) is written whole or not at all: serialized in memory,
written to a temporary file, flushed to disk and renamed over the old one; the one it
replaces is kept as <name>.prev.pt. torch.save writes a zip archive with a CRC-32 of every
member, so whether a file reads back whole is checked without torch (`damage`), also for a
flipped byte that torch.load would accept. A reader takes the newest whole file of the two
(`readable`) and names both, with what is wrong, when neither is.
"""

from __future__ import annotations

import io
import logging
import os
import zipfile
from pathlib import Path
from typing import Any

from spreeze.common.disk import write_atomically
from spreeze.common.errors import CheckpointError

log = logging.getLogger(__name__)

PREVIOUS = ".prev.pt"


def previous(path: Path) -> Path:
    """Where the checkpoint `path` replaced is kept."""
    return path.with_name(path.name.removesuffix(".pt") + PREVIOUS)


def save_checkpoint(obj: Any, path: str | Path) -> None:
    """torch.save `obj` to `path` whole or not at all; the file it replaces becomes `previous`."""
    import torch

    path = Path(path)
    buffer = io.BytesIO()
    torch.save(obj, buffer)  # in memory first: a full disk shows as an OSError of the write below
    if path.is_file():
        os.replace(path, previous(path))  # (a crash right after leaves only the previous: `readable` takes it)
    write_atomically(path, buffer.getbuffer().tobytes())


def damage(path: Path) -> str | None:
    """What is wrong with the checkpoint file `path` (None: it reads back whole)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except FileNotFoundError:
        return "missing"
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        return f"not a whole checkpoint ({exc})"
    except (zipfile.LargeZipFile, ValueError, NotImplementedError) as exc:
        return f"unreadable ({exc})"
    return f"its member {bad} does not match its checksum" if bad is not None else None


def readable(path: Path) -> Path | None:
    """`path`, or the previous checkpoint where `path` is damaged or missing (warned about);
    None where there is neither; CheckpointError naming both where both are damaged."""
    prev = previous(path)
    if not path.is_file() and not prev.is_file():
        return None
    problems: list[str] = []
    for candidate in (path, prev):
        wrong = damage(candidate)
        if wrong is None:
            if problems:
                log.warning("%s; using the checkpoint before it, %s", "; ".join(problems), candidate)
            return candidate
        problems.append(f"{candidate} is {wrong}" if wrong == "missing" else f"{candidate}: {wrong}")
    raise CheckpointError(f"no whole checkpoint: {'; '.join(problems)}. Start a new run, or move these files "
                          "away to resume with fresh networks")


def check_checkpoints(directory: Path) -> list[str]:
    """Every checkpoint of a run directory readable (CheckpointError otherwise); a line for each
    that will be read from its previous file."""
    notes = []
    names = {p.name.removesuffix(PREVIOUS).removesuffix(".pt") for p in directory.glob("*.pt")}
    for name in sorted(names):
        path = directory / f"{name}.pt"
        used = readable(path)
        if used is not None and used != path:
            notes.append(f"{path} is {damage(path)}; {used.name} is used instead")
    return notes
