"""A throwaway PostgreSQL server for tests, from the machine's own binaries.

``initdb`` + ``pg_ctl`` on a temporary directory, no TCP listener: the socket lives in that
directory on a free port number. ``initdb`` refuses to run as root, so as root the server runs
as the ``postgres`` user (Debian's package creates it), else ``nobody``. Without binaries,
``find_bin_dir`` returns None and the tests that need a server skip.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

BIN_ENV = "EMBEDMESH_PG_BIN"  # a directory holding initdb and pg_ctl, to pick a version
START_TIMEOUT_S = 60


def find_bin_dir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``: $EMBEDMESH_PG_BIN, Debian's newest, PATH."""
    candidates = [os.environ.get(BIN_ENV, "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for folder in candidates:
        if folder and all((Path(folder) / b).is_file() for b in ("initdb", "pg_ctl")):
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_user() -> str | None:
    """Who runs the server: None (this user) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root and no 'postgres' or 'nobody' user to run PostgreSQL")


class PostgresServer:
    """One running server; ``url(db)`` for a database on it, ``create_database`` for a fresh one."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        # Short path: a unix socket's path is limited to ~100 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="pg-"))
        self.port = _free_port()
        self.user = _server_user()
        self._names = itertools.count(1)

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        done = subprocess.run(
            [*prefix, *argv], capture_output=True, text=True, timeout=START_TIMEOUT_S
        )
        if done.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed: {done.stderr.strip()[-2000:]}")

    def start(self) -> PostgresServer:
        if self.user:
            shutil.chown(self.dir, user=self.user)
        data = self.dir / "data"
        self._run(
            str(self.bin_dir / "initdb"),
            "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        options = f"-p {self.port} -k {self.dir} -c listen_addresses='' -c fsync=off"
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "-D", str(data), "-o", options, "-l", str(self.dir / "log"), "-w", "start",
        )  # fmt: skip
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.dir}&port={self.port}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = f"t{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(
                str(self.bin_dir / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate",
                "-w", "stop",
            )  # fmt: skip
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
