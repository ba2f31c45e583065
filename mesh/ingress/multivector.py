"""TEI's ``POST /embed_all``: every token's final hidden state, for each input (multi-vector
retrieval, late interaction, token-level features).

Request as TEI's ``EmbedAllRequest``: ``inputs`` (a string, token ids, or a list of either),
``truncate``, ``truncation_direction``, ``prompt_name`` (the prompt's tokens are tokens too);
plus an extension, ``encoding_format``: ``"float"`` (default, TEI's answer: per input a list of
per-token float lists) or ``"base64"`` (per input a list of per-token strings, each the float32
vector little-endian, base64: about a third of the bytes). Every token is returned, special
tokens included, as TEI does; the vectors are raw (full hidden width, not normalized, before
pooling and any Dense layer), so a body asking for ``dimensions`` or for ``normalize`` true is
refused (422; ``/embed_multivector`` likewise refuses ``normalize`` false). One request's answer holds at most
``mesh.client.spans.MAX_TOKEN_VECTOR_VALUES`` numbers (tokens x width); ``GET /info`` states it
as ``max_embed_all_values``, and a request beyond is 413 (TEI's ``Validation``). On the mesh it
is a span request with one span per token (``proto_msgs.messages``), so it is batched,
requeued and isolated like any other. Errors have TEI's shape.

``POST /embed_multivector`` (ours): the same body and answer shape, but the vectors of the
model's multi-vector head, normalized (bge-m3's colbert vectors: ``colbert_linear`` of each
token's state, every token after ``<s>``, ``</s>`` included, as FlagEmbedding returns them;
``GET /info`` states their width as ``multivector_dims``, 0 for a model without the head, which
is refused). A route of its own rather than a flag on ``/embed_all``: a TEI client's
``/embed_all`` must keep meaning raw hidden states whatever model answers it, and a flag would
give one route two answer shapes (another width, another token count). It is bounded like
``/embed_all``: at most ``max_embed_all_values`` numbers (vectors x width) per answer.

Its body also takes ``input_type``: ``"query"`` or ``"document"`` (default). A ColBERT model
(colbert-ai's ``HF_ColBERT``, PyLate; ``ModelInfo.late_interaction``) lays each out its own
way (``mesh.client.late_interaction``): a query is its [Q] marker and [MASK] expansion, a
vector per token, exactly ``query_length`` of them; a document its [D] marker and a vector per
token outside the punctuation skiplist, [CLS] and [SEP] included. Such a model takes texts
only (the server puts the markers in), no prompt, and truncation from the right. For bge-m3,
which encodes queries and documents alike, ``input_type`` is checked and changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson
from aiohttp import web

from mesh.client.late_interaction import INPUT_TYPES, prepare_late_interaction
from mesh.client.request import ValidRequest
from mesh.client.spans import MAX_TOKEN_VECTOR_VALUES, multi_vector, per_token
from mesh.errors import InvalidInput
from mesh.ingress import tei
from mesh.ingress.encodings import render_rows
from mesh.ingress.http_errors import TEI, ApiError
from mesh.ingress.schema import PRIORITY_HEADER, header_lane
from mesh.ingress.state import STATE, IngressState, account, read_body
from mesh.ingress.tei_schema import EmbedRequest, embed_request, json_object
from proto_msgs import Lane, ModelInfo

FORMATS = ("float", "base64")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/embed_all", _embed_all, name=f"{TEI}.embed_all")
    app.router.add_post("/embed_multivector", _embed_multivector, name=f"{TEI}.embed_multivector")


def parse_request(
    body: bytes, max_inputs: int, route: str, normalized: bool, roles: bool
) -> tuple[EmbedRequest, str, str]:
    """The body, parsed once: /embed's fields, ``encoding_format``, and ``input_type``
    (``roles``: only a route with query and document layouts reads it; else "document")."""
    doc = json_object(body)
    req = embed_request(doc, max_inputs)
    encoding_format = _encoding_format(doc)
    _refuse_pooled_options(doc, route, normalized)
    return req, encoding_format, _input_type(doc) if roles else "document"


def _encoding_format(doc: dict[str, object]) -> str:
    value = doc.get("encoding_format", "float")
    if value not in FORMATS:
        raise ApiError.invalid(
            f"'encoding_format' must be one of {', '.join(FORMATS)}; got {value!r}",
            "encoding_format",
        )
    return value


def _refuse_pooled_options(doc: dict[str, object], route: str, normalized: bool) -> None:
    """``dimensions`` and ``normalize`` shape a pooled embedding; these routes return token
    vectors as they are (raw states, or the head's vectors at its own width, ``normalized``),
    so a body asking for something else is refused rather than answered as if it had been
    honoured. A null ``dimensions`` counts as absent, as the shared parser reads it, and so
    does a ``normalize`` that says what the route does anyway."""
    asked = {name: doc.get(name) for name in ("dimensions", "normalize")}
    if asked["normalize"] == normalized:
        asked["normalize"] = None
    for name, value in asked.items():
        if value is not None:
            raise ApiError.invalid(
                f"'{name}' does not apply to {route}, whose vectors are returned as they are "
                f"(see GET /info); leave it out",
                name,
            )


def _input_type(doc: dict[str, object]) -> str:
    value = doc.get("input_type", "document")
    if value not in INPUT_TYPES:
        raise ApiError.invalid(
            f"'input_type' must be one of {', '.join(INPUT_TYPES)}; got {value!r}", "input_type"
        )
    return value


async def _embed_all(request: web.Request) -> web.Response:
    return await _token_vectors(request, per_token, normalized=False)


async def _embed_multivector(request: web.Request) -> web.Response:
    return await _token_vectors(request, multi_vector, roles=True, normalized=True)


async def _late_interaction(
    state: IngressState, info: ModelInfo, req: EmbedRequest, input_type: str, lane: Lane | None
) -> ValidRequest:
    """A ColBERT model's request: its texts laid out as its queries or documents."""
    texts = req.inputs.texts
    if texts is None:
        raise InvalidInput(f"model {info.name!r} is a ColBERT model: send texts, whose "
                           "[Q]/[D] markers the server puts in", param="inputs")  # fmt: skip
    if req.prompt_name is not None or req.direction == "left":
        raise InvalidInput(f"model {info.name!r} is a ColBERT model: prompt_name and "
                           "truncation_direction Left are not served for it",
                           param="prompt_name" if req.prompt_name else "truncation_direction")  # fmt: skip
    truncate = state.cfg.auto_truncate if req.truncate is None else req.truncate
    return await prepare_late_interaction(
        state.client, texts, info, input_type, truncate, lane, MAX_TOKEN_VECTOR_VALUES
    )


async def _token_vectors(
    request: web.Request,
    rows: Callable[[ValidRequest], ValidRequest],
    roles: bool = False,
    normalized: bool = False,
) -> web.Response:
    """Per input, a vector per token: ``rows`` turns the tokenized request into its spans;
    ``roles``: the body may say ``input_type`` (a ColBERT model's queries and documents);
    ``normalized``: whether the route's vectors are unit length."""
    state = request.app[STATE]
    cfg = state.cfg
    start = time.perf_counter()
    body = await read_body(request, cfg.max_body_bytes)
    req, encoding_format, input_type = parse_request(
        body, cfg.max_inputs, request.path, normalized, roles
    )
    lane = header_lane(request.headers.get(PRIORITY_HEADER))
    info = tei.model_for(state, request)
    parsed = time.perf_counter()
    if roles and info.late_interaction is not None:
        valid = await _late_interaction(state, info, req, input_type, lane)
    else:  # input_type changes nothing for bge-m3: its queries and documents encode alike
        valid = await tei._front_door(state, request.app[tei._TOKENIZERS], info, req, lane)
        valid = rows(valid)
    prepared = time.perf_counter()
    result = await state.client.submit(valid, cfg.request_timeout_s)
    meshed = time.perf_counter()
    tokenized = prepared - parsed if req.inputs.texts is not None else None
    rows = account(state, valid, result, tokenized, meshed - prepared)
    assert valid.span_offsets is not None
    parts = []
    for i in range(valid.n):
        tokens = rows[valid.span_offsets[i] : valid.span_offsets[i + 1]]
        parts.append(orjson.dumps(render_rows(tokens, encoding_format),
                                  option=orjson.OPT_SERIALIZE_NUMPY))  # fmt: skip
        await asyncio.sleep(0)  # an input at a time: the loop stays free for queries
    out = b"[" + b",".join(parts) + b"]"
    headers = tei.timing_headers(
        time.perf_counter() - start, prepared - parsed, result, req.inputs.chars
    )
    return web.Response(body=out, content_type="application/json", headers=headers)
