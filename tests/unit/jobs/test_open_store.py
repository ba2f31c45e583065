"""Opening a store: the implementation a state URL names, the per-user default directory."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from mesh.jobs import JobStore, default_state_dir, open_store
from mesh.jobs.sqlite import SqliteJobStore
from tests.pg_server import PostgresServer


def test_both_stores_implement_the_interface(store: JobStore) -> None:
    assert isinstance(store, JobStore)


def test_the_default_state_dir_is_per_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "embedmesh"
    opened = open_store()
    assert isinstance(opened, SqliteJobStore)
    assert opened.path == tmp_path / "xdg" / "embedmesh" / "jobs.sqlite3"
    opened.close()
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_dir() == tmp_path / "home" / ".local" / "state" / "embedmesh"


def test_a_state_url_of_another_database_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="postgresql://"):
        open_store(tmp_path, "mysql://localhost/jobs")


def test_a_postgres_store_reconnects_after_its_connection_is_killed(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    import psycopg

    url = postgres_server.create_database()
    database = url.split("?")[0].rsplit("/", 1)[1]
    opened = open_store(tmp_path, url)
    made = opened.create_file(b"{}\n", filename="a", purpose="batch")
    with psycopg.connect(postgres_server.url(), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = %s",
            (database,),
        )
    with pytest.raises(psycopg.OperationalError):
        opened.get_file(made.id)
    assert opened.get_file(made.id) == made
    opened.close()


def test_a_store_that_fails_to_open_closes_its_connection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A state file that is not a database: opening fails, and the connection it made is
    closed rather than left to the garbage collector."""
    (tmp_path / "jobs.sqlite3").write_bytes(b"not a database, " * 256)
    made: list[sqlite3.Connection] = []
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        made.append(real_connect(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(sqlite3, "connect", connect)
    with pytest.raises(sqlite3.DatabaseError):
        SqliteJobStore(tmp_path)
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        made[0].execute("SELECT 1")


def test_a_postgres_store_opens_beside_an_uncommitted_write(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """A process opening its store while another is mid-commit takes no table lock the commit
    holds: ``CREATE INDEX IF NOT EXISTS`` would wait for it (and deadlock with it once the
    commit reached for a table the opener held)."""
    import threading

    import psycopg

    url = postgres_server.create_database()
    open_store(tmp_path, url).close()
    with psycopg.connect(url) as writer:  # a transaction, left open
        writer.execute("UPDATE chunks SET owner = 'x' WHERE batch_id = 'none'")
        writer.execute(
            "INSERT INTO batches (id, endpoint, input_file_id, completion_window,"
            " status, created_at, expires_at) VALUES ('b', 'e', 'f', '24h', 's', 0, 0)"
        )
        opened: list[Any] = []
        opener = threading.Thread(target=lambda: opened.append(open_store(tmp_path, url)))
        opener.start()
        opener.join(timeout=30)
        try:
            assert not opener.is_alive(), "opening the store waited on another's transaction"
        finally:
            writer.rollback()
            opener.join()
    opened[0].close()
