"""Cross-encoder routes on the ingress's port: TEI's ``POST /rerank`` and ``POST /predict``, and
the Cohere / Jina / vLLM ``POST /v1/rerank`` (``/v2/rerank`` is the same route: Cohere's v2
path, which their clients call).

- ``/rerank`` (TEI): ``query`` against each of ``texts``; ``raw_scores`` (false: the model's
  activation, sigmoid for a one-label re-ranker), ``return_text``, ``truncate`` (the server's
  ``--auto-truncate`` when absent), ``truncation_direction``; answer ``[{index, score,
  text?}]`` sorted by score, highest first. A model of several labels is a classifier, not a
  re-ranker: 422 (TEI answers 424 "model is not a re-ranker model").
- ``/predict`` (TEI): ``inputs`` a text, a pair ``[a, b]``, or a list of them; ``raw_scores``;
  per input ``[{score, label}]`` sorted by score (softmax over labels for a classifier,
  sigmoid for a re-ranker, unless the model's CrossEncoder config names its own activation).
- ``/v1/rerank``: ``model``, ``query``, ``documents`` (strings, or objects with ``text``),
  ``top_n`` (all when absent), ``return_documents`` (true), ``truncate`` (ours; true: long
  documents are cut at the model's limit, as Cohere and Jina do); answer ``{id, model, usage:
  {total_tokens}, results: [{index, relevance_score, document?: {text}}]}`` sorted by score.

One front door, as every route: the client resolves the model and tokenizes the pairs once
(``MeshClient.prepare_scores``: as the model's tokenizer pairs them, truncated as TEI does),
the broker schedules them like embedding work, and the worker returns raw logits, which the
activation here turns into scores (``mesh.client.scores``). A score request to an embedding
model (or embeddings from a cross-encoder) is a 422 naming what the model does. TEI's routes
answer in TEI's error shape, ``/v1/rerank`` in the OpenAI one; all send TEI's timing headers.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from mesh.client import EmbedResult, ValidRequest
from mesh.client.pairs import ScoreInput
from mesh.client.scores import activate
from mesh.errors import InvalidInput
from mesh.ingress import tei
from mesh.ingress.bodies import Flag, Integer, Schema, Shaped, Text, field
from mesh.ingress.http_errors import TEI, ApiError
from mesh.ingress.schema import (
    PRIORITY,
    PRIORITY_HEADER,
    PRIORITY_TEXT,
    decode_prioritized,
    header_lane,
)
from mesh.ingress.state import STATE, IngressState, account, read_body
from mesh.ingress.tei_schema import parse_predict_request, parse_rerank_request
from proto_msgs import Lane, ModelInfo


def add_routes(app: web.Application) -> None:
    app.router.add_post("/rerank", _tei_rerank, name=f"{TEI}.rerank")
    app.router.add_post("/predict", _tei_predict, name=f"{TEI}.predict")
    app.router.add_post("/v1/rerank", _rerank)
    app.router.add_post("/v2/rerank", _rerank)


@dataclass
class Scored:
    """A scored request: what was sent, what came back, the logits ``[n, labels]``."""

    valid: ValidRequest
    result: EmbedResult
    logits: np.ndarray
    tokenize_s: float

    def scores(self, raw: bool) -> np.ndarray:
        """The model's scores (its activation), or the logits when ``raw``."""
        return self.logits if raw else activate(self.logits, self.valid.model.activation)


async def score(
    state: IngressState, info: ModelInfo, inputs: list[ScoreInput], truncate: bool, left: bool,
    lane: Lane | None,
) -> Scored:  # fmt: skip
    client = state.client
    started = time.perf_counter()
    valid = await client.prepare_scores(inputs, info.name, lane=lane, truncate=truncate, left=left)
    prepared = time.perf_counter()
    result = await client.submit(valid, state.cfg.request_timeout_s)
    logits = account(state, valid, result, prepared - started, time.perf_counter() - prepared)
    return Scored(valid, result, logits, prepared - started)


def check_reranker(info: ModelInfo) -> None:
    """A re-ranker is a cross-encoder of one label; InvalidInput naming what ``info`` is."""
    if info.task == "score" and len(info.labels) != 1:
        raise InvalidInput(
            f"model {info.name!r} is a classifier of {len(info.labels)} labels, not a "
            "re-ranker (one relevance score); classify with /predict",
            param="model",
        )


def ranked(scores: np.ndarray) -> list[int]:
    """Indices by score, highest first; ties keep the input order."""
    return np.argsort(-scores, kind="stable").tolist()


def _response(doc: object, scored: Scored, start: float, chars: int) -> web.Response:
    headers = tei.timing_headers(
        time.perf_counter() - start, scored.tokenize_s, scored.result, chars
    )
    return web.Response(body=orjson.dumps(doc), content_type="application/json", headers=headers)


async def _tei_rerank(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cfg = state.cfg
    start = time.perf_counter()
    req = parse_rerank_request(await read_body(request, cfg.max_body_bytes), cfg.max_inputs)
    lane = header_lane(request.headers.get(PRIORITY_HEADER))
    info = tei.model_for(state, request)
    check_reranker(info)
    truncate = cfg.auto_truncate if req.truncate is None else req.truncate
    pairs: list[ScoreInput] = [(req.query, text) for text in req.texts]
    scored = await score(state, info, pairs, truncate, req.direction == "left", lane)
    scores = scored.scores(req.raw_scores)[:, 0].tolist()
    body = [
        {"index": i, "text": req.texts[i], "score": scores[i]}
        if req.return_text
        else {"index": i, "score": scores[i]}
        for i in ranked(np.asarray(scores))
    ]
    chars = len(req.query) * len(req.texts) + sum(map(len, req.texts))
    return _response(body, scored, start, chars)


async def _tei_predict(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cfg = state.cfg
    start = time.perf_counter()
    req = parse_predict_request(await read_body(request, cfg.max_body_bytes), cfg.max_inputs)
    lane = header_lane(request.headers.get(PRIORITY_HEADER))
    info = tei.model_for(state, request)
    truncate = cfg.auto_truncate if req.truncate is None else req.truncate
    scored = await score(state, info, req.inputs, truncate, req.direction == "left", lane)
    labels = scored.valid.model.labels
    answers = [
        [{"score": row[j], "label": labels[j]} for j in ranked(np.asarray(row))]
        for row in scored.scores(req.raw_scores).tolist()
    ]
    chars = sum(len(x) if isinstance(x, str) else len(x[0]) + len(x[1]) for x in req.inputs)
    return _response(answers if req.batched else answers[0], scored, start, chars)


def _documents(value: Any, name: str, max_inputs: int) -> list[str]:
    shape = "'documents' must be a list of strings or of objects with a 'text' string"
    if not isinstance(value, list):
        raise ApiError.invalid(shape, "documents")
    if not value:
        raise ApiError.invalid("'documents' cannot be empty", "documents")
    if len(value) > max_inputs:
        raise ApiError.too_large(
            f"{len(value)} documents; at most {max_inputs} per request", "documents"
        )
    texts = [v.get("text") if isinstance(v, dict) else v for v in value]
    if not all(isinstance(t, str) for t in texts):
        raise ApiError.invalid(shape, "documents")
    return texts


def _documents_schema(max_inputs: int) -> Schema:
    text = {"type": "string"}
    item = {"oneOf": [text, {"type": "object", "properties": {"text": text},
                             "required": ["text"]}]}  # fmt: skip
    return {"type": "array", "items": item, "minItems": 1, "maxItems": max_inputs}


@dataclass
class V1RerankRequest:
    """The Cohere / Jina / vLLM rerank body (400 not an object, 422 a bad value, 413 too many
    documents)."""

    DESCRIPTION = "The Cohere / Jina / vLLM rerank body, plus priority."

    model: str = field(Text(), required=True)
    query: str = field(Text(), required=True)
    documents: list[str] = field(Shaped(_documents, _documents_schema), required=True)
    top_n: int | None = field(Integer(minimum=1))
    return_documents: bool = field(Flag(), default=True)
    # Cohere and Jina cut long documents rather than refuse the request, and their clients
    # expect it: truncation is on unless the body says "truncate": false (our extension).
    truncate: bool = field(
        Flag(),
        default=True,
        description="Cut over-long documents, as Cohere and Jina do; false: 422 instead.",
    )
    # ``priority`` in the body (ours, as on /v1/embeddings), else the header.
    priority: Lane | None = field(PRIORITY, description=PRIORITY_TEXT)

    @property
    def lane(self) -> Lane | None:
        return self.priority


def parse_v1_rerank_request(
    body: bytes, max_inputs: int, priority_header: str | None = None
) -> V1RerankRequest:
    return decode_prioritized(V1RerankRequest, body, max_inputs, priority_header)


async def _rerank(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cfg = state.cfg
    start = time.perf_counter()
    req = parse_v1_rerank_request(
        await read_body(request, cfg.max_body_bytes), cfg.max_inputs,
        request.headers.get(PRIORITY_HEADER),
    )  # fmt: skip
    info = state.client.resolve(req.model)
    check_reranker(info)
    pairs: list[ScoreInput] = [(req.query, doc) for doc in req.documents]
    scored = await score(state, info, pairs, req.truncate, False, req.lane)
    scores = scored.scores(raw=False)[:, 0].tolist()
    order = ranked(np.asarray(scores))[: req.top_n]
    results = [
        {"index": i, "relevance_score": scores[i], "document": {"text": req.documents[i]}}
        if req.return_documents
        else {"index": i, "relevance_score": scores[i]}
        for i in order
    ]
    doc = {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": info.name,
        "usage": {"total_tokens": scored.result.prompt_tokens},
        "results": results,
    }
    chars = len(req.query) * len(req.documents) + sum(map(len, req.documents))
    return _response(doc, scored, start, chars)
