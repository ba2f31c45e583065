"""Tokenizer work of TEI's routes, on the model's tokenizer that the client already holds:
``/tokenize``'s token objects, ``/decode``, and truncation from the left.

The client's tokenizer truncates from the right at the model's limit and is shared by its
threads, so it is never reconfigured: each model gets two copies made once, ``plain`` (no
truncation: TEI's ``/tokenize`` and ``/decode`` do not truncate) and ``left`` (TEI's
``truncation_direction: "Left"``). Work on many characters runs on a thread (``encode_batch``
and ``decode_batch`` release the GIL); a short request runs inline, where the hop would cost more.

Left truncation is exact: a text is cut before tokenizing to its last ``cut_chars`` characters
(the client's bound for the right), tokenized with truncation from the left, and kept when the
piece overflowed and the kept tokens start at least two words after the piece's first word
(the one the cut may have split); otherwise the bound grows fourfold and the piece is tokenized
again, up to the whole text. The result equals tokenizing the whole text with left truncation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from tokenizers import Encoding, Tokenizer

from mesh.client.tokenize import GROWTH, INLINE_MAX_CHARS, ModelTokenizer

T = TypeVar("T")


class TeiTokenizers:
    """The ``plain`` and ``left`` copies of each model's tokenizer, made on first use."""

    def __init__(self) -> None:
        self._copies: dict[tuple[str, int, str], Tokenizer] = {}

    def plain(self, tok: ModelTokenizer) -> Tokenizer:
        return self._copy(tok, "plain")

    def left(self, tok: ModelTokenizer) -> Tokenizer:
        return self._copy(tok, "left")

    def _copy(self, tok: ModelTokenizer, kind: str) -> Tokenizer:
        key = (tok.model.tokenizer_digest, tok.model.max_input_tokens, kind)
        copy = self._copies.get(key)
        if copy is None:
            copy = Tokenizer.from_str(tok.tokenizer.to_str())
            copy.no_padding()
            if kind == "left":
                copy.enable_truncation(tok.model.max_input_tokens, direction="left")
            else:
                copy.no_truncation()
            self._copies[key] = copy
        return copy


async def off_loop(chars: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` inline when it is about ``chars`` characters of work or less than
    ``INLINE_MAX_CHARS``, else on a thread so the event loop stays free."""
    if chars <= INLINE_MAX_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def token_objects(
    tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool
) -> list[list[dict[str, object]]]:
    """TEI's ``SimpleToken`` lists: ``{id, text, special, start, stop}``, where ``start`` and
    ``stop`` are **byte** offsets into the UTF-8 input (as TEI's Rust tokenizer reports them)
    and ``text`` is that slice of the input; special tokens have their own text and null
    offsets."""
    encodings = tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
    return [_tokens(enc, text) for enc, text in zip(encodings, texts, strict=True)]


def _tokens(enc: Encoding, text: str) -> list[dict[str, object]]:
    to_bytes = _byte_offsets(text)
    out: list[dict[str, object]] = []
    for token_id, (start, stop), special, token in zip(
        enc.ids, enc.offsets, enc.special_tokens_mask, enc.tokens, strict=True
    ):
        if special:
            out.append({"id": token_id, "text": token, "special": True, "start": None,
                        "stop": None})  # fmt: skip
        else:
            byte_start = start if to_bytes is None else int(to_bytes[start])
            byte_stop = stop if to_bytes is None else int(to_bytes[stop])
            out.append({"id": token_id, "text": text[start:stop], "special": False,
                        "start": byte_start, "stop": byte_stop})  # fmt: skip
    return out


def _byte_offsets(text: str) -> np.ndarray | None:
    """The UTF-8 byte offset of each character position (n + 1 entries); None for ASCII,
    where they are the same."""
    if text.isascii():
        return None
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    sizes = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
    offsets = np.zeros(len(points) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def decode(tokenizer: Tokenizer, seqs: list[list[int]], skip_special_tokens: bool) -> list[str]:
    """Texts of ``seqs``; ids outside the vocabulary are skipped, as TEI's tokenizer does."""
    return tokenizer.decode_batch(seqs, skip_special_tokens=skip_special_tokens)


def encode_left(
    tokenizer: Tokenizer, texts: list[str], cut_chars: int
) -> tuple[np.ndarray, np.ndarray]:
    """Ids (concatenated) and offsets (n + 1) of ``texts`` truncated from the left by
    ``tokenizer`` (a ``left`` copy), tokenizing a bounded suffix of each (module docstring)."""
    out: list[list[int]] = [[] for _ in texts]
    bounds = [cut_chars] * len(texts)
    todo = list(range(len(texts)))
    while todo:
        pieces = [texts[i][-bounds[i] :] for i in todo]
        again = []
        for i, piece, enc in zip(todo, pieces, tokenizer.encode_batch(pieces), strict=True):
            if len(piece) == len(texts[i]) or _settled_left(enc):
                out[i] = enc.ids
            else:
                bounds[i] *= GROWTH
                again.append(i)
        todo = again
    lengths = np.fromiter(map(len, out), dtype=np.int64, count=len(out))
    offsets = np.zeros(len(out) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.fromiter((t for seq in out for t in seq), dtype=np.int64, count=int(offsets[-1]))
    return ids, offsets


def _settled_left(enc: Encoding) -> bool:
    """Whether a suffix piece's left-truncated encoding is the whole text's: it overflowed and
    its first kept token belongs to the piece's third word or later (word 0 may be split by the
    cut; word 1 guards a pre-tokenizer that looks one character back)."""
    if not enc.overflowing:
        return False
    first = next((w for w in enc.word_ids if w is not None), None)
    return first is not None and first >= 2


def keep_last(ids: np.ndarray, offsets: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Token id sequences truncated from the left: the last ``limit`` ids of each."""
    lengths = np.diff(offsets)
    kept = np.minimum(lengths, limit)
    new_offsets = np.zeros(len(offsets), dtype=np.int64)
    np.cumsum(kept, out=new_offsets[1:])
    seq_of = np.repeat(np.arange(len(kept)), kept)
    pos = np.arange(int(new_offsets[-1])) - new_offsets[:-1][seq_of]
    # Each kept id: its sequence's end minus how many it keeps, plus its position.
    return ids[offsets[1:][seq_of] - kept[seq_of] + pos], new_offsets
