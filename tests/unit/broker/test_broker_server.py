"""The broker loop on fake sockets: dispatch, timings, hostile peers, liveness, the catalog."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from mesh.broker.server import BrokerOptions
from mesh.broker.trust import PeerWarnings
from proto_msgs import (
    BatchAssign,
    BatchError,
    BatchResult,
    CatalogReply,
    CatalogRequest,
    Disconnect,
    ErrorCode,
    Heartbeat,
    RequestError,
    RequestResult,
)
from tests.unit.broker.fakes import INGRESS, Harness, answer, card, ready, slow_answer, submit


def test_a_live_query_waits_behind_one_held_batch_not_two():
    # The live window's cap alone (a CPU worker's bulk is bounded at all times by default).
    h = Harness(aging_s=60.0, cpu_bulk_ms=0.0)
    h.add_worker(msg=ready(credits=2, max_batch_tokens=64))
    h.submit(submit(1, [16] * 16, lane=1))  # 256 bulk tokens: four full batches
    first, second = (m for _, m in h.back.take(BatchAssign))  # not live: both credits
    h.submit(submit(100, [4], lane=0, token=7))  # a query; no credit is free
    assert h.back.take(BatchAssign) == []
    h.back.push(b"w1", answer(first))
    h.pump()
    # The freed credit carries the query alone: the worker already holds a batch of bulk.
    [(_, live)] = h.back.take(BatchAssign)
    assert live.n == 1 and set(live.token_ids.tolist()) == {7}
    h.back.push(b"w1", slow_answer(live))
    h.pump()
    # Live traffic was just seen and the worker still holds a batch of bulk: the credit waits.
    assert h.back.take(BatchAssign) == []
    h.back.push(b"w1", answer(second))
    h.pump()
    [(_, bulk)] = h.back.take(BatchAssign)
    assert bulk.n == 4 and set(bulk.token_ids.tolist()) == {5}
    chunks = [(m.cid, len(m.indices)) for _, m in h.front.take(RequestResult)]
    assert chunks == [(1, 4), (100, 1), (1, 4)]


def test_with_three_credits_live_bulk_comes_in_two_halves_and_one_credit_stays_free():
    h = Harness(aging_s=60.0)
    h.add_worker(msg=ready(credits=3, max_batch_tokens=64))
    h.make_live()  # a query first
    h.submit(submit(1, [16] * 16, lane=1))  # 256 bulk tokens
    # The cap (one batch budget, 64 tokens) in two halves: both go out at once, so the worker
    # has the second to start while the first's reply travels; the third credit stays free.
    halves = [m for _, m in h.back.take(BatchAssign)]
    assert [m.n * 16 for m in halves] == [32, 32]
    h.submit(submit(101, [4], lane=0, token=7))
    [(_, query)] = h.back.take(BatchAssign)  # ... and takes the next query at once
    assert query.n == 1 and set(query.token_ids.tolist()) == {7}
    h.back.push(b"w1", answer(halves[0]))
    h.pump()
    assert h.back.take(BatchAssign) == []  # the query holds a credit: the last stays free
    h.back.push(b"w1", answer(query))
    h.pump()
    [(_, refill)] = h.back.take(BatchAssign)  # then the half that came back is refilled
    assert refill.n * 16 == 32


def test_while_live_the_last_free_credit_takes_no_bulk_smaller_than_the_cap():
    h = Harness(aging_s=60.0)
    h.add_worker(msg=ready(credits=2, max_batch_tokens=64))
    h.make_live()
    h.submit(submit(1, [16], lane=1))  # 16 bulk tokens: far below the 64-token cap
    h.submit(submit(2, [16], lane=1))
    [(_, bulk)] = h.back.take(BatchAssign)
    assert bulk.n == 1  # the second bulk request waits: the last credit is the queries'
    h.submit(submit(101, [4], lane=0, token=7))
    [(_, query)] = h.back.take(BatchAssign)
    assert query.n == 1 and set(query.token_ids.tolist()) == {7}


def test_queries_overlapping_at_every_reply_do_not_keep_bulk_out():
    # Two credits, a query always in flight: the free credit is always the last one. It keeps
    # no more bulk once the worker holds some, but bulk that holds none must still get it
    # (this starved bulk for good: a request under load waited 120 s for its deadline).
    h = Harness(aging_s=60.0)
    h.add_worker(msg=ready(credits=2, max_batch_tokens=64))
    h.submit(submit(1000, [4], lane=0, token=7))
    [(_, query)] = h.back.take(BatchAssign)
    h.submit(submit(1, [16] * 16, lane=1))  # 256 bulk tokens
    bulk_sent = 0
    for step in range(40):
        sent = [m for _, m in h.back.take(BatchAssign)]
        bulk = [m for m in sent if 7 not in m.token_ids.tolist()]
        bulk_sent += sum(m.n * 16 for m in bulk)
        h.submit(submit(1001 + step, [4], lane=0, token=7))  # the next query, then the reply
        h.back.push(b"w1", answer(query))
        for m in bulk:
            h.back.push(b"w1", answer(m))
        h.pump()
        query = next(m for _, m in h.back.sent if 7 in m.token_ids.tolist())
    assert bulk_sent == 256


def test_while_live_a_slow_worker_holds_only_live_bulk_ms_of_bulk():
    # A CPU-like worker: 1024-token batches that take a second each, so one held batch would
    # keep a query waiting a second; at 100 ms of its compute it may hold ~102 bulk tokens.
    # The live window's cap alone (a CPU worker's bulk is bounded at all times by default).
    h = Harness(aging_s=60.0, live_bulk_ms=100.0, cpu_bulk_ms=0.0)
    h.add_worker(msg=ready(credits=2, max_batch_tokens=1024, max_batch_requests=512))
    h.submit(submit(1, [16] * 512, lane=1))  # 8192 bulk tokens
    first, second = (m for _, m in h.back.take(BatchAssign))
    assert first.n * 16 == second.n * 16 == 1024  # no live traffic yet: full batches
    slow = answer(first)
    slow.compute_ms = 1000.0  # 1024 tokens a second
    h.back.push(b"w1", slow)
    h.pump()
    [(_, third)] = h.back.take(BatchAssign)  # still not live: a full batch
    assert third.n * 16 == 1024
    h.submit(submit(100, [4], lane=0, token=7))  # a query: both credits are held
    slow = answer(second)
    slow.compute_ms = 1000.0
    h.back.push(b"w1", slow)
    h.pump()
    [(_, live)] = h.back.take(BatchAssign)  # the query alone: a full batch is still held
    assert live.n == 1 and set(live.token_ids.tolist()) == {7}
    h.back.push(b"w1", slow_answer(live))
    slow = answer(third)
    slow.compute_ms = 1000.0
    h.back.push(b"w1", slow)
    h.pump()
    held = [m.n * 16 for _, m in h.back.take(BatchAssign)]
    # ~100 ms of this worker's compute (102 tokens), over by one sequence at most so that a
    # head longer than what is left still goes.
    assert held and sum(held) <= 1024 * 100 // 1000 + 16


def test_small_batches_do_not_teach_the_broker_a_workers_rate():
    h = Harness()
    h.add_worker(msg=ready(max_batch_tokens=8192, max_batch_requests=512))
    h.submit(submit(1, [16]))
    [(_, query)] = h.back.take(BatchAssign)
    h.back.push(b"w1", answer(query))  # 16 tokens in 1 ms: fixed cost, not a rate
    h.pump()
    [worker] = h.broker.registry.workers.values()
    assert worker.rate == 0.0 and worker.bulk_cap(1.0, 100.0) == 8192
    h.submit(submit(2, [16] * 128))  # 2048 tokens in 1 ms
    [(_, big)] = h.back.take(BatchAssign)
    h.back.push(b"w1", answer(big))
    h.pump()
    assert worker.rate == 2048 / 0.001 and worker.bulk_cap(1.0, 100.0) == 8192
    assert worker.bulk_cap(1.0, 1.0) == 2048  # 1 ms of a 2 M tok/s worker


def _chunk_with(timings: dict[str, float]) -> RequestResult:
    """The result chunk of a one-sequence request whose worker said ``timings``."""
    h = Harness()
    h.add_worker()
    return h.answered_chunk(timings=timings)


def test_each_result_chunk_carries_the_workers_timings_and_the_brokers_hops():
    chunk = _chunk_with({"worker_compute": 2.5, "worker_reply": 0.25})
    hops = {"broker_queue", "broker_worker", "broker_out"}
    assert set(chunk.timings) == {"worker_compute", "worker_reply"} | hops
    assert chunk.timings["worker_compute"] == 2.5
    assert all(chunk.timings[name] >= 0.0 for name in hops)
    assert chunk.compute_ms == 1.0


def test_a_worker_that_names_too_many_timings_gets_none_forwarded():
    chunk = _chunk_with({f"t{i}": 1.0 for i in range(1000)})
    assert set(chunk.timings) == {"broker_queue", "broker_worker", "broker_out"}


def test_a_worker_timing_with_a_name_or_value_unfit_for_a_header_is_not_forwarded():
    # The ingress writes the names into the x-embedmesh-timings header: a CR/LF there made
    # aiohttp drop the connection of every request that asked for timings.
    chunk = _chunk_with(
        {
            "worker_compute": 2.5,
            "x\r\nSet-Cookie: a": 1.0,
            "a,b=c": 1.0,
            "worker_wait": float("nan"),
        }
    )
    assert set(chunk.timings) == {"worker_compute", "broker_queue", "broker_worker", "broker_out"}


def test_a_batch_error_with_an_unknown_code_is_dropped_and_the_broker_serves_on():
    h = Harness()
    h.add_worker()
    h.submit(submit(1, [3]))
    [(_, batch)] = h.back.take(BatchAssign)
    h.back.push(b"w1", BatchError(batch.batch_id, 999, "no such code", False))
    h.back.push(b"w1", BatchResult(batch.batch_id + 1000, 1.0, []))  # an unknown batch id
    h.back.push(b"w1", BatchResult(batch.batch_id, 1.0, [np.ones((5, 8), np.float32)]))
    h.pump()
    assert h.broker.dropped == 2  # the code 999 and the wrong shapes
    assert h.front.take(RequestResult) == []
    [(_, again)] = h.back.take(BatchAssign)  # the misshapen result put the work back
    h.back.push(b"w1", answer(again))
    h.pump()
    assert [m.cid for _, m in h.front.take(RequestResult)] == [1]


def test_a_message_whose_handler_raises_costs_only_itself(monkeypatch, caplog):
    h = Harness()
    h.add_worker()

    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(h.broker, "_submit", broken)
    with caplog.at_level(logging.ERROR, logger="embedmesh.broker"):
        h.submit(submit(1, [3]))
        h.submit(submit(2, [3]))
    assert (h.broker.handler_errors, h.broker.dropped) == (2, 2)
    assert len([r for r in caplog.records if "after it failed" in r.message]) == 1
    monkeypatch.undo()
    h.submit(submit(3, [3]))
    [(_, batch)] = h.back.take(BatchAssign)
    assert batch.n == 1


def test_the_peers_remembered_as_warned_are_bounded():
    h = Harness()
    h.broker.warned = PeerWarnings(limit=8)
    for i in range(20):
        h.front.push(b"peer%d" % i, [b"garbage"])
    h.pump()
    assert h.broker.dropped == 20 and len(h.broker.warned) == 8
    assert b"peer19" in h.broker.warned and b"peer0" not in h.broker.warned


def beat(h: Harness, identity: bytes, progress: int, at: float) -> None:
    h.now = at
    h.back.push(identity, Heartbeat(progress=progress, busy=True))
    h.pump()
    h.broker._tick(at)


def test_a_worker_whose_progress_stands_still_while_it_holds_work_is_buried_as_hung():
    h = Harness(hang_s=5.0)
    h.add_worker(b"w1")
    h.submit(submit(1, [3]))
    h.add_worker(b"w2")  # idle: no progress either, but it holds nothing
    [(held_by, _)] = h.back.take(BatchAssign)
    assert held_by == b"w1"
    for second in range(1, 6):
        for worker in (b"w1", b"w2"):
            beat(h, worker, 0, float(second))
    assert set(h.broker.registry.workers) == {b"w1", b"w2"}
    beat(h, b"w1", 0, 5.5)
    assert set(h.broker.registry.workers) == {b"w2"}
    sent = h.back.take()
    assert [i for i, m in sent if isinstance(m, Disconnect)] == [b"w1"]
    # The hung worker's batch went to the other worker.
    assert [i for i, m in sent if isinstance(m, BatchAssign)] == [b"w2"]


def test_a_slow_worker_whose_progress_moves_is_not_hung():
    h = Harness(hang_s=5.0)
    h.add_worker(b"w1", ready(credits=2, max_batch_tokens=3))
    h.submit(submit(1, [3] * 10))
    for second in range(1, 20):
        beat(h, b"w1", second // 4, float(second))  # a batch finishes every 4 seconds
    assert set(h.broker.registry.workers) == {b"w1"}


def test_a_workers_silence_expiry_follows_the_heartbeat_it_announced():
    h = Harness()  # liveness 3
    h.add_worker(b"fast", ready(heartbeat_ms=100))
    h.add_worker(b"slow", ready(heartbeat_ms=2000))
    h.broker._tick(1.0)
    assert set(h.broker.registry.workers) == {b"slow"}
    h.broker._tick(5.9)
    assert set(h.broker.registry.workers) == {b"slow"}
    h.broker._tick(6.1)
    assert not h.broker.registry.workers


def catalog(h: Harness) -> dict[str, object]:
    h.front.push(INGRESS, CatalogRequest(cid=99))
    h.pump()
    [(_, reply)] = h.front.take(CatalogReply)
    return {m.name: m for m in reply.models}


def test_a_ready_conflicting_with_the_served_card_is_refused_and_the_first_card_stays():
    h = Harness()
    h.add_worker(b"w1")
    h.back.take()
    h.add_worker(b"w2", ready(card(dims=16, vocab_size=50, aliases=["other"])))
    [(to, bye)] = h.back.take()
    assert to == b"w2" and isinstance(bye, Disconnect)
    assert "dims" in bye.reason and "vocab_size" in bye.reason and "pooling" not in bye.reason
    assert set(h.broker.registry.workers) == {b"w1"} and h.broker.refused_workers == 1
    served = catalog(h)["m"]
    assert (served.dims, served.vocab_size, served.workers) == (8, 100, 1)
    # Same card, other aliases: a second worker of the model, under the first card's aliases.
    h.add_worker(b"w3", ready(card(aliases=["other"])))
    assert catalog(h)["m"].workers == 2 and catalog(h)["m"].aliases == []


def test_a_ready_whose_digest_is_not_its_tokenizers_is_refused():
    h = Harness()
    h.add_worker(b"w1", ready(tokenizer_json=b'{"not": "the digested one"}'))
    [(_, bye)] = h.back.take()
    assert isinstance(bye, Disconnect) and "tokenizer_digest" in bye.reason
    assert not h.broker.registry.workers and not h.broker.registry.tokenizers


def test_a_model_whose_last_worker_left_is_forgotten_after_forget_model_s():
    h = Harness(forget_model_s=60.0)
    h.add_worker(b"w1")
    h.back.push(b"w1", Disconnect(reason="worker shutting down"))
    h.pump()
    h.broker._tick(59.0)
    h.submit(submit(1, [3]))
    h.broker._tick(60.0)
    h.submit(submit(2, [3]))
    codes = [(m.cid, m.code) for _, m in h.front.take(RequestError)]
    assert codes == [(1, ErrorCode.UNAVAILABLE), (2, ErrorCode.MODEL_NOT_FOUND)]
    assert not h.broker.registry.tokenizers and "m" not in h.broker.stats().workers


def test_a_model_whose_workers_all_left_may_come_back_with_a_new_card():
    h = Harness(aging_s=60.0)
    h.add_worker(b"w1", ready(credits=1))
    h.submit(submit(1, [3]))
    h.submit(submit(2, [3]))  # queued behind the first, checked against the old card
    h.back.push(b"w1", Disconnect(reason="worker shutting down"))
    h.pump()
    h.add_worker(b"w2", ready(card(dims=4)))
    # The old card's queued work is failed rather than sent to a model it was not checked for.
    codes = sorted((m.cid, m.code) for _, m in h.front.take(RequestError))
    assert codes == [(1, ErrorCode.UNAVAILABLE), (2, ErrorCode.UNAVAILABLE)]
    assert catalog(h)["m"].dims == 4


def test_a_workers_own_disconnect_is_logged_at_info(caplog):
    h = Harness()
    h.add_worker(b"w1")
    with caplog.at_level(logging.INFO, logger="embedmesh.broker"):
        h.back.push(b"w1", Disconnect(reason="worker shutting down"))
        h.pump()
    [record] = [r for r in caplog.records if "removed" in r.message]
    assert record.levelno == logging.INFO


def test_a_second_ready_claiming_a_known_digest_must_send_the_same_tokenizer():
    h = Harness()
    h.add_worker(b"w1")
    h.back.take()
    h.add_worker(b"w2", ready(tokenizer_json=b'{"other": 1}'))
    [(to, bye)] = h.back.take()
    assert to == b"w2" and isinstance(bye, Disconnect) and "tokenizer_digest" in bye.reason
    assert h.broker.registry.tokenizers[card().tokenizer_digest] == b"{}"


def test_options_that_would_starve_bulk_work_are_refused():
    with pytest.raises(ValueError):
        BrokerOptions(live_bulk_batches=0)


def test_a_peer_repeating_a_refused_ready_is_warned_about_once(caplog):
    import logging

    h = Harness()
    h.add_worker(b"w1")
    conflicting = ready(card(dims=4), name="bad")
    with caplog.at_level(logging.DEBUG, logger="embedmesh.broker"):
        for _ in range(50):
            h.add_worker(b"bad", conflicting)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert h.broker.refused_workers == 50
    assert len(warnings) == 1 and "refusing worker bad" in warnings[0].getMessage()


def test_the_catalog_reports_the_largest_batch_budget_among_live_workers():
    h = Harness()
    h.add_worker(b"w1", ready(max_batch_tokens=64, max_batch_requests=16))
    h.add_worker(b"w2", ready(max_batch_tokens=512, max_batch_requests=4))
    served = catalog(h)["m"]
    assert (served.max_batch_tokens, served.max_batch_requests, served.workers) == (512, 16, 2)
    h.back.push(b"w2", Disconnect(reason="bye"))
    h.pump()
    served = catalog(h)["m"]
    assert (served.max_batch_tokens, served.max_batch_requests, served.workers) == (64, 16, 1)


def test_a_worker_with_a_live_lane_keeps_a_credit_for_queries_and_bulk_is_not_capped():
    h = Harness(aging_s=60.0)
    h.add_worker(msg=ready(credits=3, max_batch_tokens=64, live_credits=1, live_tokens=16))
    h.make_live()  # a query first
    h.submit(submit(1, [16] * 16, lane=1))  # 256 bulk tokens
    # Live, yet bulk takes two whole batches (no cap), and the third credit stays free.
    bulk = [m for _, m in h.back.take(BatchAssign)]
    assert [m.n * 16 for m in bulk] == [64, 64]
    h.submit(submit(101, [4, 4, 4, 4, 4], lane=0, token=7))  # 20 tokens: over the lane's 16
    # The free credit takes queries alone, cut at the lane's size.
    [(_, query)] = h.back.take(BatchAssign)
    assert query.n == 4 and set(query.token_ids.tolist()) == {7}
    h.back.push(b"w1", answer(bulk[0]))
    h.pump()
    # A credit came back: queries first, so it carries the query's rest; bulk, now holding
    # one batch and the lane's credit in use, waits.
    [(_, rest)] = h.back.take(BatchAssign)
    assert rest.n == 1 and set(rest.token_ids.tolist()) == {7}
    h.back.push(b"w1", answer(query))
    h.pump()
    assert h.back.take(BatchAssign) == []  # one credit free: the lane's
    h.back.push(b"w1", answer(rest))
    h.pump()
    [(_, more)] = h.back.take(BatchAssign)  # two credits free, one beyond the lane's: bulk
    assert more.n * 16 == 64 and set(more.token_ids.tolist()) == {5}
    assert h.back.take(BatchAssign) == []
