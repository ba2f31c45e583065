"""One ``/v1/embeddings`` request through the mesh, from its checked body to the response's
bytes: what the route and the batch runner (``mesh.ingress.batch_runner``) both call, so that a
line of a batch is validated, laned, counted and rendered exactly as the same request sent live.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mesh.client import EmbedResult, ValidRequest
from mesh.ingress.encodings import ENCODINGS, render_embeddings_sliced
from mesh.ingress.schema import EmbeddingsRequest
from mesh.ingress.state import IngressState, account


@dataclass(frozen=True, slots=True)
class Embedded:
    """A request's answer (``body``: the response JSON) and what its headers report."""

    body: bytes
    valid: ValidRequest
    result: EmbedResult
    prepared_s: float  # when the front door was done (perf_counter)
    meshed_s: float  # when the mesh answered
    done_s: float  # when the body was rendered


async def embed(state: IngressState, req: EmbeddingsRequest, parsed_s: float) -> Embedded:
    """Resolve, validate and tokenize ``req`` once, run it on the mesh, render the answer.
    ``parsed_s``: when the body was parsed (perf_counter), for the tokenize metric."""
    valid = await front_door(state, req)
    state.responses.reserve(valid, req.encoding_format)  # 413 / 429 before the mesh's work
    prepared = time.perf_counter()
    result = await state.client.submit(valid, state.cfg.request_timeout_s)
    meshed = time.perf_counter()
    tokenized = prepared - parsed_s if req.texts is not None else None
    embeddings = account(state, valid, result, tokenized, meshed - prepared)
    body = await render_embeddings_sliced(
        embeddings, req.encoding_format, valid.model.name, result.prompt_tokens
    )
    return Embedded(body, valid, result, prepared, meshed, time.perf_counter())


async def front_door(state: IngressState, req: EmbeddingsRequest) -> ValidRequest:
    """The client resolves the model and validates (tokenizing texts) once."""
    options = {
        "dims": req.dimensions,
        "kind": ENCODINGS[req.encoding_format],
        "lane": req.lane,
        # TEI's truncate, as on /embed: absent, the server's --auto-truncate decides.
        "truncate": state.cfg.auto_truncate if req.truncate is None else req.truncate,
    }
    if req.texts is not None:
        return await state.client.prepare_texts(
            req.texts, req.model, prompt_name=req.prompt_name, **options
        )
    assert req.token_ids is not None and req.offsets is not None
    return state.client.prepare_tokens(req.token_ids, req.offsets, req.model, **options)
