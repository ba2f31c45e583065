"""A thread pool that runs live work first: the tokenizer's queue.

``ThreadPoolExecutor`` is FIFO, so a query submitted behind a 2048-text bulk request waits for
all of it. Here every job has a priority (a ``Lane``: INTERACTIVE before BATCH) and jobs of one
priority run in submission order; callers split bulk work into chunks, so a query waits for at
most one running chunk per thread. No aging: bulk work only waits while queries are queued, and
tokenizing a query takes a millisecond.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class PriorityExecutor:
    """``threads`` threads taking the lowest (priority, submission order) job first."""

    def __init__(self, threads: int, name: str = "priority") -> None:
        if threads < 1:
            raise ValueError("a PriorityExecutor needs at least one thread")
        self._heap: list[tuple[int, int, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
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

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap and not self._closed:
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
