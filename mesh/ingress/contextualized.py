"""Perplexity's ``POST /v1/contextualizedembeddings``: one vector per chunk of each document,
each chunk embedded inside its whole document (late chunking, ``mesh.client.spans``).

Request, as Perplexity's API takes it: ``input`` (a list of documents, each a non-empty list of
chunk strings, in order), ``model``, ``dimensions`` (Matryoshka, 1..the model's), and
``encoding_format``: ``base64_int8`` (Perplexity's default), ``base64_binary`` (packed bits, LSB
first), and ours too, ``float`` and ``base64`` (float32 little-endian); ``priority`` as on
``/v1/embeddings``. Response::

    {"object": "list",
     "data": [{"object": "list", "index": d,
               "data": [{"object": "embedding", "index": c, "embedding": ...}, ...]}, ...],
     "model": "...", "usage": {"prompt_tokens": N, "total_tokens": N}}

Vectors follow the model's own normalization (its sentence-transformers Normalize module; a
model without one, as Perplexity's, answers unnormalized vectors: compare them by cosine).
Limits, as Perplexity states them: at most 512 documents and 16,000 chunks a request (413), a
document of at most 32,000 tokens and the model's limit, special tokens included (422, never
truncated: a cut would drop chunks), at most 120,000 tokens a request (413); an empty document
or a chunk of no token is 422. Only mean-pooled models without Dense layers are served here
(422 otherwise). Errors have the OpenAI shape, as on ``/v1/embeddings``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from mesh.client.spans import MAX_CHUNKS, MAX_DOCUMENTS, check_document_limits, prepare_documents
from mesh.ingress import tei
from mesh.ingress.bodies import Schema, Shaped, Text, field
from mesh.ingress.encodings import ENCODINGS, render_rows
from mesh.ingress.http_errors import ApiError
from mesh.ingress.schema import (
    DIMENSIONS,
    DIMENSIONS_TEXT,
    ENCODING,
    PRIORITY,
    PRIORITY_HEADER,
    PRIORITY_TEXT,
    decode_prioritized,
)
from mesh.ingress.state import STATE, account, read_body
from proto_msgs import Lane

DEFAULT_ENCODING = "base64_int8"  # Perplexity's default


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/contextualizedembeddings", _contextualized)


def parse_documents(value: Any, name: str = "input", max_inputs: int = 0) -> list[list[str]]:
    """``input``: a list of lists of strings (422 otherwise), within Perplexity's counts."""
    if not isinstance(value, list) or not all(
        isinstance(doc, list) and all(isinstance(chunk, str) for chunk in doc) for doc in value
    ):
        raise ApiError.invalid(
            "'input' must be a list of documents, each a list of chunk strings", "input"
        )
    check_document_limits(value)
    return value


def _documents_schema(max_inputs: int) -> Schema:
    chunks = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
    return {
        "type": "array", "items": chunks, "minItems": 1, "maxItems": MAX_DOCUMENTS,
        "description": f"Documents, each its chunks in order; at most {MAX_CHUNKS} chunks in all.",
    }  # fmt: skip


@dataclass
class ContextualizedRequest:
    DESCRIPTION = "Perplexity's contextualized embeddings body, plus priority."

    model: str = field(Text(), required=True)
    input: list[list[str]] = field(Shaped(parse_documents, _documents_schema), required=True)
    dimensions: int | None = field(DIMENSIONS, description=DIMENSIONS_TEXT)
    encoding_format: str = field(ENCODING, default=DEFAULT_ENCODING)
    priority: Lane | None = field(PRIORITY, description=PRIORITY_TEXT)


def parse_contextualized_request(
    body: bytes, priority_header: str | None = None
) -> ContextualizedRequest:
    return decode_prioritized(ContextualizedRequest, body, MAX_DOCUMENTS, priority_header)


async def _contextualized(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cfg = state.cfg
    start = time.perf_counter()
    body = await read_body(request, cfg.max_body_bytes)
    req = parse_contextualized_request(body, request.headers.get(PRIORITY_HEADER))
    documents = req.input
    parsed = time.perf_counter()
    valid = await prepare_documents(
        state.client, documents, req.model, dims=req.dimensions,
        kind=ENCODINGS[req.encoding_format], lane=req.priority,
    )  # fmt: skip
    state.responses.reserve(valid, req.encoding_format)
    prepared = time.perf_counter()
    result = await state.client.submit(valid, cfg.request_timeout_s)
    meshed = time.perf_counter()
    rows = account(state, valid, result, prepared - parsed, meshed - prepared)
    assert valid.span_offsets is not None
    out = await render_documents(
        rows, valid.span_offsets, req.encoding_format, valid.model.name, result.prompt_tokens
    )
    chars = sum(len(chunk) for doc in documents for chunk in doc)
    headers = tei.timing_headers(time.perf_counter() - start, prepared - parsed, result, chars)
    return web.Response(body=out, content_type="application/json", headers=headers)


async def render_documents(
    rows: np.ndarray, span_offsets: np.ndarray, encoding_format: str, model: str, tokens: int
) -> bytes:
    """The response body: each document's chunk rows (``rows[span_offsets[d]:...]``) as a
    list, rendered a document at a time with the event loop free in between."""
    parts = [b'{"object":"list","data":[']
    for d in range(len(span_offsets) - 1):
        encoded = render_rows(rows[span_offsets[d] : span_offsets[d + 1]], encoding_format)
        chunks = [
            {"object": "embedding", "index": c, "embedding": row} for c, row in enumerate(encoded)
        ]
        doc = {"object": "list", "index": d, "data": chunks}
        parts.append((b"," if d else b"") + orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY))
        await asyncio.sleep(0)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    parts.append(b'],"model":' + orjson.dumps(model) + b',"usage":' + orjson.dumps(usage) + b"}")
    return b"".join(parts)
