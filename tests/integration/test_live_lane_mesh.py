"""``mesh-launch --role all --live-lane on`` as a user runs it, on CPU: the worker builds its
live lane from the real engine (a sibling sharing the weights), READY keeps a credit for it,
and queries sent while bulk requests keep the worker busy all come back right, as does every
bulk request. Which thread runs which batch is the unit tests' business (timings decide it);
this checks the real processes, sockets and model together."""

from __future__ import annotations

import http.client
import json
import re
import signal
import threading
from pathlib import Path

import numpy as np

from bench.spawn import free_port
from tests.integration.launched import MODEL, START_S, request, start

LINE = re.compile(r"^embedmesh serving all-MiniLM-L6-v2 at http://127\.0\.0\.1:(\d+)/v1 ")
QUERY = "where does a live query go while bulk indexing runs"
BULK = [f"passage {i} about indexing a search corpus in bulk, line {i}" for i in range(64)]


def _vectors(body: bytes) -> np.ndarray:
    data = sorted(json.loads(body)["data"], key=lambda d: d["index"])
    return np.array([d["embedding"] for d in data])


def test_queries_beside_bulk_on_a_live_lane_come_back_right(tmp_path: Path) -> None:
    run = start(
        tmp_path,
        # A fixed budget: auto's choice depends on the host, and the lane's size on the budget.
        "--live-lane", "on", "--threads", "1", "--max-batch-tokens", "2048",
        "--http-port", str(free_port()),
        "--log-level", "INFO",
    )  # fmt: skip
    try:
        match = LINE.match(run.first_line(START_S))
        assert match, run.stderr.read_text()[-3000:]
        port = int(match.group(1))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        status, body = request(conn, "POST", "/v1/embeddings", {"model": MODEL, "input": QUERY})
        assert status == 200, body[:300]
        alone = _vectors(body)

        bulk_status: list[int] = []
        stop = threading.Event()

        def bulk() -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            while not stop.is_set():
                body = {"model": MODEL, "input": BULK, "priority": "batch"}
                status, got = request(c, "POST", "/v1/embeddings", body)
                bulk_status.append(status if len(json.loads(got).get("data", [])) == 64 else -1)

        threads = [threading.Thread(target=bulk) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            queries = []
            for _ in range(12):
                q = {"model": MODEL, "input": QUERY, "priority": "interactive"}
                status, body = request(conn, "POST", "/v1/embeddings", q)
                assert status == 200, body[:300]
                queries.append(_vectors(body))
        finally:
            stop.set()
            for t in threads:
                t.join(180)
        assert bulk_status and set(bulk_status) == {200}, bulk_status
        for got in queries:
            np.testing.assert_allclose(got, alone, atol=1e-5)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(timeout=60) == 0
        log = run.stderr.read_text()
        assert "live lane up: batches of at most 1024 tokens" in log, log[-3000:]
        # The worker's closing summary counts what its lane ran (a number, however many).
        assert re.search(r"on the link thread \d+ \(\d+ on the live lane\)", log), log[-3000:]
    finally:
        run.kill()
