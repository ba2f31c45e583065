"""The tokenizer's priority executor: live work first, FIFO within a priority."""

from __future__ import annotations

import os
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


def _my_nice() -> tuple[str, int]:
    import os
    import threading

    return threading.current_thread().name, os.getpriority(
        os.PRIO_PROCESS, threading.get_native_id()
    )


def test_with_a_bulk_nice_bulk_runs_on_nicer_threads_and_one_thread_keeps_live_work_only():
    import os

    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base > 14:
        pytest.skip("this process is already too nice to be made nicer by 5")
    pool = PriorityExecutor(3, "t", bulk_nice=5)
    try:
        bulk = [pool.submit(1, _my_nice) for _ in range(50)]
        ran = {f.result(timeout=10) for f in bulk}
        assert {name for name, _ in ran} <= {"t-1", "t-2"}, "the live thread took bulk work"
        assert {nice for _, nice in ran} == {base + 5}
        live = [pool.submit(0, _my_nice) for _ in range(50)]
        niceness = {f.result(timeout=10)[1] for f in live}
        assert niceness <= {base, base + 5}
    finally:
        pool.shutdown()


def test_with_a_single_thread_the_bulk_nice_is_ignored_so_nothing_starves():
    import os

    pool = PriorityExecutor(1, "one", bulk_nice=5)
    try:
        assert pool.submit(1, _my_nice).result(timeout=10) == (
            "one-0",
            os.getpriority(os.PRIO_PROCESS, 0),
        )
    finally:
        pool.shutdown()


def test_bulk_tokenization_is_niced_by_default_and_tokenizers_pool_turned_off(monkeypatch):
    from mesh.client.tokenize import bulk_nice_from_env
    from mesh.config import BULK_NICE

    monkeypatch.delenv("EMBEDMESH_BULK_NICE", raising=False)
    # Set then removed, so that monkeypatch restores its absence (delenv of an unset variable
    # records nothing, and the call below would leave it set for the rest of the session).
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "unset")
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    assert bulk_nice_from_env() == BULK_NICE > 0
    # Eight ingress processes each running tokenizers' pool on every core oversubscribed the
    # host; the executor's threads spread the work instead.
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    monkeypatch.setenv("EMBEDMESH_BULK_NICE", "0")
    assert bulk_nice_from_env() == 0 and "TOKENIZERS_PARALLELISM" not in os.environ
