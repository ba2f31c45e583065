"""Tokenizing what a cross-encoder scores: (query, passage) pairs, or single texts.

A pair is encoded as the model's tokenizer pairs it (``tokenizer.encode(query, passage)``:
BERT's ``[CLS] q [SEP] p [SEP]`` with token type 1 on the passage and its [SEP]; RoBERTa's
``<s> q </s></s> p </s>``), and truncated as TEI does: the pair's encoding is cut at the
model's limit, ``longest_first`` (tokens come off the longer text first), from the right or
the left as asked. Without truncation an over-long pair is refused, never cut.

What travels is one int per sequence, where its type-1 tokens begin (0 for a single text or
a tokenizer that types both texts 0), not a type per token: ``SubmitRequest.segment_b_start``.

Each text is cut before tokenizing to the client's bound (``ModelTokenizer.cut_chars``: its
first characters, or its last when truncating from the left): a cut text still holds more
tokens than the limit, so the pair still overflows and ``longest_first`` keeps the same tokens
of it, unless both texts of a pair were cut, where which text gives up the odd last token may
differ (two texts over the limit each: a question of one token in a thousand).
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
from tokenizers import Encoding, Tokenizer

from mesh.client.request import over_limit_message
from mesh.client.tokenize import INLINE_MAX_CHARS, ModelTokenizer, TokenizerPool, chunks
from mesh.errors import InvalidInput
from proto_msgs import Lane

ScoreInput = str | tuple[str, str]  # a single text, or a (query, passage) pair

_LEFT: dict[tuple[str, int], Tokenizer] = {}  # left-truncating copies, one per model
_LEFT_LOCK = threading.Lock()


def _left_copy(tok: ModelTokenizer) -> Tokenizer:
    """The model's tokenizer truncating from the left (the client's one is never changed:
    its threads share it)."""
    key = (tok.model.tokenizer_digest, tok.model.max_input_tokens)
    with _LEFT_LOCK:
        copy = _LEFT.get(key)
        if copy is None:
            copy = Tokenizer.from_str(tok.tokenizer.to_str())
            copy.no_padding()
            copy.enable_truncation(tok.model.max_input_tokens, direction="left")
            _LEFT[key] = copy
    return copy


def _cut(text: str, chars: int, left: bool) -> str:
    if len(text) <= chars:
        return text
    return text[-chars:] if left else text[:chars]


def encode_inputs(
    tok: ModelTokenizer, inputs: list[ScoreInput], truncate: bool, left: bool = False,
    first: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """int32 ids (concatenated), lengths and second-text starts of ``inputs``, which are
    inputs ``first``, ``first + 1``, ... of their request (for error messages)."""
    tokenizer = _left_copy(tok) if left and truncate else tok.tokenizer
    chars = tok.cut_chars
    pieces = [
        _cut(x, chars, left) if isinstance(x, str) else (_cut(x[0], chars, left),
                                                          _cut(x[1], chars, left))
        for x in inputs
    ]  # fmt: skip
    encodings: list[Encoding] = tokenizer.encode_batch(pieces)
    lengths = np.empty(len(encodings), dtype=np.int32)
    starts = np.zeros(len(encodings), dtype=np.int32)
    for i, enc in enumerate(encodings):
        if enc.overflowing and not truncate:
            raise InvalidInput(over_limit_message(first + i, tok.model), param="input")
        lengths[i] = len(enc.ids)
        types = enc.type_ids
        if 1 in types:
            starts[i] = types.index(1)
    if int(lengths.min(initial=1)) < 1:
        i = first + int(np.argmin(lengths))
        raise InvalidInput(f"input[{i}] tokenizes to nothing", param="input")
    ids = np.fromiter(
        (t for enc in encodings for t in enc.ids), dtype=np.int32, count=int(lengths.sum())
    )
    return ids, lengths, starts


async def encode_pooled(
    pool: TokenizerPool, tok: ModelTokenizer, inputs: list[ScoreInput], truncate: bool,
    left: bool, priority: Lane,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """:func:`encode_inputs` as the client tokenizes texts: a short live request inline, the
    rest in chunks on the tokenizer threads at ``priority`` (live work first)."""
    sizes = [x if isinstance(x, str) else x[0] + x[1] for x in inputs]
    if priority == Lane.INTERACTIVE and sum(map(len, sizes)) <= INLINE_MAX_CHARS:
        return encode_inputs(tok, inputs, truncate, left)
    jobs = [
        pool.run(priority, encode_inputs, tok, inputs[a:b], truncate, left, a)
        for a, b in chunks(sizes, tok.cut_chars)
    ]
    try:
        parts = await asyncio.gather(*jobs)
    except BaseException:
        for job in jobs:
            job.cancel()
        raise
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]
