"""TEI's ``POST /embed_sparse``: a sparse (SPLADE) model's vocabulary weights per input, or
an embedder's lexical weights (bge-m3: ``ModelInfo.lexical``, worker/engine/lexical.py).

The body is TEI's (``inputs``, ``truncate``, ``truncation_direction``, ``prompt_name``, as
``/embed`` takes them), plus two fields of ours that bound the answer: ``top_k``, the most
(index, value) pairs per input, the largest values (from 1 to the model's vocabulary size), and
``threshold``, the value a pair must exceed (default 0). Without them the answer is TEI's:
every non-zero weight of each input, as a list of ``{"index": token id, "value": weight}``
sorted by index, always a list of such lists.

The bound is explicit and on the worst case: an input may answer up to ``top_k`` pairs (its
whole vocabulary without ``top_k``: what the model gives is not known before it runs), so a
request whose inputs x ``top_k`` (x the vocabulary) is over ``MAX_SPARSE_PAIRS``
(``mesh.config``; ``GET /info`` says it as ``max_embed_sparse_pairs``) is refused with 413
before any work, saying how many inputs fit or which ``top_k`` would
(``mesh.client.request.sparse_options``). What travels is what was kept: the worker's rows are
as wide as the most weights one row of the batch kept.

It goes through the one front door (``tei._front_door``, then ``MeshClient.prepare_texts`` /
``prepare_tokens`` with the output kind "sparse"): the same validation, lanes, admission and
deadlines as ``/embed``. A dense model without lexical weights here, or a sparse model on
``/embed`` and ``/v1/embeddings``, is a 422 naming what the model does
(``request.check_task``).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import orjson
from aiohttp import web

from mesh.errors import ProtocolViolation
from mesh.ingress import tei
from mesh.ingress.encodings import SLICE_VALUES
from mesh.ingress.http_errors import TEI
from mesh.ingress.schema import PRIORITY_HEADER, header_lane
from mesh.ingress.state import STATE, account, read_body
from mesh.ingress.tei_schema import parse_sparse_request

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def add_routes(app: web.Application) -> None:
    app.router.add_post("/embed_sparse", _embed_sparse, name=f"{TEI}.embed_sparse")


async def _embed_sparse(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cfg = state.cfg
    start = time.perf_counter()
    req = parse_sparse_request(await read_body(request, cfg.max_body_bytes), cfg.max_inputs)
    lane = header_lane(request.headers.get(PRIORITY_HEADER))
    info = tei.model_for(state, request)
    parsed = time.perf_counter()
    valid = await tei._front_door(state, request.app[tei._TOKENIZERS], info, req, lane)
    prepared = time.perf_counter()
    result = await state.client.submit(valid, cfg.request_timeout_s)
    meshed = time.perf_counter()
    tokenized = prepared - parsed if req.inputs.texts is not None else None
    rows = account(state, valid, result, tokenized, meshed - prepared)
    body = await render_sparse(rows, info.vocab_size)
    headers = tei.timing_headers(
        time.perf_counter() - start, prepared - parsed, result, req.inputs.chars
    )
    return web.Response(body=body, content_type="application/json", headers=headers)


def sparse_objects(rows: np.ndarray, vocab_size: int) -> list[list[dict[str, object]]]:
    """TEI's ``[[{"index", "value"}, ...], ...]`` from the worker's rows (float32 ``[n, 2k]``:
    k ids then k values, zero-padded, k at most top_k; proto_msgs.OUTPUT_KINDS "sparse"). A pad
    has value 0;
    an id outside the vocabulary is the mesh's fault."""
    if rows.ndim != 2 or rows.shape[1] % 2:
        raise ProtocolViolation(f"sparse rows must be [n, 2k]; got {rows.shape}")
    k = rows.shape[1] // 2
    ids, values = rows[:, :k], rows[:, k:]
    kept = values > 0
    if (ids[kept] >= vocab_size).any() or (ids[kept] != np.floor(ids[kept])).any():
        raise ProtocolViolation("sparse rows hold a token id outside the vocabulary")
    out = []
    for row_ids, row_values, row_kept in zip(ids, values, kept, strict=True):
        index = row_ids[row_kept].astype(np.int64).tolist()
        # float32 scalars: orjson writes each in its shortest float32 form, as TEI's f32 does.
        value = list(row_values[row_kept])
        out.append([{"index": i, "value": v} for i, v in zip(index, value, strict=True)])
    return out


async def render_sparse(rows: np.ndarray, vocab_size: int) -> bytes:
    """The body of :func:`sparse_objects`, in slices of about ``SLICE_VALUES`` numbers with
    the event loop free between them (as ``encodings.render_vectors_sliced``)."""
    step = max(1, SLICE_VALUES // max(1, rows.shape[1]))
    if len(rows) <= step:
        return orjson.dumps(sparse_objects(rows, vocab_size), option=_NUMPY)
    parts = []
    for start in range(0, len(rows), step):
        objects = sparse_objects(rows[start : start + step], vocab_size)
        parts.append(orjson.dumps(objects, option=_NUMPY)[1:-1])
        await asyncio.sleep(0)
    return b"[" + b",".join(parts) + b"]"
