"""A span request's answer assembled from result chunks: each sequence's rows land where its
spans say, in any chunk order; a duplicate chunk (after a requeue) is dropped; rows that
disagree with the request's spans are a protocol error. And the documents' tokenization:
chunks joined inside the special tokens, spans on each chunk's tokens, limits."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from mesh.client.connection import _Pending
from mesh.client.spans import encode_documents, token_spans
from mesh.client.tokenize import ModelTokenizer
from mesh.errors import InvalidInput
from mesh.worker.engine.card import read_card
from proto_msgs import ModelInfo, ProtocolError, RequestResult

SPAN_OFFSETS = np.array([0, 2, 3, 6], np.int32)  # 2, 1 and 3 spans


def _chunk(indices: list[int], counts: list[int], first_value: float) -> RequestResult:
    rows = sum(counts)
    values = np.arange(rows, dtype=np.float32)[:, None] + first_value
    return RequestResult(
        cid=1,
        prompt_tokens=5,
        indices=np.array(indices, np.int32),
        embeddings=np.repeat(values, 4, axis=1),
        row_offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
    )


async def test_rows_land_by_span_in_any_order_and_duplicates_are_dropped() -> None:
    loop = asyncio.get_running_loop()
    pending = _Pending(loop.create_future(), n=3, tokens=15, span_offsets=SPAN_OFFSETS)
    assert not pending.add(_chunk([2, 0], [3, 2], 10.0))  # rows 3..5 then 0..1
    assert not pending.add(_chunk([0], [2], 99.0))  # a duplicate: dropped
    assert pending.add(_chunk([1], [1], 50.0))
    got = pending.result().embeddings[:, 0].tolist()
    assert got == [13.0, 14.0, 50.0, 10.0, 11.0, 12.0]
    assert pending.prompt_tokens == 10


async def test_rows_that_disagree_with_the_spans_are_refused() -> None:
    loop = asyncio.get_running_loop()
    pending = _Pending(loop.create_future(), n=3, tokens=15, span_offsets=SPAN_OFFSETS)
    with pytest.raises(ProtocolError):
        pending.add(_chunk([0], [3], 0.0))


def test_token_spans_give_every_token_its_own_span() -> None:
    spans, offsets = token_spans(np.array([3, 1], np.int32))
    assert spans.tolist() == [[0, 1], [1, 2], [2, 3], [0, 1]] and offsets.tolist() == [0, 3, 4]


@pytest.fixture(scope="module")
def minilm_tokenizer() -> ModelTokenizer:
    from mesh.worker.engine.card import default_model_path

    card = read_card(default_model_path())
    info = ModelInfo(card.name, [], card.dims, card.max_input_tokens, 30522, "mean", True, "d")
    return ModelTokenizer(card.tokenizer_json, info)


def test_documents_join_their_chunks_inside_cls_and_sep(minilm_tokenizer: ModelTokenizer) -> None:
    docs = encode_documents(minilm_tokenizer, [["hello world", "again"], ["one"]])
    plain = minilm_tokenizer.tokenizer
    hello = plain.encode("hello world", add_special_tokens=False).ids
    again = plain.encode("again", add_special_tokens=False).ids
    assert docs.ids[: docs.lengths[0]].tolist() == [101, *hello, *again, 102]
    assert docs.spans.tolist() == [
        [1, 1 + len(hello)],
        [1 + len(hello), 1 + len(hello) + 1],
        [1, 2],
    ]
    assert docs.span_offsets.tolist() == [0, 2, 3]


def test_a_document_over_the_model_limit_is_refused_not_cut(
    minilm_tokenizer: ModelTokenizer,
) -> None:
    with pytest.raises(InvalidInput, match="input\\[1\\] has 3.. tokens"):
        encode_documents(minilm_tokenizer, [["fine"], ["word " * 150, "word " * 150]])
