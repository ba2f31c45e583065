"""A thread pool that runs live work first: the tokenizer's queue.

``ThreadPoolExecutor`` is FIFO, so a query submitted behind a 2048-text bulk request waits for
all of it. Here every job has a priority (a ``Lane``: INTERACTIVE before BATCH) and jobs of one
priority run in submission order; callers split bulk work into chunks, so a query waits for at
most one running chunk per thread. No aging: bulk work only waits while queries are queued, and
tokenizing a query takes a millisecond.

The operating system's run queue is a queue on the path too: on a busy host (the GPU host's
ingress processes tokenizing bulk on every core; the 2-core host whose worker computes on both)
a query's hop through the event loop, the broker and the worker waits for a time slice behind
bulk tokenization. With ``bulk_nice`` > 0 the threads run at that lower priority (a higher
nice), except one that stays at the process's priority and takes INTERACTIVE jobs only, so
bulk tokenization uses every idle cycle but yields at once to anything live. (Linux lets a
thread raise its own nice, not lower it back, hence fixed roles rather than per-job changes.)
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class PriorityExecutor:
    """``threads`` threads taking the lowest (priority, submission order) job first; with
    ``bulk_nice`` > 0 and 2 threads or more, all but one at that nice, the one kept for
    priority-0 jobs (see the module docstring)."""

    def __init__(self, threads: int, name: str = "priority", bulk_nice: int = 0) -> None:
        if threads < 1:
            raise ValueError("a PriorityExecutor needs at least one thread")
        self._bulk_nice = bulk_nice if threads >= 2 else 0
        self._heap: list[tuple[int, int, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._closed = False
        # Thread 0 keeps the process's priority; with a bulk nice it takes live jobs only.
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, priority: int, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._wake:
            if self._closed:
                raise RuntimeError("the executor is shut down")
            heapq.heappush(self._heap, (priority, next(self._order), future, fn, args))
            if self._bulk_nice:
                # The live-only thread cannot take a bulk job: wake them all, not just any one.
                self._wake.notify_all()
            else:
                self._wake.notify()
        return future

    def queued(self) -> int:
        with self._wake:
            return len(self._heap)

    def shutdown(self) -> None:
        """Cancel what is queued; running jobs finish on their daemon threads."""
        with self._wake:
            self._closed = True
            for _, _, future, _, _ in self._heap:
                future.cancel()
            self._heap.clear()
            self._wake.notify_all()

    def _run(self, index: int) -> None:
        live_only = self._bulk_nice > 0 and index == 0
        if self._bulk_nice > 0 and index > 0:
            _lower_priority(self._bulk_nice)
        while True:
            with self._wake:
                while not self._closed and not self._takes(live_only):
                    self._wake.wait()
                if self._closed:
                    return
                _, _, future, fn, args = heapq.heappop(self._heap)
            # A job whose caller gave up (asyncio cancelled the wrapped future) is skipped.
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(exc)
            else:
                future.set_result(result)

    def _takes(self, live_only: bool) -> bool:
        return bool(self._heap) and (not live_only or self._heap[0][0] <= 0)


def _lower_priority(nice: int) -> None:
    """Raise this thread's nice by ``nice`` (Linux: setpriority on the thread id). Where that is
    not possible the thread keeps its priority: slower live work under load, nothing wrong."""
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
