"""Bulk tokenization in child processes, so that it never holds the event loop's GIL.

A tokenizer thread releases the GIL inside tokenizers' Rust code but holds it to turn each
encoding's ids into Python objects and then into an array; three such threads in an ingress
hold it often enough that the event loop, which carries every live query's hops (HTTP, the
broker link), waits for it. Measured on a 2-core VM (an asyncio loop timing 5 ms sleeps
while 64-text corpus requests are tokenized at nice 10): the loop's lateness p50 / p90 / p99
was 0.44 / 1.7 / 5.0-5.3 ms with the bulk on three threads, 0.28 / 1.0 / 3.4-3.7 ms with it in
three processes. A thread at ``SCHED_IDLE`` made it worse (p99 12 ms):
a thread that holds the GIL and is preempted keeps the loop waiting, the lower its priority
the longer. On the H200, MiniLM's live p99 under bulk went from 20-29 to 15-18 ms.

So a client that owns its process (the ingress; ``MeshClient(tokenize_processes=N)``) sends
its BATCH-lane chunks to ``N`` child processes at ``bulk_nice`` and, by default, under Linux's
SCHED_IDLE (``mesh.config.BULK_SCHED``: a process, unlike a thread, holds no GIL the loop
needs, so there a lower priority only gives the live path its cores; the figures above were
measured at nice 10 alone). A chunk costs one pickle of
its texts there and of its ids back, small beside tokenizing it. Children are started by
``spawn`` (never ``fork``: the parent runs zmq's and the executor's threads) when the first
tokenizer is added, each loads a tokenizer the first time a chunk needs it, from a file the
parent wrote (tokenizer.json files run to megabytes: not sent with every chunk), and exits
with its parent. Interactive work stays in the parent: a query's tokenization is shorter than
the hop to a child and back.

A child that dies (killed, out of memory) breaks the pool: the chunk it held fails over to
the parent's threads and the pool is started afresh for the next chunk, up to MAX_RESTARTS
times; after that bulk stays on the threads. A chunk that meets an OSError (a spawn refused,
a tokenizer file gone) also runs on the threads.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Protocol

import numpy as np

from proto_msgs import ModelInfo

log = logging.getLogger("embedmesh.client")

Pool = concurrent.futures.ProcessPoolExecutor
ORPHAN_CHECK_S = 0.5  # how often a child checks that its parent lives; 0.1..5 is reasonable
# Pools started again after children died, before bulk stays on the threads for good: children
# that die every time (a broken install, a memory limit) must not cost a spawn per chunk. 1..20.
MAX_RESTARTS = 5
# Each pool's tokenizer files live in a temp folder named after its process: one left by a
# process killed outright (nothing of it runs after SIGKILL) is removed by the next pool.
DIR_PREFIX = "embedmesh-tokenizers-"


def _child_start(nice: int, parent: int, sched_idle: bool) -> None:
    """In each child, once: lower its priority (``nice``, and SCHED_IDLE when ``sched_idle``:
    ``mesh.config.BULK_SCHED``), keep tokenizers' own pool off (the children
    already spread the work over the cores) and watch for the parent's death. Ctrl-C is the
    parent's to handle: a terminal sends SIGINT to the whole process group, and a child's
    KeyboardInterrupt would break the pool (a restart, mid-drain) with a traceback each."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if nice > 0:
        with contextlib.suppress(OSError):
            os.nice(nice)
    if sched_idle:
        # Linux's SCHED_IDLE: run only on a core nothing else wants, and give way at once to
        # any other task that wakes (mesh.config.BULK_SCHED says what it gains).
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError) as exc:
            log.warning("tokenizer process: SCHED_IDLE refused (%s)", exc)
    threading.Thread(target=_exit_with, args=(parent,), name="orphan-watch", daemon=True).start()


def _exit_with(parent: int) -> None:
    """Exit once ``parent`` is gone (re-parented: another parent pid). A child waits on a pipe
    whose writing end its siblings also hold, so a parent killed outright (SIGKILL, OOM) would
    otherwise leave it waiting for ever."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    os._exit(0)


class Encoder(Protocol):
    """What a child tokenizes with: ``mesh.client.tokenize.ModelTokenizer``, given by the
    caller (this module imports no tokenizer: the pool's module imports this one)."""

    def encode(
        self, texts: list[str], truncate: bool, first: int = 0
    ) -> tuple[np.ndarray, np.ndarray]: ...


# Builds a child's encoder from a tokenizer.json and its model; pickled by reference (a class
# or a module-level function), so the child imports its module on the first chunk.
Build = Callable[[bytes, ModelInfo], Encoder]


# Children's tokenizers, by digest (set in each child process, never in the parent).
_CHILD_TOKENIZERS: dict[str, Encoder] = {}


def _child_encode(
    build: Build,
    digest: str,
    path: str,
    model: ModelInfo,
    texts: list[str],
    truncate: bool,
    first: int,
) -> tuple[np.ndarray, np.ndarray]:
    """In a child: ``encode`` of ``texts`` with the tokenizer of ``digest`` (built by ``build``
    from ``path`` the first time). Its errors (InvalidInput) pickle back as they are."""
    tok = _CHILD_TOKENIZERS.get(digest)
    if tok is None:
        tok = _CHILD_TOKENIZERS[digest] = build(Path(path).read_bytes(), model)
    return tok.encode(texts, truncate, first)


def _remove_orphaned_dirs() -> None:
    """Remove the tokenizer folders (``DIR_PREFIX`` + pid) of processes that no longer run."""
    for folder in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*"):
        pid = folder.name[len(DIR_PREFIX) :].partition("-")[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running, and not ours to clean
        return True
    return True


def _noop() -> None:
    """Submitted once per child at start, so that they spawn before the first bulk request."""


class BulkProcesses:
    """``processes`` children tokenizing bulk chunks (see the module docstring)."""

    def __init__(self, processes: int, nice: int, sched_idle: bool = False) -> None:
        if processes < 1:
            raise ValueError("BulkProcesses needs at least one process")
        self.processes = processes
        self.nice = nice
        self.sched_idle = sched_idle
        _remove_orphaned_dirs()
        self._dir = tempfile.TemporaryDirectory(prefix=f"{DIR_PREFIX}{os.getpid()}-")
        self._json: dict[str, bytes] = {}  # to write a file again that a /tmp cleaner removed
        self._lock = threading.Lock()
        self._pool: Pool | None = None
        self._closed = False
        self.restarts = 0  # pools started again after a child died

    def add(self, digest: str, tokenizer_json: bytes) -> None:
        """Make ``digest``'s tokenizer loadable by the children; starts them the first time."""
        if digest not in self._json:
            self._json[digest] = tokenizer_json
            self._path(digest).write_bytes(tokenizer_json)
        with contextlib.suppress(BrokenProcessPool):  # given up on children: threads serve
            self._get_pool()

    def submit(
        self,
        build: Build,
        digest: str,
        model: ModelInfo,
        texts: list[str],
        truncate: bool,
        first: int,
    ) -> tuple[Pool, concurrent.futures.Future[tuple[np.ndarray, np.ndarray]]]:
        """One chunk to a child, tokenized by the encoder ``build`` makes of the tokenizer of
        ``digest``: the pool it went to and its future. Raises BrokenProcessPool
        when the pool broke (the caller runs the chunk elsewhere and calls ``broken``) and
        RuntimeError once closed."""
        pool = self._get_pool()
        path = self._path(digest)
        if not path.exists():  # a child may need it yet (its first chunk, a new pool)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self._json[digest])
        try:
            args = (build, digest, str(path), model, texts, truncate, first)
            return pool, pool.submit(_child_encode, *args)
        except BrokenProcessPool as exc:  # broke before this chunk: the same as under it
            self.broken(pool, exc)
            raise

    def broken(self, pool: Pool, error: BaseException) -> None:
        """A chunk sent to ``pool`` failed with ``error`` (a child died): the next chunk
        starts a fresh pool. Every chunk of the broken pool calls this; the first counts."""
        with self._lock:
            if self._pool is not pool:
                return
            self._pool = None
            self.restarts += 1
            again = self.restarts <= MAX_RESTARTS
        if again:
            log.warning("a tokenizer process died (%s); starting them again", error)
        else:
            log.error("tokenizer processes died %d times (last: %s); bulk tokenization stays "
                      "on this process's threads", self.restarts, error)  # fmt: skip
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._dir.cleanup()

    def _path(self, digest: str) -> Path:
        return Path(self._dir.name) / f"{digest}.json"

    def _get_pool(self) -> Pool:
        with self._lock:
            if self._closed:
                raise RuntimeError("the tokenizer processes are shut down")
            if self.restarts > MAX_RESTARTS:
                raise BrokenProcessPool(f"tokenizer processes died {self.restarts} times")
            if self._pool is None:
                self._pool = Pool(
                    self.processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_child_start,
                    initargs=(self.nice, os.getpid(), self.sched_idle),
                )
                for _ in range(self.processes):
                    self._pool.submit(_noop)
            return self._pool


__all__ = ["BrokenProcessPool", "BulkProcesses"]
