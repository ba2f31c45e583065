"""The Files and Batches API's store as one ingress process reaches it: opened on first use,
every call on a small thread pool (SQLite and psycopg block; the event loop must not), and the
store's errors as OpenAI's HTTP errors.

With SQLite nothing is created until the first upload: a server whose users never send a batch
leaves no state directory behind. The runner (``mesh.ingress.batch_runner``) waits until the
database exists; with PostgreSQL it opens the store at start.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from aiohttp import web

from mesh.ingress.batch_metrics import BatchProgress
from mesh.ingress.config import JobsConfig
from mesh.ingress.http_errors import ApiError
from mesh.ingress.uploads import UploadRoom
from mesh.jobs import Conflict, JobStore, NotFound, TooLarge, open_store
from mesh.jobs.sqlite import DB_NAME

T = TypeVar("T")

log = logging.getLogger("embedmesh.batches")

# Threads running store calls: the store serializes its transactions on one connection, so a
# second thread only lets a blob read or write overlap a transaction; 2..4 is reasonable.
STORE_THREADS = 3
# Threads writing uploads: each waits on its client's network for the whole upload, so uploads
# get threads of their own, or a few slow ones would stall every store call of the process
# (the runner's lease renewals among them); past this many, an upload waits its turn. 4..32.
UPLOAD_THREADS = 8


class Jobs:
    """One process's handle on the store."""

    def __init__(self, cfg: JobsConfig) -> None:
        self.cfg = cfg
        self._store: JobStore | None = None
        self.progress = BatchProgress()  # /metrics' gauges, refreshed by the runner
        self.room = UploadRoom(UPLOAD_THREADS)
        self._pool = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="embedmesh-jobs")
        self._uploads = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="embedmesh-upload")
        self._opening = asyncio.Lock()

    def exists(self) -> bool:
        """Whether there is a store to work on (PostgreSQL: always; SQLite: once created)."""
        return bool(self.cfg.state_url) or (Path(self.cfg.state_dir) / DB_NAME).exists()

    async def store(self) -> JobStore:
        if self._store is None:
            async with self._opening:
                if self._store is None:
                    self._store = await self.run(self._open)
        return self._store

    def _open(self) -> JobStore:
        return open_store(
            self.cfg.state_dir, self.cfg.state_url, output_retention_s=self.cfg.retention_s
        )

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the store's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def upload(self, fn: Callable[[], T]) -> T:
        """``fn()``, a store call that reads an upload from the network, on the upload threads."""
        return await asyncio.get_running_loop().run_in_executor(self._uploads, fn)

    async def call(self, fn: Callable[[JobStore], T], *, create: bool = False) -> T:
        """``fn(store)`` on the store's threads, the store's errors as HTTP errors. Only a
        call that ``create``s makes a store that is not there yet; the others answer 404."""
        if not create and not self.exists():
            raise ApiError(404, "no such object: nothing is stored yet", code="not_found")
        try:
            return await self.run(fn, await self.store())
        except NotFound as exc:
            raise ApiError(404, str(exc), code="not_found") from None
        except Conflict as exc:
            raise ApiError(409, str(exc), code="conflict") from None
        except TooLarge as exc:
            raise ApiError.too_large(str(exc), "file") from None
        except Exception as exc:
            if not unreachable(exc):
                raise
            raise store_unavailable(exc) from None

    async def close(self) -> None:
        if self._store is not None:
            await self.run(self._store.close)
            self._store = None
        self._pool.shutdown(wait=False)
        self._uploads.shutdown(wait=False)


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` is the database's own failure (down, unreachable, locked past the busy
    timeout): no answer about the call, which may succeed when retried."""
    if isinstance(exc, sqlite3.OperationalError):
        return True
    psycopg = sys.modules.get("psycopg")  # imported only by a PostgreSQL store
    return psycopg is not None and isinstance(exc, psycopg.OperationalError)


def store_unavailable(exc: BaseException) -> ApiError:
    """The 503 for an ``unreachable`` store; the details (a host, a path) go to the log, for
    the operator, not to the API's clients."""
    log.warning("the batch store cannot be reached: %s", exc)
    return ApiError(
        503, "the batch store (its database) cannot be reached or is busy; retry later",
        "server_error", "unavailable",
    )  # fmt: skip


JOBS = web.AppKey("embedmesh_jobs", Jobs)


def jobs_of(request: web.Request) -> Jobs:
    """The app's store handle; 503 when this ingress runs without one."""
    jobs = request.app.get(JOBS)
    if jobs is None:
        raise ApiError(
            503, "the batch API is off on this server (it has no state directory)",
            "server_error", "unavailable",
        )  # fmt: skip
    return jobs


def invalid(message: str, param: str | None = None) -> ApiError:
    """OpenAI's answer to a wrong value on the Files and Batches routes: 400."""
    return ApiError(400, message, code="invalid_request", param=param)


def page_args(request: web.Request) -> tuple[int, str | None]:
    """OpenAI's ``limit`` (1..100, default 20) and ``after`` query parameters."""
    raw = request.query.get("limit", "20")
    try:
        limit = int(raw)
    except ValueError:
        raise invalid(f"'limit' must be an integer; got {raw!r}", "limit") from None
    if not 1 <= limit <= 100:
        raise invalid(f"'limit' must be between 1 and 100; got {limit}", "limit")
    return limit, request.query.get("after") or None
