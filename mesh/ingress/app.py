"""The REST bridge: OpenAI-compatible ``/v1/embeddings`` over the mesh, on aiohttp.

Why aiohttp (on uvloop): it is one dependency that is both the HTTP server and native asyncio,
so the ``MeshClient``'s ZeroMQ reader tasks, its futures and the request handlers share one
event loop with no bridge between frameworks; it has no per-request model-validation layer
(the body is parsed once by orjson and checked against its one declaration,
``mesh.ingress.bodies``; the response written as bytes straight from numpy); and it cancels a handler whose client hung up
(``handler_cancellation=True``), which is what lets a disconnect become a CANCEL to the broker.
FastAPI on uvicorn would add Starlette, pydantic and an ASGI layer for features this small,
fixed surface does not use.

One front door: the handler parses the body (``schema``), then the client resolves the model
and validates (or tokenizes) once into a ``ValidRequest`` that it submits as it is; errors are
typed ``MeshError``s mapped to HTTP in one place (``http_errors``). Live work first here too:
tokenization runs on the client's priority executor, big responses render in slices.

With ``X-Embedmesh-Timings: 1`` a response carries ``x-embedmesh-timings: name=ms,...``: the
ingress's hops (``ingress_parse``: body read and parsed; ``ingress_tokenize``: validated and
tokenized; ``ingress_render``; ``ingress_total``: handler start to response built), the client's
``client_mesh`` and whatever the broker and worker reported for the request.

Every embedding response also carries TEI's timing headers (``x-compute-time``,
``x-tokenization-time``, ``x-queue-time``, ``x-inference-time``, ...; ``mesh.ingress.tei``).

Routes: ``POST /v1/embeddings``, ``GET /v1/models``, ``GET /v1/models/{model}``, ``GET /health``
(readiness, also as ``/health/ready`` and TEI's ``GET /``), ``GET /health/live`` (liveness),
``GET /metrics``, and TEI's (``mesh.ingress.tei``): ``POST /``,
``POST /embed``, ``POST /embed_sparse`` (``mesh.ingress.sparse``), ``POST /tokenize``,
``POST /decode``, ``GET /info``; the cross-encoders'
(``mesh.ingress.rerank``): TEI's ``POST /rerank`` and ``/predict``, ``POST /v1/rerank`` (and
``/v2/rerank``). With an API key set, ``/v1/*``, ``/v2/*`` and TEI's routes need
``Authorization: Bearer KEY`` (``/info`` too, as TEI); ``/health*``, ``GET /`` and ``/metrics``
stay open, as do ``GET /openapi.json`` and ``GET /docs`` (``mesh.ingress.docs_page``).
Errors: ``mesh.ingress.http_errors``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from mesh.client import MeshClient
from mesh.client.request import INTERACTIVE_MAX_TOKENS
from mesh.errors import MeshError
from mesh.ingress import (
    batch_runner,
    batches,
    contextualized,
    docs_page,
    files,
    multivector,
    rerank,
    sparse,
    tei,
)
from mesh.ingress.catalog import Catalog
from mesh.ingress.config import IngressConfig
from mesh.ingress.embeddings import embed
from mesh.ingress.http_errors import (
    CLIENT_CLOSED,
    TEI,
    ApiError,
    answer_unparsable_requests_in_json,
    error_response,
    route_family,
)
from mesh.ingress.metrics import CONTENT_TYPE, IngressMetrics
from mesh.ingress.responses import ResponseBudget
from mesh.ingress.schema import PRIORITY_HEADER, parse_embeddings_request
from mesh.ingress.state import (
    STATE,
    IngressState,
    UnreadableBody,
    json_response,
    read_body,
)
from proto_msgs import ModelInfo

log = logging.getLogger("embedmesh.ingress")

# INTERACTIVE_MAX_TOKENS (the default lane's size rule) lives with the client's validation,
# which picks the lane; it is re-exported here, where docs/api.md's readers look for it.
__all__ = ["INTERACTIVE_MAX_TOKENS", "STATE", "TIMINGS_HEADER", "create_app"]
# Ask with "X-Embedmesh-Timings: 1"; the answer's header has the same name.
TIMINGS_HEADER = "X-Embedmesh-Timings"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LIVENESS_PATH = "/health/live"  # answered while the process drains too (server.py)


def create_app(cfg: IngressConfig, client: MeshClient | None = None) -> web.Application:
    """The ingress application. Without ``client`` it builds one from ``cfg`` and starts and
    closes it with the app; a given client is the caller's to start and close."""
    answer_unparsable_requests_in_json()
    owns = client is None
    if client is None:
        client = MeshClient(
            cfg.brokers,
            liveness=cfg.liveness,
            tokenizer_threads=cfg.tokenizer_threads,
            tokenize_processes=cfg.tokenize_processes,
            default_timeout_s=cfg.request_timeout_s,
            prefetch_tokenizers=True,
        )
    responses = ResponseBudget(cfg.response_budget_bytes, cfg.max_response_bytes)
    state = IngressState(cfg, client, Catalog(client), IngressMetrics(client), owns, responses)
    app = web.Application(
        client_max_size=cfg.max_body_bytes, middlewares=[_observe, _errors, _auth]
    )
    app[STATE] = state
    app.router.add_post("/v1/embeddings", _embeddings)
    app.router.add_get("/v1/models", _list_models)
    app.router.add_get("/v1/models/{model:.+}", _get_model)
    app.router.add_get("/health", _health)
    app.router.add_get("/health/ready", _health)  # Kubernetes' readiness, by its usual name
    app.router.add_get(LIVENESS_PATH, _live)
    app.router.add_get("/", _health)  # TEI's health route too (POST / is TEI's embed)
    app.router.add_get("/metrics", _metrics)
    tei.add_routes(app)
    rerank.add_routes(app)  # TEI's /rerank and /predict, /v1/rerank (and /v2/rerank)
    sparse.add_routes(app)  # TEI's /embed_sparse
    contextualized.add_routes(app)  # Perplexity's /v1/contextualizedembeddings
    multivector.add_routes(app)  # TEI's /embed_all
    docs_page.add_routes(app, cfg)  # /openapi.json and /docs, open as /health
    files.add_routes(app)  # OpenAI's /v1/files (batch input and output files)
    batches.add_routes(app)  # OpenAI's /v1/batches
    app.cleanup_ctx.append(_client_lifetime)
    batch_runner.attach(app, cfg.jobs)  # the store and its runner, after the client's start
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
    response = error_response(err, route_family(request))
    if isinstance(err, UnreadableBody):
        # The rest of the body cannot be read (aiohttp would try to drain it after us, fail
        # and log a traceback): send the answer, then close the connection.
        await response.prepare(request)
        await response.write_eof()
        request.protocol.force_close()
    return response


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    key = request.app[STATE].cfg.api_key
    if key and (request.path.startswith(("/v1/", "/v2/")) or route_family(request) == TEI):
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
    cfg = state.cfg
    start = time.perf_counter()
    body = await read_body(request, cfg.max_body_bytes)
    req = parse_embeddings_request(body, cfg.max_inputs, request.headers.get(PRIORITY_HEADER))
    parsed = time.perf_counter()
    done = await embed(state, req, parsed)
    result = done.result
    # TEI counts characters of texts, or ids given as ids.
    chars = sum(map(len, req.texts)) if req.texts is not None else done.valid.tokens
    headers = tei.timing_headers(done.done_s - start, done.prepared_s - parsed, result, chars)
    if request.headers.get(TIMINGS_HEADER, "").strip().lower() in ("1", "true"):
        hops = {
            "ingress_parse": parsed - start,
            "ingress_tokenize": done.prepared_s - parsed,
            "ingress_render": done.done_s - done.meshed_s,
            "ingress_total": done.done_s - start,
        }
        headers[TIMINGS_HEADER.lower()] = timings_header(hops, result.timings)
    return web.Response(body=done.body, content_type="application/json", headers=headers)


def timings_header(ingress_s: dict[str, float], mesh_ms: dict[str, float]) -> str:
    """``name=ms,...``: the mesh's hops (already in ms), then the ingress's (in seconds)."""
    parts = [f"{name}={ms:.3f}" for name, ms in mesh_ms.items()]
    parts += [f"{name}={s * 1000:.3f}" for name, s in ingress_s.items()]
    return ",".join(parts)


# ---- models, health, metrics ------------------------------------------------------------------


def _model_card(state: IngressState, info: ModelInfo) -> dict[str, object]:
    return {
        "id": info.name,
        "object": "model",
        "created": state.catalog.created(info.name),
        "owned_by": "embedmesh",
        "aliases": info.aliases,
        "dimensions": info.dims,
        "max_input_tokens": info.max_input_tokens,
        "workers": info.workers,
        # /v1/embeddings' prompt_name picks one; the default applies when none is named.
        "prompts": info.prompts,
        "default_prompt_name": info.default_prompt_name,
        # "embed", or "score" for a cross-encoder (/rerank, /predict, /v1/rerank), its labels.
        "task": info.task,
        "labels": info.labels,
    }


async def _list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cards = [_model_card(state, m) for m in state.catalog.refresh()]
    return json_response({"object": "list", "data": cards})


async def _get_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return json_response(_model_card(state, state.client.resolve(request.match_info["model"])))


async def _health(request: web.Request) -> web.Response:
    """Readiness (``mesh.ingress.catalog``): every model seen, or ``?model=NAME``, served now."""
    health = request.app[STATE].catalog.health(request.query.get("model") or None)
    # Several ingress processes may share the port: say which one answered (its own links).
    return json_response({**health.body, "pid": os.getpid()}, status=200 if health.ok else 503)


async def _live(request: web.Request) -> web.Response:
    """Liveness: the process is sound, whatever the mesh behind it does."""
    health = request.app[STATE].catalog.liveness()
    return json_response({**health.body, "pid": os.getpid()}, status=200 if health.ok else 503)


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
