"""OpenAI's Files and Batches API through the official ``openai`` client, against a real mesh
(broker, worker and ``mesh-launch --role ingress`` processes) on a state directory of its own:
results equal ``/v1/embeddings``, bad lines land in the error file, a file that is not JSONL
fails validation, cancel ends a batch, and kill -9 of a worker, of the ingress, and of every
process leaves a batch that finishes with every custom_id exactly once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from tests.batch_client import (
    TERMINAL,
    assert_each_once,
    client_of,
    corpus_groups,
    lines_of,
    results,
    start_running,
    upload,
    wait_batch,
)
from tests.e2e.conftest import Ingress
from tests.integration.conftest import MODEL, Mesh
from tests.pg_server import PostgresServer
from tests.unit.jobs.conftest import postgres_server  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def batch_mesh(tmp_path: Path) -> Iterator[tuple[Mesh, Path]]:
    mesh = Mesh(tmp_path)
    mesh.start_broker()
    mesh.start_worker("--threads", "2")
    try:
        yield mesh, tmp_path / "state"
    finally:
        mesh.stop()


@pytest.fixture
def served(batch_mesh: tuple[Mesh, Path]) -> Iterator[Ingress]:
    mesh, state = batch_mesh
    ing = Ingress(mesh, "--state-dir", str(state))
    ing.wait_health()
    yield ing
    ing.stop()


def test_a_batch_through_the_openai_client_equals_the_embeddings_route(
    served: Ingress, corpus: list[dict]
) -> None:
    client = client_of(served.url)
    groups = corpus_groups(corpus, 24, 3)
    good = lines_of(groups)
    bad = [
        {"custom_id": "bad-empty", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": MODEL, "input": ""}},
        {"custom_id": "bad-model", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "no-such-model", "input": "hello"}},
        {"custom_id": "bad-body", "method": "POST", "url": "/v1/embeddings", "body": [1, 2]},
    ]  # fmt: skip
    data = good + b"".join(json.dumps(b).encode() + b"\n" for b in bad)
    file_id = upload(client, data)
    assert client.files.retrieve(file_id).bytes == len(data)
    assert client.files.content(file_id).content == data
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h",
        metadata={"job": "e2e"},
    )  # fmt: skip
    assert batch.status == "validating" and batch.metadata == {"job": "e2e"}
    done = wait_batch(client, batch.id, TERMINAL)
    assert done.status == "completed", done
    assert done.request_counts.total == 27
    assert done.request_counts.completed == 24 and done.request_counts.failed == 3
    assert done.model_extra["tokens_done"] > 0
    out, err = results(client, done.output_file_id), results(client, done.error_file_id)
    assert [r["custom_id"] for r in out] == [f"req-{i}" for i in range(24)]
    assert [r["custom_id"] for r in err] == ["bad-empty", "bad-model", "bad-body"]
    assert [r["response"]["status_code"] for r in err] == [422, 404, 400]
    assert all(r["response"]["body"]["error"]["message"] for r in err)
    live = {}
    for group in groups:
        resp = client.embeddings.create(model=MODEL, input=group, encoding_format="float")
        live[tuple(group)] = np.array([d.embedding for d in resp.data])
    for row, group in zip(out, groups, strict=True):
        assert row["response"]["status_code"] == 200 and row["error"] is None
        got = np.array([d["embedding"] for d in row["response"]["body"]["data"]])
        np.testing.assert_allclose(got, live[tuple(group)], atol=1e-5)
    listed = client.batches.list(limit=5)
    assert batch.id in [b.id for b in listed.data]
    client.files.delete(done.output_file_id)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(done.output_file_id)


def test_a_file_that_is_not_jsonl_or_names_another_route_fails_validation(
    served: Ingress,
) -> None:
    client = client_of(served.url)
    not_jsonl = upload(client, b'this is not json\n{"custom_id": "a"}\n', "x.txt")
    other = upload(client, lines_of([["hi"]]).replace(b"/v1/embeddings", b"/v1/chat/completions"))
    for file_id, code in ((not_jsonl, "invalid_json_line"), (other, "mismatched_endpoint")):
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h"
        )
        done = wait_batch(client, batch.id, TERMINAL, 60)
        assert done.status == "failed", done
        assert done.errors.data[0].code == code and done.errors.data[0].line == 1
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=other, endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")


def test_cancel_reaches_cancelled_within_seconds(served: Ingress, corpus: list[dict]) -> None:
    client = client_of(served.url)
    file_id = upload(client, lines_of(corpus_groups(corpus, 400, 4)))
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h"
    )
    wait_batch(client, batch.id, {"in_progress", *TERMINAL}, 60)
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = wait_batch(client, batch.id, TERMINAL, 30)  # within seconds: the wait's bound
    assert done.status == "cancelled", done
    assert done.request_counts.completed < 400
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_a_batch_survives_kill_9_of_its_worker_and_of_its_ingress(
    batch_mesh: tuple[Mesh, Path], corpus: list[dict]
) -> None:
    mesh, state = batch_mesh
    ing = Ingress(mesh, "--state-dir", str(state))
    ing.wait_health()
    client = client_of(ing.url)
    batch = start_running(client, corpus, 300)
    mesh.workers[0].kill()
    mesh.start_worker("--threads", "2")
    ing.proc.kill()  # kill -9: its leases stay until a process with its owner id frees them
    ing.proc.wait()
    again = Ingress(mesh, "--state-dir", str(state), port=ing.port)
    again.wait_health()
    try:
        assert_each_once(client, wait_batch(client, batch.id, TERMINAL), 300)
    finally:
        again.stop()


def test_the_whole_mesh_killed_and_started_again_finishes_the_batch(
    batch_mesh: tuple[Mesh, Path], corpus: list[dict], tmp_path: Path
) -> None:
    mesh, state = batch_mesh
    ing = Ingress(mesh, "--state-dir", str(state))
    ing.wait_health()
    client = client_of(ing.url)
    batch = start_running(client, corpus, 300)
    for proc in (ing.proc, mesh.broker, *mesh.workers):
        proc.kill()
    for proc in (ing.proc, mesh.broker, *mesh.workers):
        proc.wait()
    fresh = Mesh(tmp_path / "again")
    (tmp_path / "again").mkdir()
    fresh.start_broker()
    fresh.start_worker("--threads", "2")
    # Another port: another owner id, so the dead one's leases resume when they expire.
    again = Ingress(fresh, "--state-dir", str(state))
    try:
        again.wait_health()
        client = client_of(again.url)
        assert_each_once(client, wait_batch(client, batch.id, TERMINAL), 300)
    finally:
        again.stop()
        fresh.stop()


def test_two_ingresses_on_one_postgresql_store_finish_a_batch_after_its_acceptor_dies(
    batch_mesh: tuple[Mesh, Path], corpus: list[dict], request: pytest.FixtureRequest
) -> None:
    mesh, state = batch_mesh
    server: PostgresServer = request.getfixturevalue("postgres_server")  # skips without one
    url = server.create_database()
    shared = ("--state-dir", str(state), "--state-url", url)
    first, second = Ingress(mesh, *shared), Ingress(mesh, *shared)
    try:
        first.wait_health()
        second.wait_health()
        batch = start_running(client_of(first.url), corpus, 300)
        first.proc.kill()  # its leases run out; the other process resumes its chunks
        first.proc.wait()
        client = client_of(second.url)
        assert_each_once(client, wait_batch(client, batch.id, TERMINAL), 300)
    finally:
        first.stop()
        second.stop()
