"""The soak's bookkeeping: outcomes classified, memory read, a restart or an error flagged."""

from __future__ import annotations

import os
from typing import Any

import orjson

from bench.harness.soak import percentiles, summarize
from bench.harness.soak_load import INVALID_BODIES, classify_embedding, classify_invalid
from bench.harness.watch import appeared, rss_kb, vanished


def body(vectors: int, width: int = 3) -> bytes:
    return orjson.dumps(
        {"data": [{"index": i, "embedding": [0.1] * width} for i in range(vectors)]}
    )


def test_a_full_answer_is_ok_and_anything_short_of_it_is_an_error() -> None:
    assert classify_embedding(200, body(4), 4) is None
    assert "3 vectors" in (classify_embedding(200, body(3), 4) or "")
    assert "503" in (classify_embedding(503, b'{"error": {}}', 1) or "")
    assert "malformed" in (classify_embedding(200, b"<html>", 1) or "")
    assert classify_embedding(200, body(2, width=0), 2) is not None


def test_an_invalid_request_must_get_its_status_in_the_error_shape() -> None:
    shape = orjson.dumps({"error": {"message": "no", "type": "x", "param": None, "code": "y"}})
    assert classify_invalid(422, shape, frozenset({422})) is None
    assert "expected [422]" in (classify_invalid(500, shape, frozenset({422})) or "")
    assert "error shape" in (classify_invalid(422, b"422: Unprocessable", frozenset({422})) or "")


def test_every_invalid_body_expects_a_client_error() -> None:
    assert all(s and all(400 <= x < 500 for x in s) for _, s in INVALID_BODIES)


def test_this_process_has_a_resident_size_and_a_gone_one_has_none() -> None:
    assert (rss_kb(os.getpid()) or 0) > 1000
    assert rss_kb(2**22 + 12345) is None


def test_a_replaced_pid_shows_as_died_and_appeared() -> None:
    first = {1: "broker", 2: "worker"}
    later = [{1: "broker", 2: "worker"}, {1: "broker", 3: "worker"}]
    assert vanished(first, later) == {2: "worker"}
    assert appeared(first, later) == {3: "worker"}


def sample(t_s: float, procs: list[tuple[int, str, int]], **counts: int) -> dict[str, Any]:
    base = {"ok": 0, "ok_texts": 0, "expected_4xx": 0, "disconnects": 0,
            "client_timeouts": 0, "probes": 0, "unexpected": 0}  # fmt: skip
    return {
        "t_s": t_s,
        "procs": [{"pid": p, "role": r, "rss_kb": kb} for p, r, kb in procs],
        "counts": {**base, **counts},
    }


MESH = [(10, "supervisor", 100), (11, "broker", 200), (12, "worker", 300)]


def test_a_clean_run_passes_with_memory_from_after_the_warmup() -> None:
    samples = [
        sample(5, MESH, ok=1),
        sample(10, [(10, "supervisor", 100), (11, "broker", 250), (12, "worker", 400)], ok=5),
        sample(20, [(10, "supervisor", 100), (11, "broker", 240), (12, "worker", 500)],
               ok=9, probes=2, expected_4xx=1, disconnects=1, client_timeouts=1),
    ]  # fmt: skip
    summary = summarize(samples, warmup_s=10, errors=[], exit_code=0)
    assert summary["failures"] == []
    worker = summary["memory"]["worker:12"]
    assert (worker["rss_start_kb"], worker["rss_end_kb"], worker["rss_max_kb"]) == (400, 500, 500)
    assert worker["rss_growth_kb"] == 100
    assert summary["requests"] == 12  # probes are among the ok


def test_a_restarted_worker_fails_the_run() -> None:
    restarted = [(10, "supervisor", 100), (11, "broker", 200), (13, "worker", 300)]
    summary = summarize([sample(5, MESH, ok=1), sample(10, restarted, ok=2)], 0, [], 0)
    assert any("worker (pid 12) died" in f for f in summary["failures"])
    assert any("new worker (pid 13)" in f for f in summary["failures"])


def test_an_unexpected_error_or_an_unclean_stop_fails_the_run() -> None:
    samples = [sample(5, MESH, ok=3, unexpected=1)]
    summary = summarize(samples, 0, ["HTTP 500"], exit_code=1)
    assert summary["failures"] == ["1 unexpected errors", "mesh-launch exited with 1"]
    assert summarize([sample(5, MESH)], 0, [], 0)["failures"] == ["no request succeeded"]


def test_helper_processes_coming_and_going_are_not_restarts() -> None:
    samples = [sample(5, [*MESH, (50, "other", 10)], ok=1), sample(10, MESH, ok=2)]
    assert summarize(samples, 0, [], 0)["failures"] == []


def test_latency_percentiles_are_in_milliseconds() -> None:
    assert percentiles([0.1] * 99 + [1.0]) == {
        "n": 100, "p50_ms": 100.0, "p90_ms": 100.0, "p99_ms": 109.0, "max_ms": 1000.0,
    }  # fmt: skip
    assert percentiles([]) == {}
