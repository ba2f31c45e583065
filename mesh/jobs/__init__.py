"""Durable bulk jobs: OpenAI's Files and Batches, kept in a store any process can resume from.

``open_store`` picks the implementation: SQLite under a state directory (one host), or
PostgreSQL for a ``postgresql://`` URL (a fleet; the blobs then on a shared volume).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mesh.jobs.objects import Batch, BatchError, BatchStatus, FileObject, FilePurpose
from mesh.jobs.store import (
    ChunkSpan,
    Conflict,
    JobStore,
    JobStoreError,
    Lease,
    LeaseLost,
    LineResult,
    NotFound,
    Page,
    TooLarge,
)


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/embedmesh``, else ``~/.local/state/embedmesh``: per user."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "embedmesh"


def open_store(
    state_dir: str | os.PathLike[str] | None = None,
    state_url: str | None = None,
    **options: Any,
) -> JobStore:
    """The store for ``state_url`` (``postgresql://...``), else SQLite under ``state_dir``.

    With PostgreSQL the blobs live under ``state_dir`` too: on a fleet, a volume every host
    mounts at the same path.
    """
    root = Path(state_dir) if state_dir is not None else default_state_dir()
    if state_url:
        if not state_url.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"state URL must be postgresql://..., not {state_url.split(':')[0]}")
        from mesh.jobs.postgres import PostgresJobStore

        return PostgresJobStore(state_url, blob_dir=root / "blobs", **options)
    from mesh.jobs.sqlite import SqliteJobStore

    return SqliteJobStore(root, **options)


__all__ = [
    "Batch",
    "BatchError",
    "BatchStatus",
    "ChunkSpan",
    "Conflict",
    "FileObject",
    "FilePurpose",
    "JobStore",
    "JobStoreError",
    "Lease",
    "LeaseLost",
    "LineResult",
    "NotFound",
    "Page",
    "TooLarge",
    "default_state_dir",
    "open_store",
]
