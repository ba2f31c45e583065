"""Driving OpenAI's Batches API through the official ``openai`` client, for the tests of
``/v1/files`` and ``/v1/batches`` against real processes (tests/e2e, tests/integration)."""

from __future__ import annotations

import json
import time

import openai

from tests.integration.conftest import MODEL

TERMINAL = {"completed", "failed", "cancelled", "expired"}


def client_of(url: str, retries: int = 0) -> openai.OpenAI:
    """The client of the server at ``url`` (no /v1)."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=retries)


def lines_of(texts: list[list[str]], **body: object) -> bytes:
    rows = [
        {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": MODEL, "input": group, **body}}
        for i, group in enumerate(texts)
    ]  # fmt: skip
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def upload(client: openai.OpenAI, data: bytes, name: str = "in.jsonl") -> str:
    return client.files.create(file=(name, data), purpose="batch").id


def wait_batch(client: openai.OpenAI, batch_id: str, until: set[str], timeout_s: float = 180):  # noqa: ANN201
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until or time.monotonic() > deadline:
            return batch
        time.sleep(0.2)


def results(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def corpus_groups(corpus: list[dict], n: int, per: int, max_chars: int = 600) -> list[list[str]]:
    texts = [r["text"] for r in corpus if len(r["text"]) < max_chars]
    return [texts[i * per : (i + 1) * per] for i in range(n)]


def assert_each_once(client: openai.OpenAI, batch, n: int) -> None:  # noqa: ANN001
    assert batch.status == "completed", batch
    out = results(client, batch.output_file_id)
    assert [r["custom_id"] for r in out] == [f"req-{i}" for i in range(n)]
    assert batch.request_counts.completed == n and batch.request_counts.failed == 0


def start_running(client: openai.OpenAI, corpus: list[dict], n: int):  # noqa: ANN202
    # Short single texts: a chunk (100 lines) commits soon even on a busy 2-core machine.
    file_id = upload(client, lines_of(corpus_groups(corpus, n, 1, 200)))
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h"
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # mid-way: a chunk committed, more to do
        now = client.batches.retrieve(batch.id)
        if now.request_counts.completed > 0 or now.status in TERMINAL:
            break
        time.sleep(0.1)
    assert now.status == "in_progress" and 0 < now.request_counts.completed < n, now
    return batch
