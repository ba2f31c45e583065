"""A ColBERT model's queries and documents, laid out as colbert-ai and PyLate lay them out.

The model's card says how (``ModelInfo.late_interaction``): each text is tokenized with its
special tokens and cut at the role's length less one (a query's ``query_length``, a
document's ``document_length``), the role's marker token is put after the first token
([CLS]), and a query is padded with the expansion token ([MASK]) to ``query_length``. A
query keeps a vector per token; a document one per token outside the skiplist (punctuation),
its [CLS], marker and [SEP] included. The worker projects and normalizes each token's final
state (rows "multivector") and, for a model whose expansion is attended to by no token,
finds it from the ids (``mesh.worker.engine.heads.late_interaction.key_lengths``).

Queries are always cut at ``query_length``, as both libraries do (its expansion makes a
query exactly that long); a document longer than ``document_length`` is cut only when the
request asks for truncation, else refused, as any over-long input.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from mesh.client.request import ValidRequest, guess_lane, lane_for
from mesh.client.tokenize import ModelTokenizer
from mesh.errors import InvalidInput, TooLarge
from proto_msgs import LateInteraction, ModelInfo, OutputOptions

if TYPE_CHECKING:
    from mesh.client.client import MeshClient

INPUT_TYPES = ("query", "document")


def layout(
    tok: ModelTokenizer, late: LateInteraction, ids: np.ndarray, lengths: np.ndarray,
    query: bool, truncate: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """``(ids, lengths, spans, span_offsets)`` of the model's inputs from the texts' own
    tokens (``ids`` concatenated, ``lengths``: as ``ModelTokenizer.encode`` gives them, cut at
    the model's longest input at most)."""
    limit = (late.query_length if query else late.document_length) - 1  # the marker's place
    post = tok.tokenizer.post_processor  # [CLS] before the text, the rest ([SEP]) after it
    trailing = max(post.num_special_tokens_to_add(False) - 1, 0) if post is not None else 0
    if not query and not truncate and lengths.size and int(lengths.max()) > limit:
        i = int(np.argmax(lengths > limit))
        raise InvalidInput(
            f"input[{i}] has more than {limit + 1} tokens with its marker, the document length "
            f"of model {tok.model.name!r}; shorten it or ask for truncation",
            param="inputs",
        )
    pieces, out_lengths, keep = [], np.empty(len(lengths), dtype=np.int32), []
    marker = late.query_marker if query else late.document_marker
    start = 0
    for i, length in enumerate(lengths.tolist()):
        seq = ids[start : start + length]
        start += length
        if length > limit:  # the text's tokens cut, its closing special tokens kept
            seq = np.concatenate([seq[: limit - trailing], seq[length - trailing :]])
        seq = np.concatenate([seq[:1], [marker], seq[1:]])
        if query and late.expansion >= 0:
            seq = np.concatenate([seq, np.full(limit + 1 - len(seq), late.expansion)])
        pieces.append(seq)
        out_lengths[i] = len(seq)
        keep.append(np.ones(len(seq), bool) if query else ~np.isin(seq, late.skiplist))
    flat = np.concatenate(pieces).astype(np.int32)
    kept = np.concatenate(keep)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(out_lengths, out=offsets[1:])
    position = np.flatnonzero(kept) - np.repeat(offsets[:-1], out_lengths)[kept]
    spans = np.stack([position, position + 1], axis=1).astype(np.int32)
    span_offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum([int(k.sum()) for k in keep], out=span_offsets[1:])
    return flat, out_lengths, spans, span_offsets


async def prepare_late_interaction(
    client: MeshClient, texts: list[str], info: ModelInfo, input_type: str, truncate: bool,
    lane: int | None, max_values: int,
) -> ValidRequest:  # fmt: skip
    """The request for a ColBERT model's per-token vectors of ``texts`` as queries or
    documents (``input_type``). TooLarge past ``max_values``
    numbers (vectors x width) in the answer."""
    late = info.late_interaction
    assert late is not None
    if input_type not in INPUT_TYPES:
        raise InvalidInput(f"'input_type' must be one of {', '.join(INPUT_TYPES)}; got "
                           f"{input_type!r}", param="input_type")  # fmt: skip
    tok = await client.tokenizer(info)
    ids, lengths = await client.tokenizers.encode(tok, texts, True, guess_lane(texts, lane))
    query = input_type == "query"
    ids, lengths, spans, span_offsets = layout(tok, late, ids, lengths, query, truncate)
    values = len(spans) * info.multivector_dims
    if values > max_values:
        raise TooLarge(
            f"{len(spans)} vectors x {info.multivector_dims} dimensions is {values} numbers, "
            f"over the limit of {max_values} per request; send fewer or shorter inputs",
            param="inputs",
        )
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    output = OutputOptions(dims=None, normalize=True, kind="float32", rows="multivector")
    valid = ValidRequest(info, ids, offsets, lengths, output, lane_for(len(ids), lane))
    client._check_backlog(info, valid.lane, valid.tokens)  # 429 before any work, as for any
    return dataclasses.replace(valid, spans=spans, span_offsets=span_offsets)
