"""A worker's reported compute time is peer input: no value of it may stop dispatch."""

from __future__ import annotations

import math

import pytest

from proto_msgs import BatchAssign
from tests.unit.broker.fakes import Harness, answer, submit


@pytest.mark.parametrize("compute_ms", [1e-320, float("nan"), float("inf")])
def test_a_nonsense_compute_time_neither_poisons_the_rate_nor_stops_dispatch(compute_ms):
    h = Harness()
    h.add_worker(b"w1")
    h.submit(submit(1, [16, 16]))  # large enough for its rate to count
    [(_, batch)] = h.back.take(BatchAssign)
    result = answer(batch)
    result.compute_ms = compute_ms
    h.back.push(b"w1", result)
    h.pump()
    worker = h.broker.registry.workers[b"w1"]
    assert math.isfinite(worker.rate)
    h.submit(submit(2, [4]))
    assert len(h.back.take(BatchAssign)) == 1, "the model's next request must be dispatched"
    assert h.broker.handler_errors == 0


@pytest.mark.parametrize("compute_ms", [float("nan"), float("inf"), -5.0])
def test_a_nonsense_compute_time_reaches_clients_as_unknown(compute_ms):
    h = Harness()
    h.add_worker(b"w1")
    chunk = h.answered_chunk(compute_ms=compute_ms)
    # The ingress turns it into x-inference-time with int(): NaN or inf would be a 500 there.
    assert chunk.compute_ms == 0.0


def test_a_live_lanes_batches_do_not_teach_the_rate_larger_ones_do():
    from mesh.broker.registry import WorkerState
    from tests.unit.broker.fakes import card

    worker = WorkerState(b"w", "w", card(), 16384, 64, 3, 3, "cuda", 0.0, 3.0)
    worker.live_tokens = 1024
    worker.note_compute(1024, 1.0)  # a lane batch, timed beside bulk
    assert worker.rate == 0.0
    worker.note_compute(16384, 4.0)
    assert worker.rate == 16384 / 0.004


def test_a_worker_whose_whole_budget_fits_its_live_lane_still_learns_its_rate():
    # Its live lane runs every batch of at most max_batch_tokens (WorkerReady.live_tokens is
    # min(1024, max_batch_tokens)), so no batch of it ever runs beside bulk: skipping lane
    # batches left its rate unknown for good (no admission in time, no backlog estimate).
    from mesh.broker.registry import WorkerState
    from tests.unit.broker.fakes import card

    worker = WorkerState(b"w", "w", card(), 1024, 64, 3, 3, "cuda", 0.0, 3.0)
    worker.live_credits, worker.live_tokens = 1, 1024
    worker.note_compute(1024, 4.0)
    assert worker.rate == 1024 / 0.004
