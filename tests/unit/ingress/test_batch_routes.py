"""The Files and Batches routes in process, on a fake mesh client: uploads within their limits,
OpenAI's objects and errors, nothing created before the first upload, and a whole batch run by
the app's runner through the same path as /v1/embeddings."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from mesh.client import EmbedResult, ValidRequest
from mesh.ingress.batch_store import STORE_THREADS
from mesh.ingress.config import JobsConfig
from mesh.jobs.sqlite import SqliteJobStore
from proto_msgs import Lane
from tests.unit.ingress.test_ingress_app import FakeClient, serve


def form(
    data: bytes, purpose: str | None = "batch", purpose_first: bool = True
) -> aiohttp.FormData:
    out = aiohttp.FormData()
    if purpose is not None and purpose_first:
        out.add_field("purpose", purpose)
    out.add_field("file", data, filename="in.jsonl", content_type="application/jsonl")
    if purpose is not None and not purpose_first:
        out.add_field("purpose", purpose)
    return out


def jsonl(*inputs: object) -> bytes:
    rows = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": "org/tiny", "input": value}} for i, value in enumerate(inputs)]  # fmt: skip
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


@pytest.fixture
async def jobs_http(tmp_path: Path) -> AsyncIterator[TestClient]:
    jobs = JobsConfig(str(tmp_path / "state"), owner="test:0:0", max_file_bytes=4096,
                      max_state_bytes=10_000)  # fmt: skip
    client = await serve(FakeClient(), jobs=jobs)
    yield client
    await client.close()


async def test_nothing_is_stored_before_the_first_upload(jobs_http: TestClient, tmp_path) -> None:
    for path in ("/v1/files", "/v1/batches"):
        resp = await jobs_http.get(path)
        assert resp.status == 200 and (await resp.json())["data"] == []
    assert (await jobs_http.get("/v1/files/file-x")).status == 404
    assert not (tmp_path / "state").exists()


async def test_a_file_goes_up_lists_reads_back_and_is_deleted(jobs_http: TestClient) -> None:
    data = jsonl("a", "b")
    made = await (await jobs_http.post("/v1/files", data=form(data, purpose_first=False))).json()
    assert made["object"] == "file" and made["bytes"] == len(data) and made["purpose"] == "batch"
    listed = await (await jobs_http.get("/v1/files", params={"purpose": "batch"})).json()
    assert [f["id"] for f in listed["data"]] == [made["id"]] and not listed["has_more"]
    content = await jobs_http.get(f"/v1/files/{made['id']}/content")
    assert content.status == 200 and await content.read() == data
    gone = await (await jobs_http.delete(f"/v1/files/{made['id']}")).json()
    assert gone == {"id": made["id"], "object": "file", "deleted": True}
    missing = await jobs_http.get(f"/v1/files/{made['id']}")
    assert missing.status == 404 and (await missing.json())["error"]["code"] == "not_found"


async def test_uploads_over_a_limit_or_of_another_purpose_are_refused(
    jobs_http: TestClient,
) -> None:
    resp = await jobs_http.post("/v1/files", data=form(b"x" * 5000))
    assert resp.status == 413 and (await resp.json())["error"]["param"] == "file"
    for first in (True, False):
        resp = await jobs_http.post("/v1/files", data=form(b"{}\n", "fine-tune", first))
        assert resp.status == 400 and (await resp.json())["error"]["param"] == "purpose"
    resp = await jobs_http.post("/v1/files", data=form(b"{}\n", None))
    assert resp.status == 400
    assert (await jobs_http.post("/v1/files", json={"file": "x"})).status == 400
    assert (await (await jobs_http.get("/v1/files")).json())["data"] == []
    for _ in range(2):  # 2 x 4000 bytes fit in 10,000; the third does not
        assert (await jobs_http.post("/v1/files", data=form(b"y" * 4000))).status == 200
    full = await jobs_http.post("/v1/files", data=form(b"z" * 4000))
    assert full.status == 507 and (await full.json())["error"]["code"] == "storage_full"


def _multipart(data: bytes, boundary: str, pieces: int = 1, gap_s: float = 0.0):  # noqa: ANN202
    """A multipart upload of ``data`` in ``pieces``, ``gap_s`` apart (purpose first)."""

    async def body() -> AsyncIterator[bytes]:
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
                f"batch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n")  # fmt: skip
        yield head.encode()
        step = -(-len(data) // pieces)
        for i in range(0, len(data), step):
            await asyncio.sleep(gap_s)
            yield data[i : i + step]
        yield f"\r\n--{boundary}--\r\n".encode()

    return body(), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


async def test_uploads_at_once_share_the_state_limit_instead_of_each_taking_the_room(
    jobs_http: TestClient,
) -> None:
    # Three 4,000-byte uploads sent at once, slowly, into 10,000 bytes: each saw the whole room
    # at its start; counted block by block, one of them is refused and the rest fit.
    async def upload(n: int) -> aiohttp.ClientResponse:
        data, headers = _multipart(bytes([97 + n]) * 4000, f"b{n}x", pieces=10, gap_s=0.01)
        return await jobs_http.post("/v1/files", data=data, headers=headers)

    answers = await asyncio.gather(*(upload(n) for n in range(3)))
    statuses = sorted(r.status for r in answers)
    assert statuses == [200, 200, 507], statuses
    listed = await (await jobs_http.get("/v1/files")).json()
    assert sum(f["bytes"] for f in listed["data"]) == 8000
    # What the refused upload had written is free again: a small file still fits.
    assert (await jobs_http.post("/v1/files", data=form(b"w" * 1000))).status == 200


async def test_an_upload_past_the_upload_threads_is_refused_at_once_and_a_gone_one_frees_its_own(
    jobs_http: TestClient,
) -> None:
    from mesh.ingress.batch_store import JOBS

    jobs = jobs_http.server.app[JOBS]
    jobs.room.slots = 1
    data, headers = _multipart(b"a" * 3000, "slow", pieces=10, gap_s=0.1)
    slow = asyncio.create_task(jobs_http.post("/v1/files", data=data, headers=headers))
    while jobs.room.busy == 0:
        await asyncio.sleep(0.01)
    refused = await jobs_http.post("/v1/files", data=form(b"b" * 100))
    assert refused.status == 503 and refused.headers["Retry-After"] == "5"
    assert (await refused.json())["error"]["code"] == "unavailable"
    assert (await slow).status == 200
    # A client that goes away mid-upload: its thread stops waiting, its slot and bytes go back.
    data, headers = _multipart(b"c" * 3000, "gone", pieces=30, gap_s=0.1)
    gone = asyncio.create_task(jobs_http.post("/v1/files", data=data, headers=headers))
    while jobs.room.writing == 0:
        await asyncio.sleep(0.01)
    gone.cancel()
    for _ in range(100):
        if jobs.room.busy == 0 and jobs.room.writing == 0:
            break
        await asyncio.sleep(0.05)
    assert (jobs.room.busy, jobs.room.writing) == (0, 0)
    listed = await (await jobs_http.get("/v1/files")).json()
    assert [f["bytes"] for f in listed["data"]] == [3000]  # the slow one only


async def test_without_a_store_the_routes_answer_503() -> None:
    client = await serve(FakeClient())
    try:
        resp = await client.get("/v1/batches")
        assert resp.status == 503 and (await resp.json())["error"]["code"] == "unavailable"
    finally:
        await client.close()


async def test_a_batch_runs_through_the_embeddings_path_to_its_output_file(
    jobs_http: TestClient,
) -> None:
    made = await (await jobs_http.post("/v1/files", data=form(jsonl("a b", ["c"], "")))).json()
    bad = await jobs_http.post("/v1/batches", json={"input_file_id": made["id"],
                                                     "endpoint": "/v1/chat/completions"})  # fmt: skip
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "endpoint"
    window = await jobs_http.post("/v1/batches", json={"input_file_id": made["id"],
        "endpoint": "/v1/embeddings", "completion_window": "1h"})  # fmt: skip
    assert window.status == 400
    resp = await jobs_http.post(
        "/v1/batches", json={"input_file_id": made["id"], "endpoint": "/v1/embeddings"}
    )
    batch = await resp.json()
    assert resp.status == 200 and batch["status"] == "validating"
    for _ in range(200):
        batch = await (await jobs_http.get(f"/v1/batches/{batch['id']}")).json()
        if batch["status"] == "completed":
            break
        await asyncio.sleep(0.05)
    assert batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert batch["tokens_done"] > 0 and batch["eta_seconds"] is None
    out = await (await jobs_http.get(f"/v1/files/{batch['output_file_id']}/content")).read()
    rows = [json.loads(r) for r in out.splitlines()]
    assert [r["custom_id"] for r in rows] == ["c0", "c1"]
    assert rows[0]["response"]["status_code"] == 200 and rows[0]["error"] is None
    assert rows[0]["response"]["body"]["object"] == "list"
    err = await (await jobs_http.get(f"/v1/files/{batch['error_file_id']}/content")).read()
    row = json.loads(err)
    assert row["custom_id"] == "c2" and row["response"]["status_code"] == 422
    assert row["response"]["body"]["error"]["param"] == "input"
    again = await jobs_http.post(f"/v1/batches/{batch['id']}/cancel")
    assert again.status == 409
    metrics = await (await jobs_http.get("/metrics")).text()
    assert 'embedmesh_batches{status="in_progress"}' in metrics
    assert 'embedmesh_batch_tokens{state="done"}' in metrics


class LaneRecorder(FakeClient):
    """The fake mesh, remembering the lane of every request it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.lanes: list[Lane] = []

    async def submit(self, request: ValidRequest, timeout_s: float | None = None) -> EmbedResult:
        self.lanes.append(request.lane)
        return await super().submit(request, timeout_s)


async def test_batch_lines_go_to_the_batch_lane_where_the_same_request_live_would_not(
    tmp_path: Path,
) -> None:
    # The broker serves the interactive lane first (tests/unit/broker/test_broker_queue.py),
    # so a batch never delays a live query as long as its lines go on the batch lane.
    fake = LaneRecorder()
    client = await serve(fake, jobs=JobsConfig(str(tmp_path / "state"), owner="t:0:0"))
    try:
        live = await client.post("/v1/embeddings", json={"model": "org/tiny", "input": "a b"})
        assert live.status == 200 and fake.lanes == [Lane.INTERACTIVE]
        made = await (await client.post("/v1/files", data=form(jsonl("a b", "a b")))).json()
        body = {"input_file_id": made["id"], "endpoint": "/v1/embeddings"}
        batch = await (await client.post("/v1/batches", json=body)).json()
        for _ in range(200):
            batch = await (await client.get(f"/v1/batches/{batch['id']}")).json()
            if batch["status"] == "completed":
                break
            await asyncio.sleep(0.05)
        assert batch["status"] == "completed"
        assert fake.lanes == [Lane.INTERACTIVE, Lane.BATCH, Lane.BATCH]
    finally:
        await client.close()


async def test_an_upload_streams_past_the_request_body_limit_up_to_the_file_limit(
    tmp_path: Path,
) -> None:
    # --max-body-bytes bounds the JSON bodies held in memory; a file streams to disk instead.
    jobs = JobsConfig(str(tmp_path / "state"), owner="t:0:0", max_file_bytes=1 << 20)
    client = await serve(FakeClient(), jobs=jobs, max_body_bytes=65536)
    try:
        data = b'{"custom_id": "x"}\n' * 20_000  # 380 kB
        made = await client.post("/v1/files", data=form(data))
        assert made.status == 200 and (await made.json())["bytes"] == len(data)
        content = await client.get(f"/v1/files/{(await made.json())['id']}/content")
        assert await content.read() == data
    finally:
        await client.close()


async def test_uploads_that_stall_leave_the_store_to_everything_else(
    jobs_http: TestClient,
) -> None:
    """An upload waits on its client's network: more of them than the store has threads must
    not hold every store call of the process (the runner's lease renewals among them)."""
    assert (await jobs_http.post("/v1/files", data=form(jsonl("a")))).status == 200
    boundary = "stalled-upload"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"in.jsonl\"\r\n\r\n").encode()  # fmt: skip
    tail = f"\r\n--{boundary}--\r\n".encode()
    go = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield head + jsonl("b")
        await go.wait()
        yield tail

    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    uploads = [asyncio.create_task(jobs_http.post("/v1/files", data=stalled(), headers=headers))
               for _ in range(STORE_THREADS + 1)]  # fmt: skip
    await asyncio.sleep(0.3)  # each upload has its part open and waits for the rest
    try:
        listed = await asyncio.wait_for(jobs_http.get("/v1/files"), 5.0)
        assert listed.status == 200
    finally:
        go.set()
        for resp in await asyncio.gather(*uploads):
            resp.release()


async def test_a_store_that_cannot_be_reached_answers_503_to_retry_not_500(
    jobs_http: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (await jobs_http.post("/v1/files", data=form(jsonl("a")))).status == 200

    def locked(*_: object, **__: object) -> None:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(SqliteJobStore, "list_batches", locked)
    resp = await jobs_http.get("/v1/batches")
    assert resp.status == 503
    error = (await resp.json())["error"]
    assert error["code"] == "unavailable" and "retry" in error["message"]
    monkeypatch.setattr(SqliteJobStore, "create_file", locked)
    resp = await jobs_http.post("/v1/files", data=form(jsonl("b")))
    assert resp.status == 503 and (await resp.json())["error"]["code"] == "unavailable"
