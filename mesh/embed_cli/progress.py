"""The sidecar progress file (``OUT.progress``): what an interrupted run had durably written.

It is rewritten atomically (a temporary file, fsynced, renamed over it, the directory fsynced)
only after the output it describes was fsynced, so after any crash it never claims more than
the output holds. ``job`` names the run it belongs to (the input file and the options that
change the output), so that ``--resume`` refuses to continue a different run.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mesh.embed_cli.errors import InputError


@dataclass
class Progress:
    """``rows`` input rows written; ``sink`` the output's own resume state (bytes, parts)."""

    job: dict[str, Any]
    rows: int = 0
    sink: dict[str, Any] = field(default_factory=dict)


def progress_path(out: Path) -> Path:
    return out.with_name(out.name + ".progress")


def job_of(source: Path, **options: Any) -> dict[str, Any]:
    """What identifies a run: the input (path, size, modification time) and ``options``."""
    stat = source.stat()
    return {"input": str(source.resolve()), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, **options}  # fmt: skip


def load(path: Path, job: dict[str, Any]) -> Progress:
    """The saved progress of ``job``; an input error if the file belongs to another run."""
    try:
        doc = json.loads(path.read_text())
        saved = Progress(doc["job"], int(doc["rows"]), dict(doc["sink"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: unreadable progress file ({exc}); use --force") from None
    if saved.job != job:
        changed = sorted(k for k in {**job, **saved.job} if job.get(k) != saved.job.get(k))
        raise InputError(
            f"{path} belongs to another run ({', '.join(changed)} differ); rerun it as it was, "
            "or start over with --force"
        )
    return saved


def save(path: Path, progress: Progress) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump(asdict(progress), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Makes a rename or a new file in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
