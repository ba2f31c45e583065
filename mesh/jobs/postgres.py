"""The job store on PostgreSQL, for a fleet: every ingress host on one database, the blobs on
a volume they all mount.

A claim is ``SELECT ... FOR UPDATE SKIP LOCKED``: two hosts claiming at once lock different
chunks, never wait for each other, never get the same one. A row a transaction will rewrite
is read ``FOR UPDATE``. Timestamps are the hosts' clocks (keep them in NTP sync): leases last
tens of seconds, far longer than clock skew. Needs the ``postgres`` extra (psycopg 3).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from mesh.jobs.blobs import BlobStore
from mesh.jobs.schema import ddl, objects
from mesh.jobs.sql import Tx
from mesh.jobs.work import SqlJobStore

# Any constant: transactions creating the schema at once take this lock in turn.
SCHEMA_LOCK = 0x656D62


class _Row(dict):
    """A row readable by column name and by position, as ``sqlite3.Row`` is."""

    def __init__(self, names: Sequence[str], values: Sequence[Any]) -> None:
        super().__init__(zip(names, values, strict=True))
        self._values = values

    def __getitem__(self, key: str | int) -> Any:
        return self._values[key] if isinstance(key, int) else super().__getitem__(key)


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], _Row]:
    names = [c.name for c in cursor.description or ()]
    return lambda values: _Row(names, values)


class PostgresJobStore(SqlJobStore):
    placeholder = "%s"
    row_lock = " FOR UPDATE"

    def __init__(self, url: str, *, blob_dir: str | os.PathLike[str], **options: Any) -> None:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "a postgresql:// state URL needs psycopg: pip install 'embedmesh[postgres]'"
            ) from exc
        super().__init__(BlobStore(blob_dir), **options)
        self._psycopg = psycopg
        self.integrity_errors = (psycopg.errors.IntegrityError,)
        self._url = url
        self._lock = threading.Lock()
        self._conn = self._connect()
        try:
            with self._tx() as tx:
                tx.q("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))
                # Only when something is missing: CREATE INDEX IF NOT EXISTS takes its table's
                # SHARE lock before it looks, and a store opening beside running commits
                # would deadlock with them.
                if not self._has_schema(tx):
                    for statement in ddl("BIGSERIAL PRIMARY KEY"):
                        tx.q(statement)
        except BaseException:
            self._conn.close()  # a store that failed to open keeps no connection
            raise

    @staticmethod
    def _has_schema(tx: Tx) -> bool:
        names = objects()
        found = tx.scalar(
            "SELECT COUNT(*) FROM unnest(?::text[]) AS n WHERE to_regclass(n) IS NOT NULL",
            (names,),
        )
        return found == len(names)

    def _connect(self) -> Any:
        return self._psycopg.connect(self._url, autocommit=True, row_factory=_row_factory)

    def lock_of(self, table: str) -> str:
        return f" FOR UPDATE OF {table}"

    def claim_lock(self, table: str) -> str:
        return f" FOR UPDATE OF {table} SKIP LOCKED"

    @contextmanager
    def _tx(self, *, write: bool = True) -> Iterator[Tx]:
        with self._lock:
            if self._conn.closed or self._conn.broken:
                # The server restarted or the link dropped: the next call gets a fresh one.
                self._conn = self._connect()
            with self._conn.transaction(), self._conn.cursor() as cursor:
                yield Tx(cursor, "%s")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
