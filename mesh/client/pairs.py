"""Tokenizing what a cross-encoder scores: (query, passage) pairs, or single texts.

A pair is encoded as the model's tokenizer pairs it (``tokenizer.encode(query, passage)``:
BERT's ``[CLS] q [SEP] p [SEP]`` with token type 1 on the passage and its [SEP]; RoBERTa's
``<s> q </s></s> p </s>``), and truncated as TEI does, which is the tokenizer's own
``longest_first`` at the model's limit, from the right or the left: a shorter text that fits
in half the room is kept whole and the longer one gets the rest; when both are over half, each
gets half, the longer one the odd token. Without truncation an over-long input is refused.

What travels is one int per sequence, where its type-1 tokens begin (0 for a single text or
a tokenizer that types both texts 0), not a type per token: ``SubmitRequest.segment_b_start``.

The texts are tokenized apart, without special tokens or truncation, and the rule above and
the model's template (where its post-processor puts the special tokens, read once from a
probe pair) are applied here: equal to encoding the pair with truncation, at linear cost.
(``tokenizers`` builds every combination of both texts' overflowing windows when it truncates
a pair: 34 s for two 20,000-character texts.) Each text is first cut to the client's bound
(``ModelTokenizer.cut_chars``: its first characters, or its last from the left), as single
texts are; a cut text is settled when it still overflows, its kept tokens end two words before
the cut (the last word may be split), and its real length cannot change the split (the odd
token). Otherwise its bound grows fourfold and it is tokenized again, up to the whole text.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer

from mesh.client.tokenize import (
    GROWTH,
    INLINE_MAX_CHARS,
    ModelTokenizer,
    TokenizerPool,
    chunk_sizes,
)
from mesh.errors import InvalidInput
from proto_msgs import Lane
from proto_msgs.checks import over_limit_message

ScoreInput = str | tuple[str, str]  # a single text, or a (query, passage) pair


@dataclass(frozen=True)
class _Model:
    """A model's plain tokenizer (no truncation, no padding) and its post-processor's templates:
    per part, a special token's id or ``-1 - k`` for text ``k``, and its token type."""

    plain: Tokenizer
    single: tuple[tuple[int, int], ...]
    pair: tuple[tuple[int, int], ...]


_MODELS: dict[tuple[str, int], _Model] = {}
_MODELS_LOCK = threading.Lock()


def _model(tok: ModelTokenizer) -> _Model:
    key = (tok.model.tokenizer_digest, tok.model.max_input_tokens)
    with _MODELS_LOCK:
        found = _MODELS.get(key)
        if found is None:
            plain = Tokenizer.from_str(tok.tokenizer.to_str())
            plain.no_padding()
            plain.no_truncation()
            single, pair = plain.encode_batch(["a", ("a", "b")])
            found = _MODELS[key] = _Model(plain, _template(single), _template(pair))
    return found


def _template(probe: Encoding) -> tuple[tuple[int, int], ...]:
    parts: list[tuple[int, int]] = []
    previous = None
    for token, seq, kind in zip(probe.ids, probe.sequence_ids, probe.type_ids, strict=True):
        if seq is None:
            parts.append((token, kind))
        elif seq != previous:
            parts.append((-1 - seq, kind))
        previous = seq
    return tuple(parts)


def longest_first(n1: int, n2: int, room: int) -> tuple[int, int]:
    """Tokens kept of two texts of ``n1`` and ``n2`` tokens in ``room``, as ``tokenizers``'
    ``longest_first`` keeps them (ties: the second text gets the odd token)."""
    if n1 + n2 <= room:
        return n1, n2
    swap = n1 > n2
    short, long_ = (n2, n1) if swap else (n1, n2)
    long_ = short if short > room else max(short, room - short)
    if short + long_ > room:
        short, long_ = room // 2, room // 2 + room % 2
    return (long_, short) if swap else (short, long_)


def _cut(text: str, chars: int, left: bool) -> str:
    if len(text) <= chars:
        return text
    return text[-chars:] if left else text[:chars]


def _settled(enc: Encoding, kept: int, left: bool) -> bool:
    """Whether a cut piece's ``kept`` tokens are the whole text's: it overflowed, and they
    stay two words clear of the cut (whose word may be split)."""
    words = enc.word_ids
    if kept >= len(words):
        return False
    edge, end = (words[len(words) - kept], words[0]) if left else (words[kept - 1], words[-1])
    if edge is None or end is None:
        return False  # no word to measure by: take more of the text
    return edge > end + 1 if left else edge < end - 1


def _split_stable(lengths: list[int], cut: list[bool], room: int) -> bool:
    """Whether the pair's split holds for any real length of its cut texts (each at least its
    piece's): only an odd room split in half hangs on which text is longer."""
    if room % 2 == 0 or min(lengths) <= room // 2:
        return True
    a, b = lengths
    if cut[0] and cut[1]:
        return False
    return a > b if cut[0] else b > a


def encode_inputs(
    tok: ModelTokenizer, inputs: list[ScoreInput], truncate: bool, left: bool = False,
    first: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """int32 ids (concatenated), lengths and second-text starts of ``inputs``, which are
    inputs ``first``, ``first + 1``, ... of their request (for error messages)."""
    model = _model(tok)
    texts = [[x] if isinstance(x, str) else list(x) for x in inputs]
    bounds = [[tok.cut_chars] * len(t) for t in texts]
    kept: list[list[list[int]]] = [[] for _ in inputs]
    todo = list(range(len(inputs)))
    while todo:
        pieces = [[_cut(t, b, left) for t, b in zip(texts[i], bounds[i], strict=True)]
                  for i in todo]  # fmt: skip
        flat = [piece for group in pieces for piece in group]
        encodings = iter(model.plain.encode_batch(flat, add_special_tokens=False))
        again = []
        for i, group in zip(todo, pieces, strict=True):
            encs = [next(encodings) for _ in group]
            cut = [len(p) < len(t) for p, t in zip(group, texts[i], strict=True)]
            keep = _keep(tok, model, first + i, encs, cut, truncate, left)
            if keep is None:  # a cut text did not settle: a longer piece of it next time
                bounds[i] = [b * GROWTH if c else b for b, c in zip(bounds[i], cut, strict=True)]
                again.append(i)
            else:
                kept[i] = [_slice(e.ids, k, left) for e, k in zip(encs, keep, strict=True)]
        todo = again
    return _assemble(model, kept)


def _keep(
    tok: ModelTokenizer, model: _Model, index: int, encs: list[Encoding], cut: list[bool],
    truncate: bool, left: bool,
) -> list[int] | None:  # fmt: skip
    """Tokens kept of each text of input ``index``; None when a cut text must be tokenized
    longer; InvalidInput when it is over the limit and not to be truncated."""
    template = model.pair if len(encs) == 2 else model.single
    room = tok.model.max_input_tokens - sum(1 for token, _ in template if token >= 0)
    lengths = [len(e.ids) for e in encs]
    if sum(lengths) > room and not truncate:  # a cut text only has more tokens
        total = None if any(cut) else sum(lengths) + len(template) - len(encs)
        raise InvalidInput(over_limit_message(index, tok.model, total), param="input")
    keep = list(longest_first(*lengths, room)) if len(encs) == 2 else [min(lengths[0], room)]
    if not any(cut):
        return keep
    if len(encs) == 2 and not _split_stable(lengths, cut, room):
        return None
    settled = all(_settled(e, k, left) for e, k, c in zip(encs, keep, cut, strict=True) if c)
    return keep if settled else None


def _slice(ids: list[int], kept: int, left: bool) -> list[int]:
    return ids[len(ids) - kept :] if left else ids[:kept]


def _assemble(
    model: _Model, kept: list[list[list[int]]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The texts' kept tokens put into the model's template (its special tokens around them),
    and where each input's type-1 tokens begin."""
    ids: list[int] = []
    lengths = np.empty(len(kept), dtype=np.int32)
    starts = np.zeros(len(kept), dtype=np.int32)
    for i, parts in enumerate(kept):
        begin = len(ids)
        for token, kind in model.pair if len(parts) == 2 else model.single:
            if kind == 1 and not starts[i]:
                starts[i] = len(ids) - begin
            if token >= 0:
                ids.append(token)
            else:
                ids.extend(parts[-1 - token])
        lengths[i] = len(ids) - begin
    return np.asarray(ids, dtype=np.int32), lengths, starts


async def encode_pooled(
    pool: TokenizerPool, tok: ModelTokenizer, inputs: list[ScoreInput], truncate: bool,
    left: bool, priority: Lane,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """:func:`encode_inputs` as the client tokenizes texts: a short live request inline, the
    rest in chunks on the tokenizer threads at ``priority`` (live work first)."""
    # Lengths, never the pairs joined (one 1 MB query repeated for 2048 texts is 2 GB): each
    # text counts up to its cut, as chunks() counts single texts.
    cut = tok.cut_chars
    sizes = [
        min(len(x), cut) if isinstance(x, str) else min(len(x[0]), cut) + min(len(x[1]), cut)
        for x in inputs
    ]
    if priority == Lane.INTERACTIVE and sum(sizes) <= INLINE_MAX_CHARS:
        return encode_inputs(tok, inputs, truncate, left)
    jobs = [
        pool.run(priority, encode_inputs, tok, inputs[a:b], truncate, left, a)
        for a, b in chunk_sizes(sizes)
    ]
    try:
        parts = await asyncio.gather(*jobs)
    except BaseException:
        for job in jobs:
            job.cancel()
        raise
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]
