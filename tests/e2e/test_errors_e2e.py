"""Every error status of the REST bridge, through real HTTP on a real mesh, with its body."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from mesh.client import MeshClient
from tests.e2e.conftest import (
    ALIAS,
    AUTH,
    MAX_QUEUED_TOKENS,
    MAX_TOKENS,
    MODEL,
    TEST_LIVENESS,
    Ingress,
    Mesh,
    Reference,
    big_token_request,
    cosines,
    idle,
    in_process_ingress,
    queued_sequences,
    wait_until,
)

FILLER_TIMEOUT_S = 900.0


async def post(url: str, body: object = None, *, data: bytes | None = None, headers=AUTH):
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.post(f"{url}/v1/embeddings", json=body if data is None else None, data=data) as r,
    ):
        return r.status, await r.json(), r.headers


def assert_error(status: int, doc: dict, want_status: int, code: str, param: str | None = None):
    assert status == want_status, doc
    assert set(doc) == {"error"}
    err = doc["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == code and err["param"] == param
    want_type = "server_error" if want_status >= 500 else "invalid_request_error"
    assert err["type"] == ("rate_limit_error" if want_status == 429 else want_type)
    return err


async def test_malformed_json_is_400(ingress: Ingress) -> None:
    status, doc, _ = await post(ingress.url, data=b'{"model": "x", "input": [')
    assert_error(status, doc, 400, "malformed_request")


async def test_a_missing_or_wrong_key_is_401_but_health_stays_open(ingress: Ingress) -> None:
    body = {"model": MODEL, "input": "x"}
    status, doc, headers = await post(ingress.url, body, headers={})
    assert_error(status, doc, 401, "invalid_api_key")
    assert headers["WWW-Authenticate"] == "Bearer"
    status, doc, _ = await post(ingress.url, body, headers={"Authorization": "Bearer nope"})
    assert_error(status, doc, 401, "invalid_api_key")
    assert ingress.health()[0] == 200


async def test_an_unknown_model_is_404(ingress: Ingress) -> None:
    status, doc, _ = await post(ingress.url, {"model": "text-embedding-3-small", "input": "x"})
    err = assert_error(status, doc, 404, "model_not_found", "model")
    assert "text-embedding-3-small" in err["message"] and MODEL in err["message"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": MODEL, "input": ""}, "input", "empty string"),
        ({"model": MODEL, "input": []}, "input", "empty list"),
        ({"model": MODEL, "input": ["ok", ""]}, "input", "input[1]"),
        ({"model": MODEL, "input": [[101, 102], []]}, "input", "input[1]"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "dimensions", "at least 1"),
        ({"model": MODEL, "input": "x", "dimensions": 385}, "dimensions", "1 and 384"),
        ({"model": MODEL, "input": "x", "encoding_format": "hex"}, "encoding_format", "hex"),
        ({"model": MODEL, "input": [[101, 30522]]}, "input", "vocabulary"),
        ({"input": "x"}, "model", "required"),
    ],
)
async def test_invalid_fields_are_422_naming_them(
    ingress: Ingress, body: dict, param: str, words: str
) -> None:
    status, doc, _ = await post(ingress.url, body)
    assert words in assert_error(status, doc, 422, "invalid_input", param)["message"]


async def test_inputs_over_the_token_limit_are_422_naming_the_limit(
    ingress: Ingress, corpus: list[dict], reference: Reference
) -> None:
    long_text = next(r["text"] for r in corpus if not reference.fits(r["text"]))
    status, doc, _ = await post(ingress.url, {"model": MODEL, "input": ["short", long_text]})
    err = assert_error(status, doc, 422, "invalid_input", "input")
    assert "input[1]" in err["message"] and str(MAX_TOKENS) in err["message"]
    ids = [101] + [2000] * MAX_TOKENS + [102]
    status, doc, _ = await post(ingress.url, {"model": MODEL, "input": ids})
    err = assert_error(status, doc, 422, "invalid_input", "input")
    assert str(MAX_TOKENS) in err["message"]


async def test_more_inputs_than_allowed_is_413(ingress: Ingress) -> None:
    status, doc, _ = await post(ingress.url, {"model": MODEL, "input": ["a"] * 2049})
    assert "2048" in assert_error(status, doc, 413, "request_too_large", "input")["message"]


async def test_a_body_over_the_limit_is_413(strict_ingress: Ingress) -> None:
    status, doc, _ = await post(strict_ingress.url, {"model": MODEL, "input": "word " * 20000})
    assert "65536" in assert_error(status, doc, 413, "request_too_large")["message"]
    status, doc, _ = await post(strict_ingress.url, {"model": MODEL, "input": ["a"] * 9})
    assert_error(status, doc, 413, "request_too_large", "input")


async def test_more_tokens_than_the_broker_may_ever_queue_is_413(ingress: Ingress) -> None:
    n = MAX_QUEUED_TOKENS // MAX_TOKENS + 1
    status, doc, _ = await post(ingress.url, big_token_request(n))
    assert_error(status, doc, 413, "request_too_large")


async def test_auto_truncate_cuts_long_inputs_where_sentence_transformers_does(
    strict_ingress: Ingress, corpus: list[dict], reference: Reference
) -> None:
    long_texts = [r["text"] for r in corpus if not reference.fits(r["text"])][:3]
    status, doc, _ = await post(strict_ingress.url, {"model": ALIAS, "input": long_texts})
    assert status == 200, doc
    got = np.array([d["embedding"] for d in doc["data"]], dtype=np.float32)
    assert cosines(got, reference.embed(long_texts)).min() >= 0.9999
    assert doc["usage"]["prompt_tokens"] == 3 * MAX_TOKENS
    ids = [101] + [2000] * 300 + [102]
    status, doc, _ = await post(strict_ingress.url, {"model": MODEL, "input": [ids]})
    assert status == 200 and doc["usage"]["prompt_tokens"] == MAX_TOKENS


async def test_an_overloaded_broker_is_429_with_retry_after(
    ingress: Ingress, e2e_mesh: Mesh
) -> None:
    async with (
        MeshClient(e2e_mesh.frontend, liveness=TEST_LIVENESS) as stats,
        # The filler's own timeout long enough that admission in time, at however slow this
        # machine's worker is, admits it alone (FILLER_TIMEOUT_S x the lone slack).
        in_process_ingress(e2e_mesh, request_timeout_s=FILLER_TIMEOUT_S) as (patient, _),
    ):
        await stats.wait_ready(10, MODEL)
        # One request that fills most of the queue (294k of 300k tokens; the worker needs
        # a minute for it), then one that cannot fit until ~60k tokens have drained.
        filler = asyncio.create_task(post(patient, big_token_request(1150, seed=1)))
        await wait_until(lambda: queued_sequences(stats) > 1000, 60, "the filler is queued")
        status, doc, headers = await post(ingress.url, big_token_request(250, seed=2))
        assert_error(status, doc, 429, "overloaded")
        assert int(headers["Retry-After"]) >= 1
        filler.cancel()  # hanging up cancels the filler's queued work
        await wait_until(lambda: idle(stats), 30, "the queue drains")
        assert filler.cancelled()


async def test_a_request_past_its_deadline_is_504(tmp_path: Path) -> None:
    """A query admitted in time (a few tokens, nothing ahead of it) whose worker does not
    answer before its short deadline: a hung worker takes the batch and answers none. (A CPU
    worker's bulk is bounded in time and leaves a credit free, so waiting behind bulk no longer
    makes a query late on purpose; a request whose own work is far past its deadline is refused
    up front instead: 429, tests/integration/test_cold_admission.py.)"""
    mesh = Mesh(tmp_path)
    try:
        mesh.start_broker()
        mesh.start_worker(hang_after=0)
        async with in_process_ingress(mesh, request_timeout_s=0.5) as (url, _):
            status, doc, _ = await post(url, {"model": MODEL, "input": "a short query"})
            assert_error(status, doc, 504, "deadline_exceeded")
    finally:
        mesh.stop()
