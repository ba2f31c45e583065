"""``--mode hops``: the timings header parsed, hops aggregated, the HTTP way against a stub."""

from __future__ import annotations

import asyncio
import math

from bench import hops
from bench.hops import Way, engine_from_spawn, hop_p50s, http_way, parse_timings
from bench.report import hops_lines


def test_parse_timings_reads_name_equals_milliseconds_pairs() -> None:
    header = "ingress_parse=0.05, ingress_tokenize=0.2,client_mesh=1.5"
    assert parse_timings(header) == {
        "ingress_parse": 0.05,
        "ingress_tokenize": 0.2,
        "client_mesh": 1.5,
    }


def test_parse_timings_skips_what_does_not_parse_and_keeps_the_rest() -> None:
    header = "a=1,broken,=2,b=x,c=nan,d=3e-1,"
    assert parse_timings(header) == {"a": 1.0, "d": 0.3}
    assert parse_timings(None) == {} and parse_timings("") == {}


def test_hop_p50s_is_the_median_per_hop_over_the_queries_that_reported_it() -> None:
    timings = [
        {"broker_queue": 1.0, "worker_compute": 5.0},
        {"broker_queue": 3.0, "worker_compute": 7.0, "worker_reply": 0.5},
        {"broker_queue": 2.0, "worker_compute": 6.0},
        {},
    ]
    assert hop_p50s(timings) == {"broker_queue": 2.0, "worker_compute": 6.0, "worker_reply": 0.5}
    assert list(hop_p50s(timings)) == ["broker_queue", "worker_compute", "worker_reply"]


def test_a_way_without_hops_reports_its_latency_and_no_hops() -> None:
    summary = Way([1.0, 2.0, 3.0], [{}, {}, {}]).summary()
    assert summary["p50_ms"] == 2.0 and summary["hops_p50_ms"] == {}
    assert math.isnan(Way(skipped="no broker").summary()["p50_ms"])


def test_engine_from_spawn_reads_the_workers_model_and_device() -> None:
    assert engine_from_spawn("") == (None, "cpu")
    assert engine_from_spawn("--device cuda --model /m --ingress-procs 6") == ("/m", "cuda")
    assert engine_from_spawn("--gpu 1 --model=/x") == ("/x", "cuda:1")


async def test_http_way_asks_for_timings_and_parses_them_per_query(stub_target) -> None:
    stub, target = stub_target
    way = await http_way(target.url, "m", "a query", count=5, warmup=2)
    assert stub.calls == 7 and len(way.latencies_ms) == 5 and way.errors == 0
    assert way.summary()["hops_p50_ms"] == {
        "ingress_parse": 0.05,
        "ingress_tokenize": 0.2,
        "client_mesh": 1.5,
    }


async def test_http_way_counts_errors_apart_from_latencies(stub_target) -> None:
    stub, target = stub_target
    stub.status = 503
    way = await http_way(target.url, "m", "a query", count=3, warmup=0)
    assert way.errors == 3 and way.latencies_ms == []


def test_hops_lines_show_each_way_and_only_the_hops_that_arrived() -> None:
    h = {
        "config": "(defaults)",
        "query": "q",
        "count": 3,
        "ways": {
            "engine": Way([0.3], [{"tokenize": 0.1, "embed": 0.3}]).summary(),
            "client": Way([2.0], [{}]).summary(),
            "http": Way([3.0], [{"ingress_parse": 0.05}]).summary(),
        },
    }
    lines = hops_lines(h)
    assert "engine p50 0.30 ms" in lines[0] and "http p50 3.00 ms" in lines[0]
    assert any("engine per hop" in x and "tokenize 0.100" in x for x in lines)
    assert any("http per hop" in x and "ingress_parse 0.050" in x for x in lines)
    assert not any("client per hop" in x for x in lines)


def test_a_skipped_way_says_why_instead_of_a_latency() -> None:
    ways = {"client": Way(skipped="no broker").summary(), "http": Way([3.0], [{}]).summary()}
    lines = hops_lines({"config": "u", "query": "q", "count": 1, "ways": ways})
    assert "client p50" not in lines[0] and "http p50 3.00 ms" in lines[0]
    assert "client: skipped (no broker)" in "\n".join(lines)


async def test_measure_runs_every_way_and_skips_the_client_without_a_broker(
    stub_target, monkeypatch
) -> None:
    stub, target = stub_target
    monkeypatch.setattr(hops, "engine_way", lambda *a: Way([0.3], [{"embed": 0.3}]))
    setup = hops.Setup("q", count=4, warmup=1, model_name="m", engine_model=None,
                       engine_device="cpu", broker=None)  # fmt: skip
    said: list[str] = []
    h = await asyncio.to_thread(hops.measure, "(defaults)", target, setup, said.append)
    assert list(h["ways"]) == ["engine", "client", "http", "http_floor"]
    assert h["ways"]["client"]["skipped"] and h["ways"]["http"]["count"] == 4
    assert h["ways"]["http"]["hops_p50_ms"]["ingress_tokenize"] == 0.2
    # The floor answered the same client the stub's body, from a server of its own.
    floor = h["ways"]["http_floor"]
    assert floor["count"] == 4 and not floor["skipped"] and floor["hops_p50_ms"] == {}
    assert stub.calls == 5 and any("HTTP stack alone" in line for line in said)


async def test_the_floor_server_answers_the_body_it_was_given_to_any_query() -> None:
    import aiohttp

    from bench.http_floor import FloorServer

    body = b'{"object":"list","data":[]}'
    with FloorServer(body) as floor:
        async with (
            aiohttp.ClientSession() as session,
            session.post(floor.url + "/embeddings", data=b'{"input":"q"}') as resp,
        ):
            assert resp.status == 200 and await resp.read() == body
        way = await http_way(floor.url, "m", "q", count=3, warmup=1)
    assert len(way.latencies_ms) == 3 and way.errors == 0 and way.body == body


def test_without_a_successful_http_answer_the_floor_is_skipped_saying_why() -> None:
    setup = hops.Setup("q", 1, 0, "m", None, "cpu", None)
    way = hops.floor_way(b"", setup, print, "u")
    assert way.skipped and "no successful HTTP response" in way.skipped
