"""What every route family of the ingress shares: the app's state, reading a body within its
limit, JSON responses, and the bookkeeping of one embedding request once the mesh answered.

It sits below ``app`` (the OpenAI routes, middlewares) and ``tei`` (TEI's routes), so that both
use one copy of each and neither imports the other's handlers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson
from aiohttp import web

from mesh.client import EmbedResult, MeshClient, ValidRequest
from mesh.errors import ProtocolViolation
from mesh.ingress.catalog import Catalog
from mesh.ingress.config import IngressConfig
from mesh.ingress.http_errors import ApiError
from mesh.ingress.metrics import IngressMetrics
from mesh.ingress.responses import ResponseBudget
from proto_msgs import OUTPUT_KINDS, Lane


@dataclass
class IngressState:
    cfg: IngressConfig
    client: MeshClient
    catalog: Catalog
    metrics: IngressMetrics
    owns_client: bool
    responses: ResponseBudget  # the bytes of responses being built and sent


STATE = web.AppKey("embedmesh_ingress", IngressState)


class UnreadableBody(ApiError):
    """A body that broke off mid-read: answered, then its connection is closed."""


async def read_body(request: web.Request, limit: int) -> bytes:
    too_large = ApiError.too_large(f"the request body is over the limit of {limit} bytes")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    except web.RequestPayloadError as exc:
        # A Content-Encoding the body does not match (not gzip after all), a broken chunked
        # encoding: the client's mistake, so 400 in our shape, not a 500 with a traceback.
        cause = exc.__cause__ or exc
        reason = str(getattr(cause, "message", cause)).strip()
        encoding = request.headers.get("Content-Encoding")
        how = f" as Content-Encoding {encoding}" if encoding else ""
        message = f"the body could not be decoded{how}: {reason}"
        raise UnreadableBody(400, message, code="malformed_request") from None


def account(
    state: IngressState, valid: ValidRequest, result: EmbedResult, tokenize_s: float | None,
    mesh_s: float,
) -> np.ndarray:  # fmt: skip
    """Check the mesh's answer against the request and count it in the metrics; the rows.
    ``tokenize_s`` None: the request came as token ids."""
    metrics = state.metrics
    if tokenize_s is not None:
        metrics.tokenize.observe(tokenize_s)
    name = valid.model.name
    lane_name = "batch" if valid.lane == Lane.BATCH else "interactive"
    metrics.mesh.labels(name, lane_name).observe(mesh_s)
    metrics.queue.labels(name, lane_name).observe(result.queue_ms / 1000)
    metrics.inference.labels(name, lane_name).observe(result.compute_ms / 1000)
    embeddings = result.embeddings
    kind = valid.output.kind
    # valid.rows: one per input, or one per span (chunks, tokens) of a span request.
    if embeddings.dtype != np.dtype(OUTPUT_KINDS[kind]) or len(embeddings) != valid.rows:
        raise ProtocolViolation(
            f"the mesh answered {embeddings.dtype} {embeddings.shape} for {valid.rows} "
            f"rows of kind {kind}"
        )
    metrics.prompt_tokens.labels(name).inc(result.prompt_tokens)
    metrics.inputs.labels(name).inc(valid.n)
    return embeddings


def json_response(doc: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")
