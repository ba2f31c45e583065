"""TEI-compatible routes on the ingress's port, so that clients written for
text-embeddings-inference (``huggingface_hub.InferenceClient(base_url=...).feature_extraction``,
LangChain's and LlamaIndex's TEI integrations, raw HTTP) work unchanged.

- ``POST /`` and ``POST /embed``: ``inputs`` (a string, a list of token ids, or a list of
  either kind; one kind per request), ``normalize`` (true), ``truncate`` (the server's
  ``--auto-truncate`` when absent, as TEI), ``truncation_direction`` (``"Right"`` | ``"Left"``),
  ``dimensions`` (Matryoshka), ``prompt_name`` (one of the model's sentence-transformers
  prompts; without it the model's default prompt applies, as in TEI; not with token ids); the
  answer is a bare list of float lists.
- ``POST /tokenize``: ``inputs`` (a string or a list), ``add_special_tokens`` (true); per input
  a list of ``{id, text, special, start, stop}``, ``start``/``stop`` being UTF-8 **byte**
  offsets into the input as TEI reports them (null for special tokens); with a prompt (named in
  ``prompt_name`` or the model's default) the input is the prompted text, as in TEI. Not
  truncated; an input over ``max_input_length × 250`` characters is refused (422), as TEI does.
- ``POST /decode``: ``ids`` (a list of ids or a list of such lists), ``skip_special_tokens``
  (true); always a list of strings, as TEI.
- ``GET /info``: TEI's ``Info`` fields, from the model's catalog entry and this ingress's
  settings (a sparse model's ``model_type`` is ``{"embedding": {"pooling": "splade"}}``, as
  TEI reports SPLADE models). ``POST /embed_sparse`` is :mod:`mesh.ingress.sparse`'s.

Everything goes through the one front door (``MeshClient.prepare_texts`` / ``prepare_tokens``,
then ``submit``): the same validation, lanes (``X-Embedmesh-Priority`` works here too) and
live-first tokenizing as ``/v1/embeddings``. Errors have TEI's shape and statuses
(``http_errors.TEI_BY_CODE``); with ``--api-key`` every route here needs the key, ``/info``
too (TEI guards it as well); ``GET /`` (health) stays open.

The model: TEI's bodies name none, so it is the ``X-Embedmesh-Model`` header (a served name or
alias), else the ingress's ``--tei-model``, else the only model served; with several served and
neither given, 422 asks for the header.

Timing headers, on these routes and on ``/v1/embeddings``, as TEI sends them (whole ms,
truncated): ``x-compute-time`` and ``x-total-time`` (handler start to response built),
``x-tokenization-time`` (model resolved, validated and tokenized), ``x-queue-time`` (the longest
broker queue wait of the request's sequences), ``x-inference-time`` (worker compute of the
batches that carried it), ``x-compute-tokens``, ``x-compute-characters``. TEI averages the
three stage times over a batch's inputs; here a request is one unit, so they are the request's.
"""

from __future__ import annotations

import importlib.metadata
import time

import orjson
from aiohttp import web

from mesh.client import EmbedResult, ValidRequest
from mesh.client.request import prompt_text
from mesh.client.spans import MAX_TOKEN_VECTOR_VALUES
from mesh.config import MAX_BATCH_REQUESTS, MAX_BATCH_TOKENS_CPU, MAX_SPARSE_PAIRS
from mesh.errors import InvalidInput, ModelNotFound, Unavailable
from mesh.ingress.encodings import render_vectors_sliced
from mesh.ingress.http_errors import TEI
from mesh.ingress.schema import PRIORITY_HEADER, header_lane
from mesh.ingress.state import STATE, IngressState, account, json_response, read_body
from mesh.ingress.tei_schema import (
    TeiInputsBody,
    parse_decode_request,
    parse_embed_request,
    parse_tokenize_request,
)
from mesh.ingress.tei_tokens import (
    TeiTokenizers,
    decode,
    encode_left,
    keep_last,
    off_loop,
    token_objects,
)
from proto_msgs import Lane, ModelInfo

MODEL_HEADER = "X-Embedmesh-Model"
# TEI refuses to tokenize an input longer than this many characters per token of the limit.
MAX_CHARS_PER_TOKEN = 250
# The mesh bounds queued tokens (429 from the broker), not concurrent requests: /info reports
# TEI's default for this field, which TEI's clients expect to find.
MAX_CONCURRENT_REQUESTS = 512
# Our pooling names → TEI's.
POOLING = {"mean": "mean", "cls": "cls", "last": "last_token", "splade": "splade"}


def _version() -> str:
    # Run from a checkout on PYTHONPATH (the GPU machine, a container built without pip) there
    # is no installed distribution to ask: /info says so instead of the ingress failing to start.
    try:
        return importlib.metadata.version("embedmesh")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


VERSION = _version()

_TOKENIZERS = web.AppKey("embedmesh_tei_tokenizers", TeiTokenizers)


def add_routes(app: web.Application) -> None:
    """Register TEI's routes; their ``tei.`` names make errors take TEI's shape."""
    app[_TOKENIZERS] = TeiTokenizers()
    app.router.add_post("/", _embed, name=f"{TEI}.root")
    app.router.add_post("/embed", _embed, name=f"{TEI}.embed")
    app.router.add_post("/tokenize", _tokenize, name=f"{TEI}.tokenize")
    app.router.add_post("/decode", _decode, name=f"{TEI}.decode")
    app.router.add_get("/info", _info, name=f"{TEI}.info")


def timing_headers(
    total_s: float, tokenize_s: float, result: EmbedResult, chars: int
) -> dict[str, str]:
    """TEI's timing headers for one embedding response, in whole milliseconds (TEI writes
    ``Duration::as_millis``, which truncates)."""
    total = str(int(total_s * 1000))
    return {
        "x-compute-time": total,
        "x-total-time": total,
        "x-tokenization-time": str(int(tokenize_s * 1000)),
        "x-queue-time": str(int(result.queue_ms)),
        "x-inference-time": str(int(result.compute_ms)),
        "x-compute-tokens": str(result.prompt_tokens),
        "x-compute-characters": str(chars),
    }


def model_for(state: IngressState, request: web.Request) -> ModelInfo:
    """The model of a TEI request: the header, else ``--tei-model``, else the only one served."""
    client = state.client
    header = request.headers.get(MODEL_HEADER, "").strip()
    name = header or state.cfg.tei_model
    if name:
        try:
            return client.resolve(name)
        except ModelNotFound as exc:
            where = f"the {MODEL_HEADER} header" if header else "the server's --tei-model"
            raise ModelNotFound(
                f"{exc.message}; it came from {where}", param=MODEL_HEADER
            ) from None
    if not any(b.alive for b in client.brokers):
        raise Unavailable("no broker is reachable; retry later")
    served = client.models()
    if len(served) == 1:
        return served[0]
    if not served:
        raise Unavailable("no model is served right now; retry later")
    names = ", ".join(sorted(m.name for m in served))
    raise InvalidInput(
        f"this server serves several models ({names}) and TEI requests name none: set the "
        f"{MODEL_HEADER} header to one of them (or start the ingress with --tei-model NAME)",
        param=MODEL_HEADER,
    )


async def _embed(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cfg = state.cfg
    start = time.perf_counter()
    body = await read_body(request, cfg.max_body_bytes)
    req = parse_embed_request(body, cfg.max_inputs)
    lane = header_lane(request.headers.get(PRIORITY_HEADER))
    info = model_for(state, request)
    parsed = time.perf_counter()
    valid = await _front_door(state, request.app[_TOKENIZERS], info, req, lane)
    state.responses.reserve(valid, "float")
    prepared = time.perf_counter()
    result = await state.client.submit(valid, cfg.request_timeout_s)
    meshed = time.perf_counter()
    tokenized = prepared - parsed if req.inputs.texts is not None else None
    embeddings = account(state, valid, result, tokenized, meshed - prepared)
    out = await render_vectors_sliced(embeddings)
    headers = timing_headers(
        time.perf_counter() - start, prepared - parsed, result, req.inputs.chars
    )
    return web.Response(body=out, content_type="application/json", headers=headers)


async def _front_door(
    state: IngressState, copies: TeiTokenizers, info: ModelInfo, req: TeiInputsBody,
    lane: Lane | None,
) -> ValidRequest:  # fmt: skip
    """The client validates (tokenizing texts) once; truncation from the left is done here
    first (the client's tokenizer cuts from the right), then checked as given ids."""
    client = state.client
    truncate = state.cfg.auto_truncate if req.truncate is None else req.truncate
    # The body's output options: /embed's dims and normalize, /embed_sparse's kind and bounds.
    options = {**req.options(), "lane": lane, "truncate": truncate}
    inputs = req.inputs
    left = truncate and req.direction == "left"
    if inputs.texts is not None and not left:
        return await client.prepare_texts(
            inputs.texts, info.name, prompt_name=req.prompt_name, **options
        )
    if inputs.texts is not None:
        prompt = prompt_text(info, req.prompt_name)
        if prompt and not info.include_prompt:
            # The pooling leaves the prompt's tokens out, counted once per request
            # (OutputOptions.pool_skip); cut from the left, each text loses a different part
            # of its prompt, which that count cannot say: refuse rather than pool the prompt.
            raise InvalidInput(
                f"truncation_direction Left with a prompt is not served for model {info.name!r},"
                " whose pooling leaves the prompt out; use Right, or no prompt",
                param="truncation_direction",
            )
        texts = [prompt + text for text in inputs.texts] if prompt else inputs.texts
        tok = await client.tokenizer(info)
        ids, offsets = await off_loop(
            inputs.chars, encode_left, copies.left(tok), texts, tok.cut_chars
        )
    else:
        assert inputs.token_ids is not None and inputs.offsets is not None
        ids, offsets = inputs.token_ids, inputs.offsets
        if left:
            ids, offsets = keep_last(ids, offsets, info.max_input_tokens)
    return client.prepare_tokens(ids, offsets, info.name, **options)


async def _tokenize(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cfg = state.cfg
    req = parse_tokenize_request(await read_body(request, cfg.max_body_bytes), cfg.max_inputs)
    info = model_for(state, request)
    limit = info.max_input_tokens * MAX_CHARS_PER_TOKEN
    for i, text in enumerate(req.texts):
        if len(text) > limit:
            raise InvalidInput(
                f"inputs[{i}] must have less than {limit} characters. Given: {len(text)}",
                param="inputs",
            )
    # As TEI: the prompt goes before each text, and offsets count in the prompted text.
    prompt = prompt_text(info, req.prompt_name)
    texts = [prompt + text for text in req.texts] if prompt else req.texts
    tok = request.app[_TOKENIZERS].plain(await state.client.tokenizer(info))
    chars = sum(map(len, texts))
    body = await off_loop(
        chars, lambda: orjson.dumps(token_objects(tok, texts, req.add_special_tokens))
    )
    return web.Response(body=body, content_type="application/json")


async def _decode(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cfg = state.cfg
    req = parse_decode_request(await read_body(request, cfg.max_body_bytes), cfg.max_inputs)
    info = model_for(state, request)
    tok = request.app[_TOKENIZERS].plain(await state.client.tokenizer(info))
    ids = sum(map(len, req.ids))
    return json_response(await off_loop(ids, decode, tok, req.ids, req.skip_special_tokens))


async def _info(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return json_response(info_doc(model_for(state, request), state))


def model_type(model: ModelInfo) -> dict[str, object]:
    """TEI's ``ModelType``: a cross-encoder of one label is a re-ranker, of several a
    classifier (both with ``id2label`` and ``label2id``); anything else embeds."""
    if model.task != "score":
        return {"embedding": {"pooling": POOLING.get(model.pooling, model.pooling)}}
    head = {
        "id2label": {str(i): label for i, label in enumerate(model.labels)},
        "label2id": {label: i for i, label in enumerate(model.labels)},
    }
    return {"reranker" if len(model.labels) == 1 else "classifier": head}


def info_doc(model: ModelInfo, state: IngressState) -> dict[str, object]:
    """TEI's ``Info``. The batch limits are the largest budget among the model's live
    workers, as the broker's catalog says (the mesh's CPU defaults from a broker too old to
    say); the dtype is the worker's card's ("unknown" from a worker too old to say)."""
    cfg = state.cfg
    return {
        "model_id": next((a for a in model.aliases if "/" in a), model.name),
        "model_sha": None,
        "model_dtype": model.dtype or "unknown",
        "served_model_name": model.name,
        "model_type": model_type(model),
        "max_concurrent_requests": MAX_CONCURRENT_REQUESTS,
        "max_input_length": model.max_input_tokens,
        "max_batch_tokens": model.max_batch_tokens or MAX_BATCH_TOKENS_CPU,
        "max_batch_requests": model.max_batch_requests or MAX_BATCH_REQUESTS,
        "max_client_batch_size": cfg.max_inputs,
        "auto_truncate": cfg.auto_truncate,
        "tokenization_workers": cfg.tokenizer_threads,
        # Ours: the most numbers (tokens x width) one /embed_all answer holds (413 beyond).
        "max_embed_all_values": MAX_TOKEN_VECTOR_VALUES,
        # Ours: the width of /embed_multivector's per-token vectors; 0: the model has no such head.
        "multivector_dims": model.multivector_dims,
        # Ours: a ColBERT model's query and document lengths in tokens, markers included (a
        # query expanded with [MASK] has exactly query_length vectors); null for other models.
        "late_interaction": None
        if model.late_interaction is None
        else {
            "query_length": model.late_interaction.query_length,
            "document_length": model.late_interaction.document_length,
        },
        # Ours: the most (index, value) pairs one /embed_sparse request may ask for, inputs x
        # top_k (x the vocabulary without top_k): 413 beyond.
        "max_embed_sparse_pairs": MAX_SPARSE_PAIRS,
        # Ours: true for an embedder that /embed_sparse also takes (bge-m3's lexical weights).
        "embed_sparse": model.task == "sparse" or model.lexical,
        "version": VERSION,
        "sha": None,
        "docker_label": None,
    }
