"""The tokenizer's priority executor: live work first, FIFO within a priority."""

from __future__ import annotations

import threading

import pytest

from mesh.client.executor import PriorityExecutor
from proto_msgs import Lane


@pytest.fixture
def one_thread():
    pool = PriorityExecutor(1, "test")
    yield pool
    pool.shutdown()


def test_a_later_query_runs_before_queued_bulk_work(one_thread: PriorityExecutor) -> None:
    ran: list[str] = []
    gate = threading.Event()
    busy = one_thread.submit(Lane.BATCH, gate.wait)  # holds the only thread
    bulk = [one_thread.submit(Lane.BATCH, ran.append, f"bulk{i}") for i in range(3)]
    query = one_thread.submit(Lane.INTERACTIVE, ran.append, "query")
    gate.set()
    for job in [busy, *bulk, query]:
        job.result(timeout=10)
    assert ran == ["query", "bulk0", "bulk1", "bulk2"]


def test_a_cancelled_job_is_skipped_and_errors_reach_the_caller(
    one_thread: PriorityExecutor,
) -> None:
    ran: list[str] = []
    gate = threading.Event()
    busy = one_thread.submit(Lane.BATCH, gate.wait)
    dropped = one_thread.submit(Lane.BATCH, ran.append, "dropped")
    failing = one_thread.submit(Lane.BATCH, int, "not a number")
    assert dropped.cancel()
    gate.set()
    busy.result(timeout=10)
    with pytest.raises(ValueError):
        failing.result(timeout=10)
    assert ran == []


def test_shutdown_cancels_what_is_queued() -> None:
    pool = PriorityExecutor(1, "test")
    gate = threading.Event()
    pool.submit(Lane.BATCH, gate.wait)
    queued = pool.submit(Lane.BATCH, print, "never")
    pool.shutdown()
    gate.set()
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(Lane.BATCH, print)
