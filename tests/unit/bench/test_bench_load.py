"""mesh-bench's load generators against a stub /v1/embeddings on loopback."""

from __future__ import annotations

import pytest

from bench.corpus import request_bodies
from bench.load import closed_loop, open_loop, sequential
from tests.unit.bench.conftest import Stub, serve

BODIES = request_bodies([f"text {i}" for i in range(10)], "m", 2)


async def test_closed_loop_sends_exactly_the_count_with_at_most_n_in_flight(stub_target) -> None:
    stub, target = stub_target
    m = await closed_loop(target, BODIES, 4, count=40)
    samples, elapsed = m.samples, m.elapsed_s
    assert len(samples) == 40 == stub.calls
    assert stub.peak == 4
    assert all(s.ok and s.tokens == 6 and s.texts == 2 for s in samples)
    assert elapsed >= 10 * stub.delay_s


async def test_closed_loop_by_duration_counts_what_completed_inside_the_window(stub_target) -> None:
    _, target = stub_target
    opened: list[float] = []
    m = await closed_loop(
        target, BODIES, 2, duration_s=0.3, warmup_s=0.2, on_window=lambda: opened.append(1)
    )
    samples = m.samples
    assert m.elapsed_s == 0.3 and opened == [1]
    assert all(m.start_s <= s.end_s < m.end_s for s in samples)
    assert samples
    first_start = min(s.start_s for s in samples)
    # Warm-up answers are left out; the last answers end before the window closes.
    assert max(s.end_s for s in samples) - first_start < 0.3 + 0.05


async def test_closed_loop_by_count_measures_that_many_after_the_warmup(stub_target) -> None:
    stub, target = stub_target
    m = await closed_loop(target, BODIES, 3, count=12, warmup_s=0.1)
    assert len(m.samples) == 12 and stub.calls > 12
    assert m.elapsed_s > 0 and all(s.start_s >= m.start_s for s in m.samples)


async def test_sequential_never_overlaps_requests(stub_target) -> None:
    stub, target = stub_target
    samples = (await sequential(target, BODIES, 10, warmup=3)).samples
    assert len(samples) == 10 and stub.calls == 13 and stub.peak == 1


async def test_open_loop_sends_on_schedule_regardless_of_answers(stub_target) -> None:
    stub, target = stub_target
    stub.delay_s = 0.2  # answers slower than arrivals: requests must overlap
    samples = (await open_loop(target, BODIES, 100, count=30, seed=1, warmup_s=0.1)).samples
    assert len(samples) == 30 and stub.peak > 5
    assert stub.calls > 30  # the warm-up arrivals went out too, unmeasured
    assert all(s.ok for s in samples)
    starts = sorted(s.start_s for s in samples)
    assert starts[-1] - starts[0] < 1.0  # ~0.3 s of arrivals at 100/s


async def test_error_statuses_and_refused_connections_are_recorded_not_raised() -> None:
    stub = Stub(status=429)
    async for target in serve(stub):
        samples = (await closed_loop(target, BODIES, 2, count=4)).samples
        assert {s.status for s in samples} == {"429"}
        assert all(s.tokens == 0 for s in samples)
    samples = (await closed_loop(target, BODIES, 1, count=1)).samples  # the server is gone now
    assert samples[0].status == "ClientConnectorError"


async def test_open_loop_with_even_arrivals_spaces_requests_by_one_period(stub_target) -> None:
    _, target = stub_target
    samples = (await open_loop(target, BODIES, 50, count=5, even=True)).samples
    starts = sorted(s.start_s for s in samples)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert len(samples) == 5 and gaps == pytest.approx([0.02] * 4)


async def test_open_loop_with_timings_keeps_each_answers_hops_in_its_sample(stub_target) -> None:
    stub, target = stub_target
    asked = (await open_loop(target, BODIES, 100, count=4, even=True, timings=True)).samples
    assert len(asked) == 4
    assert all(
        s.hops == {"ingress_parse": 0.05, "ingress_tokenize": 0.2, "client_mesh": 1.5}
        for s in asked
    )
    stub.timings = "broken,worker_wait=x"  # an answer whose header has nothing usable
    (garbled,) = (await open_loop(target, BODIES, 100, count=1, timings=True)).samples
    assert garbled.ok and garbled.hops is None


async def test_a_load_that_does_not_ask_for_timings_gets_none(stub_target) -> None:
    _, target = stub_target
    # The stub answers the header only to a request that asked for it (as the ingress does).
    samples = (await closed_loop(target, BODIES, 2, count=4)).samples
    assert len(samples) == 4 and all(s.ok and s.hops is None for s in samples)
