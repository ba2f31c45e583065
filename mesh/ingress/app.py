"""The REST bridge: OpenAI-compatible ``/v1/embeddings`` over the mesh, on aiohttp.

Why aiohttp (on uvloop): it is one dependency that is both the HTTP server and native asyncio,
so the ``MeshClient``'s ZeroMQ reader tasks, its futures and the request handlers share one
event loop with no bridge between frameworks; it has no per-request model-validation layer
(the body is parsed once by orjson and checked by hand in ``mesh.ingress.schema``, the response
written as bytes straight from numpy); and it cancels a handler whose client hung up
(``handler_cancellation=True``), which is what lets a disconnect become a CANCEL to the broker.
FastAPI on uvicorn would add Starlette, pydantic and an ASGI layer for features this small,
fixed surface does not use.

Routes: ``POST /v1/embeddings``, ``GET /v1/models``, ``GET /v1/models/{model}``, ``GET /health``,
``GET /metrics``. With an API key set, ``/v1/*`` needs ``Authorization: Bearer KEY``;
``/health`` and ``/metrics`` stay open. Errors: ``mesh.ingress.http_errors``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import numpy as np
import orjson
from aiohttp import web

from mesh.client import MeshClient
from mesh.errors import MeshError, ProtocolViolation
from mesh.ingress.catalog import Catalog
from mesh.ingress.config import IngressConfig
from mesh.ingress.encodings import ENCODINGS, render_embeddings
from mesh.ingress.http_errors import CLIENT_CLOSED, ApiError, error_response
from mesh.ingress.metrics import CONTENT_TYPE, IngressMetrics
from mesh.ingress.schema import EmbeddingsRequest, check_for_model, parse_embeddings_request
from proto_msgs import OUTPUT_KINDS, Lane, ModelInfo

log = logging.getLogger("embedmesh.ingress")

# Requests of more tokens than this go to the broker's BATCH lane, smaller ones to INTERACTIVE.
# 1024 tokens is a handful of passages or dozens of queries: an eighth of a CPU batch budget
# (8192), so interactive work always fits beside other work in the next batch, while bulk
# indexing requests (thousands of tokens) queue behind it. Aging keeps the batch lane moving.
INTERACTIVE_MAX_TOKENS = 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class IngressState:
    cfg: IngressConfig
    client: MeshClient
    catalog: Catalog
    metrics: IngressMetrics
    owns_client: bool


STATE = web.AppKey("embedmesh_ingress", IngressState)


def create_app(cfg: IngressConfig, client: MeshClient | None = None) -> web.Application:
    """The ingress application. Without ``client`` it builds one from ``cfg`` and starts and
    closes it with the app; a given client is the caller's to start and close."""
    owns = client is None
    if client is None:
        client = MeshClient(
            cfg.brokers,
            liveness=cfg.liveness,
            tokenizer_threads=cfg.tokenizer_threads,
            default_timeout_s=cfg.request_timeout_s,
        )
    state = IngressState(cfg, client, Catalog(client), IngressMetrics(client), owns)
    app = web.Application(
        client_max_size=cfg.max_body_bytes, middlewares=[_observe, _errors, _auth]
    )
    app[STATE] = state
    app.router.add_post("/v1/embeddings", _embeddings)
    app.router.add_get("/v1/models", _list_models)
    app.router.add_get("/v1/models/{model:.+}", _get_model)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.cleanup_ctx.append(_client_lifetime)
    return app


async def _client_lifetime(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    if state.owns_client:
        await state.client.start()
    yield
    if state.owns_client:
        await state.client.close()


# ---- middlewares ------------------------------------------------------------------------------


@web.middleware
async def _observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count every request by route and status and time it (outermost)."""
    metrics = request.app[STATE].metrics
    route = getattr(request.match_info.route.resource, "canonical", "unmatched")
    start = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except asyncio.CancelledError:
        status = CLIENT_CLOSED  # the client hung up; aiohttp cancelled us
        raise
    finally:
        metrics.requests.labels(route, str(status)).inc()
        metrics.latency.labels(route).observe(time.perf_counter() - start)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into an OpenAI-shaped error response."""
    try:
        return await handler(request)
    except ApiError as exc:
        err = exc
    except MeshError as exc:
        err = ApiError.from_mesh(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        err = ApiError.from_http(exc)
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        err = ApiError(500, "internal error; see the server log", "server_error", "internal_error")
    request.app[STATE].metrics.errors.labels(err.code or "unknown").inc()
    if err.status == 502:  # the mesh failed on a request (503/504 are load and outages)
        log.warning("%s %s: %s", request.method, request.path, err)
    return error_response(err)


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    key = request.app[STATE].cfg.api_key
    if key and request.path.startswith("/v1/"):
        given = request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if not given:
            raise ApiError.unauthorized(
                "no API key given; send it as 'Authorization: Bearer YOUR_KEY'"
            )
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), key.encode()
        ):
            raise ApiError.unauthorized("incorrect API key")
    return await handler(request)


# ---- /v1/embeddings ---------------------------------------------------------------------------


async def _embeddings(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cfg, metrics = state.cfg, state.metrics
    req = parse_embeddings_request(await _read_body(request, cfg.max_body_bytes), cfg.max_inputs)
    info = state.catalog.resolve(req.model)
    check_for_model(req, info.dims, info.vocab_size, info.max_input_tokens, cfg.auto_truncate)
    ids, offsets = await _tokens(state, req, info)
    lane = Lane.BATCH if len(ids) > INTERACTIVE_MAX_TOKENS else Lane.INTERACTIVE
    kind = ENCODINGS[req.encoding_format]
    start = time.perf_counter()
    result = await state.client.embed_tokens(
        ids, offsets, info.name, dims=req.dimensions, kind=kind, lane=lane,
        timeout_s=cfg.request_timeout_s,
    )  # fmt: skip
    lane_name = "batch" if lane == Lane.BATCH else "interactive"
    metrics.mesh.labels(info.name, lane_name).observe(time.perf_counter() - start)
    metrics.queue.labels(info.name, lane_name).observe(result.queue_ms / 1000)
    metrics.inference.labels(info.name, lane_name).observe(result.compute_ms / 1000)
    embeddings = result.embeddings
    if embeddings.dtype != np.dtype(OUTPUT_KINDS[kind]) or len(embeddings) != req.n_inputs:
        raise ProtocolViolation(
            f"the mesh answered {embeddings.dtype} {embeddings.shape} for {req.n_inputs} "
            f"inputs of kind {kind}"
        )
    metrics.prompt_tokens.labels(info.name).inc(result.prompt_tokens)
    metrics.inputs.labels(info.name).inc(req.n_inputs)
    body = render_embeddings(embeddings, req.encoding_format, info.name, result.prompt_tokens)
    return web.Response(body=body, content_type="application/json")


async def _read_body(request: web.Request, limit: int) -> bytes:
    too_large = ApiError.too_large(f"the request body is over the limit of {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None


async def _tokens(
    state: IngressState, req: EmbeddingsRequest, info: ModelInfo
) -> tuple[np.ndarray, np.ndarray]:
    """int32 ids and offsets: tokenized texts (off the loop), or the ids given."""
    if req.texts is None:
        assert req.token_ids is not None and req.offsets is not None
        return req.token_ids.astype(np.int32), req.offsets.astype(np.int32)
    start = time.perf_counter()
    try:
        ids, offsets = await state.client.tokenize(
            req.texts, info.name, truncate=state.cfg.auto_truncate
        )
    except MeshError as exc:
        raise ApiError.from_mesh(exc, param="input") from None
    state.metrics.tokenize.observe(time.perf_counter() - start)
    return ids, offsets


# ---- models, health, metrics ------------------------------------------------------------------


def _model_card(state: IngressState, info: ModelInfo) -> dict[str, object]:
    return {
        "id": info.name,
        "object": "model",
        "created": state.catalog.first_seen.get(info.name, 0),
        "owned_by": "embedmesh",
        "aliases": info.aliases,
        "dimensions": info.dims,
        "max_input_tokens": info.max_input_tokens,
        "workers": info.workers,
    }


async def _list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cards = [_model_card(state, m) for m in state.catalog.refresh()]
    return _json({"object": "list", "data": cards})


async def _get_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return _json(_model_card(state, state.catalog.resolve(request.match_info["model"])))


async def _health(request: web.Request) -> web.Response:
    health = request.app[STATE].catalog.health()
    # Several ingress processes may share the port: say which one answered (its own links).
    return _json({**health.body, "pid": os.getpid()}, status=200 if health.ok else 503)


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def _json(doc: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")
