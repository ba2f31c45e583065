"""Requests of several rows per sequence, resolved and validated once: contextualized chunk
embeddings (late chunking) and per-token vectors (TEI's ``/embed_all``).

Late chunking: each document runs as ONE sequence through the model, so every chunk's tokens
attend to the whole document. Each chunk is tokenized alone without special tokens, the chunks'
tokens are concatenated and the tokenizer's post-processor puts the model's special tokens
around them ([CLS] ... [SEP] for BERT-like models, EOS for decoders), exactly where it puts them
around one text. A chunk's tokens are a span of that sequence; its vector is the mean of their
final hidden states (``proto_msgs.messages``: spans), then dims, normalization and number format
as for any embedding. Special tokens belong to no chunk.

Only a model whose embedding is the plain mean of its final hidden states (pooling ``mean``, no
Dense layer after it) has chunk vectors in its embedding space; others are refused by name.
No prompt is put before the documents: a prompt's tokens would belong to no chunk yet change
every chunk's vector, which Perplexity's API (the shape served) does not do.
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Encoding, Tokenizer

from mesh.client.request import ValidRequest, check_task, lane_for, output_options, refuse
from mesh.client.tokenize import ModelTokenizer
from mesh.errors import InvalidInput, TooLarge
from proto_msgs import ModelInfo, OutputOptions
from proto_msgs.checks import output_problem, span_model_problem

if TYPE_CHECKING:
    from mesh.client.client import MeshClient

# Perplexity's limits for /v1/contextualizedembeddings; a document is also capped by the model.
MAX_DOCUMENTS = 512
MAX_CHUNKS = 16_000  # in all documents of a request
MAX_DOCUMENT_TOKENS = 32_000
MAX_REQUEST_TOKENS = 120_000
# Per-token vectors (TEI's /embed_all): at most this many numbers (tokens x hidden width) in one
# request's answer, 64 MiB of float32 (about 2.6 MB of JSON per 100k numbers); GET /info says so.
MAX_TOKEN_VECTOR_VALUES = 1 << 24


@dataclass(frozen=True)
class Documents:
    """Tokenized documents: ids and lengths as ``ModelTokenizer.encode`` gives them, plus each
    chunk's token span inside its document and where each document's spans begin."""

    ids: np.ndarray  # int32, documents concatenated
    lengths: np.ndarray  # int32 [n]
    spans: np.ndarray  # int32 [chunks, 2], relative to each document
    span_offsets: np.ndarray  # int32 [n + 1]


def check_span_model(model: ModelInfo, what: str) -> None:
    """InvalidInput unless span rows of ``model`` are what ``what`` promises: the model must
    embed (no cross-encoder) and say its hidden width (a worker from before spans does not)."""
    refuse(span_model_problem(model, what))


def check_mean_pooled(model: ModelInfo) -> None:
    """Chunk vectors are means of hidden states: only a mean-pooled model without Dense layers
    embeds that way, so only such a model's chunk vectors are comparable with its embeddings."""
    check_span_model(model, "contextualized embeddings")
    check_task(model, "embed")  # a ColBERT model's tokens are no chunk's
    if model.pooling != "mean" or model.has_dense:
        how = f"pooling {model.pooling!r}" + (" and Dense layers" if model.has_dense else "")
        raise InvalidInput(
            f"model {model.name!r} embeds by {how}; contextualized chunk embeddings are the "
            "mean of each chunk's tokens, which only a mean-pooled model without Dense layers "
            "embeds as its own vectors",
            param="model",
        )


def check_document_limits(documents: list[list[str]]) -> None:
    """Perplexity's count limits, before any tokenizing: 413 beyond, 422 for an empty one."""
    if not documents:
        raise InvalidInput("'input' must hold at least one document", param="input")
    if len(documents) > MAX_DOCUMENTS:
        raise TooLarge(
            f"{len(documents)} documents; at most {MAX_DOCUMENTS} documents a request",
            param="input",
        )
    chunks = sum(map(len, documents))
    if chunks > MAX_CHUNKS:
        raise TooLarge(f"{chunks} chunks; at most {MAX_CHUNKS} chunks a request", param="input")
    for d, doc in enumerate(documents):
        if not doc:
            raise InvalidInput(f"input[{d}] has no chunk", param="input")


_UNCUT: weakref.WeakKeyDictionary[ModelTokenizer, Tokenizer] = weakref.WeakKeyDictionary()


def _uncut(tok: ModelTokenizer) -> Tokenizer:
    """A copy of the model's tokenizer that does not truncate: a chunk must never be cut
    silently (a document over the limit is refused instead). Threads may build it twice."""
    plain = _UNCUT.get(tok)
    if plain is None:
        plain = Tokenizer.from_str(tok.tokenizer.to_str())
        plain.no_truncation()
        plain.no_padding()
        _UNCUT[tok] = plain
    return plain


def encode_documents(tok: ModelTokenizer, documents: list[list[str]]) -> Documents:
    """Tokenize each document's chunks alone, join them inside the special tokens, keep their
    spans; InvalidInput for a chunk of no token or a document over the limit, TooLarge for a
    request over ``MAX_REQUEST_TOKENS``. Runs on a tokenizer thread (``encode_batch`` frees
    the GIL)."""
    model = tok.model
    limit = min(MAX_DOCUMENT_TOKENS, model.max_input_tokens)
    plain = _uncut(tok)
    flat = [chunk for doc in documents for chunk in doc]
    encodings = plain.encode_batch(flat, add_special_tokens=False)
    id_parts: list[list[int]] = []
    span_parts: list[np.ndarray] = []
    lengths = np.zeros(len(documents), dtype=np.int32)
    counts = np.fromiter(map(len, documents), dtype=np.int32, count=len(documents))
    total = 0
    first = 0
    for d, n_chunks in enumerate(counts.tolist()):
        chunk_encs = encodings[first : first + n_chunks]
        sizes = np.fromiter((len(e.ids) for e in chunk_encs), dtype=np.int64, count=n_chunks)
        if sizes.min() < 1:
            c = int(np.argmin(sizes))
            raise InvalidInput(f"input[{d}][{c}] tokenizes to nothing", param="input")
        first += n_chunks
        # The post-processor adds the special tokens around the joined chunks as around one
        # text; the content tokens (sequence id 0) stay together and in order.
        joined = plain.post_process(Encoding.merge(chunk_encs, growing_offsets=True))
        if len(joined.ids) > limit:
            raise InvalidInput(
                f"input[{d}] has {len(joined.ids)} tokens, more than {limit}, the limit of a "
                f"document for model {model.name!r}; split it into several documents",
                param="input",
            )
        start = joined.sequence_ids.index(0)
        ends = start + np.cumsum(sizes)
        span_parts.append(np.stack([ends - sizes, ends], axis=1))
        id_parts.append(joined.ids)
        lengths[d] = len(joined.ids)
        total += len(joined.ids)
        if total > MAX_REQUEST_TOKENS:
            raise TooLarge(
                f"over {MAX_REQUEST_TOKENS} tokens in the request's documents; send fewer",
                param="input",
            )
    span_offsets = np.zeros(len(documents) + 1, dtype=np.int32)
    np.cumsum(counts, out=span_offsets[1:])
    ids = np.fromiter((t for part in id_parts for t in part), dtype=np.int32, count=total)
    spans = np.concatenate(span_parts).astype(np.int32)
    return Documents(ids, lengths, spans, span_offsets)


async def prepare_documents(
    client: MeshClient,
    documents: list[list[str]],
    model: str,
    *,
    dims: int | None = None,
    kind: str = "float32",
    lane: int | None = None,
) -> ValidRequest:
    """Resolve ``model`` (mean-pooled embedders only), check the limits, tokenize (off the
    event loop, live work first): one sequence per document, one span per chunk."""
    check_document_limits(documents)
    info = client.resolve(model)
    check_mean_pooled(info)
    output = output_options(info, dims, True, kind)
    chars = sum(len(chunk) for doc in documents for chunk in doc)
    priority = lane_for(chars // 4, lane)
    tok = await client.tokenizer(info)
    docs = await client.tokenizers.run(priority, encode_documents, tok, documents)
    offsets = np.zeros(len(docs.lengths) + 1, dtype=np.int32)
    np.cumsum(docs.lengths, out=offsets[1:])
    return ValidRequest(
        info, docs.ids, offsets, docs.lengths, _spans(output), lane_for(len(docs.ids), lane),
        spans=docs.spans, span_offsets=docs.span_offsets,
    )  # fmt: skip


def token_spans(lengths: np.ndarray, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every token from position ``first`` on its own span (per-token vectors): ``(spans,
    span_offsets)``; each length must exceed ``first``."""
    counts = np.asarray(lengths, dtype=np.int64) - first
    starts_of_seq = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts_of_seq[1:])
    position = np.arange(int(counts.sum())) - np.repeat(starts_of_seq[:-1], counts) + first
    spans = np.stack([position, position + 1], axis=1).astype(np.int32)
    return spans, starts_of_seq.astype(np.int32)


def multi_vector(valid: ValidRequest) -> ValidRequest:
    """``valid`` (tokenized as for an embedding) answering the model's multi-vector head's
    per-token vectors, normalized, float32: bge-m3's colbert vectors, one per token after the
    first (``<s>`` has none, the final ``</s>`` has one, as FlagEmbedding returns them).
    InvalidInput for a model without the head or an input of one token; TooLarge past
    ``MAX_TOKEN_VECTOR_VALUES`` numbers, as for /embed_all."""
    model = valid.model
    output = OutputOptions(dims=None, normalize=True, kind="float32", rows="multivector")
    # The span model (check_span_model's rule, same message), the head, the kind in its task.
    refuse(output_problem(model, output))
    width = model.multivector_dims
    if valid.lengths.size and int(valid.lengths.min()) < 2:
        raise InvalidInput("an input of one token has no vector after its first token",
                           param="inputs")  # fmt: skip
    values = (valid.tokens - valid.n) * width
    if values > MAX_TOKEN_VECTOR_VALUES:
        raise TooLarge(
            f"{valid.tokens - valid.n} vectors x {width} dimensions is {values} numbers, over "
            f"the limit of {MAX_TOKEN_VECTOR_VALUES} per request; send fewer or shorter inputs",
            param="inputs",
        )
    spans, span_offsets = token_spans(valid.lengths, first=1)
    return dataclasses.replace(valid, output=output, spans=spans, span_offsets=span_offsets)


def per_token(valid: ValidRequest) -> ValidRequest:
    """``valid`` (its inputs tokenized as for an embedding) answering every token's final
    hidden state, raw: full width, not normalized, float32 (TEI's /embed_all). TooLarge when
    the answer would hold over ``MAX_TOKEN_VECTOR_VALUES`` numbers."""
    model = valid.model
    check_span_model(model, "per-token vectors")
    values = valid.tokens * model.hidden_size
    if values > MAX_TOKEN_VECTOR_VALUES:
        raise TooLarge(
            f"{valid.tokens} tokens x {model.hidden_size} dimensions is {values} numbers, over "
            f"the limit of {MAX_TOKEN_VECTOR_VALUES} per request; send fewer or shorter inputs",
            param="inputs",
        )
    spans, span_offsets = token_spans(valid.lengths)
    output = OutputOptions(dims=None, normalize=False, kind="float32", rows="spans")
    return dataclasses.replace(valid, output=output, spans=spans, span_offsets=span_offsets)


def _spans(output: OutputOptions) -> OutputOptions:
    return OutputOptions(dims=output.dims, normalize=output.normalize, kind=output.kind,
                         rows="spans")  # fmt: skip
