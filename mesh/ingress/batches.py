"""OpenAI's Batches API for ``/v1/embeddings``: ``POST /v1/batches``, ``GET /v1/batches``,
``GET /v1/batches/{batch_id}`` and ``POST /v1/batches/{batch_id}/cancel``.

Creating a batch only records it (``validating``); any ingress process's runner
(``mesh.ingress.batch_runner``) then validates the file and runs it on the batch lane. The
batch object is OpenAI's, plus ``tokens_done``, ``tokens_total`` (estimated from the input's
size at validation, then counted exactly as lines finish), ``tokens_per_second`` and
``eta_seconds`` (null while unknown).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from mesh.ingress.batch_store import invalid, jobs_of, page_args
from mesh.ingress.bodies import Shaped, Text, choice, decode, field
from mesh.ingress.http_errors import ApiError
from mesh.ingress.state import json_response, read_body
from mesh.jobs import Batch, Page

ENDPOINTS = ("/v1/embeddings",)  # the routes a batch's lines may name
MAX_BODY = 64 << 10
METADATA_PAIRS = 16  # OpenAI's limits on metadata: 16 pairs, keys 64 and values 512 characters


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/batches", _create)
    app.router.add_get("/v1/batches", _list)
    app.router.add_get("/v1/batches/{batch_id}", _get)
    app.router.add_post("/v1/batches/{batch_id}/cancel", _cancel)


def _metadata(value: Any, name: str, max_inputs: int) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > METADATA_PAIRS:
        raise ApiError.invalid(
            f"'{name}' must be an object of at most {METADATA_PAIRS} pairs", name
        )
    for key, item in value.items():
        if len(key) > 64 or not isinstance(item, str) or len(item) > 512:
            raise ApiError.invalid(
                f"'{name}' keys must be at most 64 characters and values strings of at most "
                "512", name,
            )  # fmt: skip
    return value


def _metadata_schema(max_inputs: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {},
        "additionalProperties": {"type": "string", "maxLength": 512},
        "maxProperties": METADATA_PAIRS,
    }


@dataclass
class CreateBatchRequest:
    """``POST /v1/batches``' body, declared once."""

    DESCRIPTION = (
        "OpenAI's batch body. endpoint: /v1/embeddings only; completion_window: 24h, as OpenAI."
    )

    input_file_id: str = field(Text(), required=True, description="An uploaded file's id.")
    endpoint: str = field(Text(), required=True, description="The route every line names.")
    completion_window: str = field(choice("24h"), default="24h")
    metadata: dict[str, str] | None = field(Shaped(_metadata, _metadata_schema))


def batch_doc(batch: Batch, now: float | None = None) -> dict[str, Any]:
    """The batch object OpenAI's clients read, with our progress fields."""
    rate, eta = batch.rate_and_eta(time.time() if now is None else now)
    return {**batch.to_openai(), "tokens_per_second": round(rate, 1), "eta_seconds": eta}


async def _create(request: web.Request) -> web.Response:
    jobs = jobs_of(request)
    body = await read_body(request, MAX_BODY)
    try:
        req = decode(CreateBatchRequest, body, 1)
    except ApiError as err:
        if err.status == 422:  # OpenAI answers a wrong value on these routes with 400
            err.status = 400
        raise
    if req.endpoint not in ENDPOINTS:
        raise invalid(
            f"'endpoint' must be one of {', '.join(ENDPOINTS)} on this server; got "
            f"{req.endpoint!r}", "endpoint",
        )  # fmt: skip
    batch = await jobs.call(
        lambda s: s.create_batch(
            input_file_id=req.input_file_id,
            endpoint=req.endpoint,
            completion_window=req.completion_window,
            metadata=req.metadata,
        )
    )
    return json_response(batch_doc(batch))


async def _list(request: web.Request) -> web.Response:
    limit, after = page_args(request)
    jobs = jobs_of(request)
    if not jobs.exists() and after is None:
        return json_response(Page().to_openai())
    page = await jobs.call(lambda s: s.list_batches(limit=limit, after=after))
    doc = page.to_openai()
    now = time.time()
    doc["data"] = [batch_doc(b, now) for b in page.data]
    return json_response(doc)


async def _get(request: web.Request) -> web.Response:
    batch_id = request.match_info["batch_id"]
    return json_response(batch_doc(await jobs_of(request).call(lambda s: s.get_batch(batch_id))))


async def _cancel(request: web.Request) -> web.Response:
    batch_id = request.match_info["batch_id"]
    batch = await jobs_of(request).call(lambda s: s.cancel_batch(batch_id))
    return json_response(batch_doc(batch))
