"""The job store on SQLite (standard library): one file under the state directory.

WAL lets readers run beside the one writer; every write transaction is ``BEGIN IMMEDIATE``, so
it takes SQLite's single write lock before it reads what it will change: a claim's SELECT and
UPDATE cannot interleave with another process's. Several processes on one host share the file
safely (not over a network file system: SQLite's locks need a local one). Open one store
per process, after any fork: a connection must not cross into a child.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mesh.jobs.blobs import BlobStore
from mesh.jobs.schema import ddl
from mesh.jobs.sql import Tx
from mesh.jobs.work import SqlJobStore

DB_NAME = "jobs.sqlite3"
BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another process's transaction


class SqliteJobStore(SqlJobStore):
    integrity_errors = (sqlite3.IntegrityError,)

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        blob_dir: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        root = Path(state_dir)
        root.mkdir(parents=True, exist_ok=True)
        super().__init__(BlobStore(blob_dir if blob_dir is not None else root / "blobs"), **options)
        self.path = root / DB_NAME
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        try:
            self._conn.row_factory = sqlite3.Row
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            # FULL: a commit reaches the disk before the chunk is called done (one fsync a chunk).
            self._conn.execute("PRAGMA synchronous = FULL")
            with self._tx() as tx:
                for statement in ddl("INTEGER PRIMARY KEY AUTOINCREMENT"):
                    tx.q(statement)
        except BaseException:
            self._conn.close()  # a store that failed to open keeps no connection
            raise

    @contextmanager
    def _tx(self, *, write: bool = True) -> Iterator[Tx]:
        # One connection per store; the lock keeps threads (asyncio.to_thread) from sharing a
        # transaction.
        with self._lock:
            cursor = self._conn.cursor()
            cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield Tx(cursor, "?")
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
            else:
                cursor.execute("COMMIT")
            finally:
                cursor.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
