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
from dataclasses import dataclass

import orjson
from aiohttp import web

from mesh.client.late_interaction import INPUT_TYPES, prepare_late_interaction
from mesh.client.request import ValidRequest
from mesh.client.spans import MAX_TOKEN_VECTOR_VALUES, multi_vector, per_token
from mesh.errors import InvalidInput
from mesh.ingress import tei
from mesh.ingress.bodies import Fixed, choice, decode, field
from mesh.ingress.encodings import render_rows
from mesh.ingress.http_errors import TEI
from mesh.ingress.schema import PRIORITY_HEADER, header_lane
from mesh.ingress.state import STATE, IngressState, account, read_body
from mesh.ingress.tei_schema import TeiInputsBody
from proto_msgs import Lane, ModelInfo

FORMATS = ("float", "base64")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/embed_all", _embed_all, name=f"{TEI}.embed_all")
    app.router.add_post("/embed_multivector", _embed_multivector, name=f"{TEI}.embed_multivector")


@dataclass
class EmbedAllRequest(TeiInputsBody):
    DESCRIPTION = (
        "TEI's EmbedAllRequest, plus encoding_format. Raw token states: normalize true and "
        "dimensions are refused (422)."
    )

    encoding_format: str = field(choice(*FORMATS), default="float")
    normalize: bool = field(Fixed(False, "/embed_all"), default=False)
    dimensions: None = field(Fixed(None, "/embed_all"))

    input_type = "document"  # the same layout for every model


@dataclass
class MultivectorRequest(TeiInputsBody):
    DESCRIPTION = (
        "/embed_all's body for the multi-vector head's vectors, plus input_type. The vectors are "
        "normalized at the head's width: normalize false and dimensions are refused (422)."
    )

    encoding_format: str = field(choice(*FORMATS), default="float")
    # A ColBERT model lays out queries and documents its own way ([Q]/[D] marker, [MASK]
    # expansion, punctuation skiplist); bge-m3's are alike.
    input_type: str = field(choice(*INPUT_TYPES), default="document")
    normalize: bool = field(Fixed(True, "/embed_multivector"), default=True)
    dimensions: None = field(Fixed(None, "/embed_multivector"))


def parse_request(
    body: bytes, max_inputs: int, roles: bool
) -> EmbedAllRequest | MultivectorRequest:
    """/embed_all's body or, with ``roles`` (query and document layouts, normalized vectors),
    /embed_multivector's."""
    return decode(MultivectorRequest if roles else EmbedAllRequest, body, max_inputs)


async def _embed_all(request: web.Request) -> web.Response:
    return await _token_vectors(request, per_token)


async def _embed_multivector(request: web.Request) -> web.Response:
    return await _token_vectors(request, multi_vector, roles=True)


async def _late_interaction(
    state: IngressState, info: ModelInfo, req: TeiInputsBody, input_type: str, lane: Lane | None
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
) -> web.Response:
    """Per input, a vector per token: ``rows`` turns the tokenized request into its spans;
    ``roles``: /embed_multivector's body, which may say ``input_type`` (a ColBERT model's
    queries and documents)."""
    state = request.app[STATE]
    cfg = state.cfg
    start = time.perf_counter()
    body = await read_body(request, cfg.max_body_bytes)
    req = parse_request(body, cfg.max_inputs, roles)
    encoding_format, input_type = req.encoding_format, req.input_type
    lane = header_lane(request.headers.get(PRIORITY_HEADER))
    info = tei.model_for(state, request)
    parsed = time.perf_counter()
    if roles and info.late_interaction is not None:
        valid = await _late_interaction(state, info, req, input_type, lane)
    else:  # input_type changes nothing for bge-m3: its queries and documents encode alike
        valid = await tei._front_door(state, request.app[tei._TOKENIZERS], info, req, lane)
        valid = rows(valid)
    state.responses.reserve(valid, encoding_format)
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
