"""The word memo (mesh/client/word_memo.py) gives exactly the tokenizer's ids and overflow: on
the corpus, on ASCII built to trip it, on random ASCII, at and past the limit and the cut;
texts it cannot prove go the tokenizer's way; tokenizers it does not know, or that disagree
with it on the probe texts, turn it off; pool threads never use it (it holds the GIL)."""

from __future__ import annotations

import functools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mesh.client.word_memo as word_memo
from mesh.client.tokenize import ModelTokenizer
from mesh.errors import InvalidInput
from tests.unit.client.test_ascii_shortcut import (
    CASED_JSON,
    CORPUS,
    MINILM_JSON,
    TRICKY,
    info,
    reference,
    with_added_token,
    with_normalizer,
)


def ours(tokenizer_json: str = MINILM_JSON, limit: int = 256) -> ModelTokenizer:
    return ModelTokenizer(tokenizer_json.encode(), info(limit))


cached = functools.cache(ours)  # hypothesis calls often; the memo is shared, as in a process
cached_reference = functools.cache(reference)


def want(tokenizer_json: str, texts: list[str], limit: int) -> list[tuple[list[int], bool]]:
    ref = cached_reference(tokenizer_json, limit)
    return [(e.ids, bool(e.overflowing)) for e in ref.encode_batch(texts)]


def got(tok: ModelTokenizer, texts: list[str]) -> list[tuple[list[int], bool]]:
    id_lists, over = tok._ids(texts, use_memo=True)
    return list(zip(id_lists, over, strict=True))


@pytest.fixture(scope="module")
def minilm() -> ModelTokenizer:
    tok = ours()
    assert tok._memo.on
    return tok


def test_the_corpus_gets_the_tokenizers_ids_and_most_of_it_from_the_memo(minilm) -> None:
    texts = [json.loads(line)["text"] for line in CORPUS.read_text().splitlines()]
    served = sum(minilm._memo.ids(t) is not None for t in texts)
    assert served >= 0.8 * len(texts)  # the ASCII ones (the rest have accents, CJK, emoji)
    for start in range(0, len(texts), 64):
        call = texts[start : start + 64]
        assert got(minilm, call) == want(MINILM_JSON, call, 256)
        ids, lengths = minilm.encode(call, truncate=True)
        full = minilm.encode_in_thread(call, truncate=True)
        assert ids.tolist() == full[0].tolist() and lengths.tolist() == full[1].tolist()


def test_tricky_ascii_and_special_tokens_text(minilm) -> None:
    texts = [*TRICKY, "a,b", "e-mail", "   lead and trail   ", "\t\t", "x" * 100, "x" * 101]
    assert got(minilm, texts) == want(MINILM_JSON, texts, 256)
    # Texts holding an added token's text go the tokenizer's way (and still agree above).
    assert minilm._memo.ids("a [SEP]b") is None and minilm._memo.ids("[CLS] x") is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(max_codepoint=127), max_size=80), max_size=8))
def test_random_ascii(texts: list[str]) -> None:
    tok = cached(limit=24)  # a low limit: overflow is common
    assert got(tok, texts) == want(MINILM_JSON, texts, 24)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["the", "Un", "##", "believ", "able", ",", " ", "\t", "[SEP]",
                                 "x" * 60, "e-mail", "'s", "\x00", "Q"]), max_size=60))  # fmt: skip
def test_random_words(parts: list[str]) -> None:
    text = "".join(parts)
    tok = cached(limit=16)
    assert got(tok, [text]) == want(MINILM_JSON, [text], 16)


def test_over_the_limit_the_ids_are_cut_and_the_first_offender_is_named(minilm) -> None:
    long = "word " * 300
    texts = ["short", long, "fine", long]
    assert got(minilm, texts) == want(MINILM_JSON, texts, 256)
    ids, lengths = minilm.encode(texts, truncate=True)
    assert lengths.tolist() == [3, 256, 3, 256]
    with pytest.raises(InvalidInput) as memo_error:
        minilm.encode(texts, truncate=False, first=10)
    with pytest.raises(InvalidInput) as full_error:
        minilm.encode_in_thread(texts, truncate=False, first=10)
    assert "input[11]" in str(memo_error.value) and str(memo_error.value) == str(full_error.value)


def test_past_the_cut(minilm) -> None:
    cut = minilm.cut_chars
    many = "the quick brown fox " * (cut // 10)  # overflows well before the cut
    few = "x" * (cut + 50) + " y"  # one giant word over the cut: few tokens, the full way
    straddle = "w " * (cut // 2 - 2) + "[SEP]" + " tail" * 10  # a token across the cut
    texts = [many, few, straddle]
    assert got(minilm, texts) == want(MINILM_JSON, texts, 256)
    assert minilm._memo.ids(many) is not None
    assert minilm._memo.ids(few) is None and minilm._memo.ids(straddle) is None


def test_a_huge_text_costs_only_its_cut(minilm) -> None:
    huge = "the quick brown fox jumps over the lazy dog " * 200_000  # 8.8 MB
    memo = minilm._memo
    seen: list[int] = []
    real = memo._shortcut.normalized

    def spy(text: str, search: str | None = None) -> str | None:
        seen.append(len(text))
        return real(text, search)

    memo._shortcut.normalized = spy  # type: ignore[method-assign]
    try:
        ids, over = memo.ids(huge)  # type: ignore[misc]
    finally:
        del memo._shortcut.normalized
    assert over and len(ids) == 256 and seen == [minilm.cut_chars]


def test_pool_threads_do_not_use_it(minilm, monkeypatch) -> None:
    def refuse(text: str) -> None:
        raise AssertionError("the memo ran on a pool thread's path")

    monkeypatch.setattr(minilm._memo, "ids", refuse)
    ids, lengths = minilm.encode_in_thread(["hello world", "again"], truncate=True)
    assert lengths.tolist() == [4, 3]
    with pytest.raises(AssertionError):
        minilm.encode(["hello"], truncate=True)


def test_the_memo_is_bounded_and_keeps_no_giant_words(monkeypatch) -> None:
    monkeypatch.setattr(word_memo, "MAX_WORDS", 5)
    tok = ours()
    text = "alpha beta gamma delta epsilon zeta eta theta iota " + "y" * 60
    for _ in range(3):
        assert got(tok, [text]) == want(MINILM_JSON, [text], 256)
        assert len(tok._memo._memo) <= 5 + 10  # cleared when past the bound, then refilled
    assert "y" * 60 not in tok._memo._memo


def test_other_tokenizers_turn_it_off_or_agree() -> None:
    # A cased BERT keeps it (the shortcut normalizes without lower-casing); same ids.
    cased = ours(CASED_JSON)
    texts = ["MiXeD Case, and punctuation!", "UPPER lower"]
    assert cased._memo.on and got(cased, texts) == want(CASED_JSON, texts, 256)
    # Another pre-tokenizer, or a normalizer the shortcut does not know: off.
    spec = json.loads(MINILM_JSON)
    spec["pre_tokenizer"] = {"type": "Whitespace"}
    assert not ours(json.dumps(spec))._memo.on
    unknown = with_normalizer(MINILM_JSON, {"type": "Replace", "pattern": {"String": "a"},
                                            "content": "b"})  # fmt: skip
    assert not ours(unknown)._memo.on
    # An added token: texts holding it go the full way; the rest agree.
    added = with_added_token(MINILM_JSON, "foo-bar", normalized=True)
    tok = ours(added)
    texts = ["a foo-bar b", "a FOO-BAR b", "plain text"]
    assert tok._memo.on and got(tok, texts) == want(added, texts, 256)
    assert tok._memo.ids("a foo-bar b") is None


def test_a_tokenizer_that_disagrees_on_the_probes_turns_it_off(monkeypatch, caplog) -> None:
    # As if the split were wrong (punctuation kept inside words): the self-check sees it.
    monkeypatch.setattr(word_memo, "_WORDS", re.compile(r"[^\t\n\x0b\x0c\r ]+"))
    with caplog.at_level("WARNING", logger="embedmesh.client"):
        tok = ours()
    assert not tok._memo.on and "word memo off" in caplog.text
    assert tok.encode(["Hello, World!"], truncate=True)[1].tolist() == [6]


@pytest.mark.parametrize(("value", "on"), [("0", False), ("off", False), (" False ", False),
                                           ("no", False), ("1", True), ("", True)])  # fmt: skip
def test_the_environment_can_turn_it_off(monkeypatch, value: str, on: bool) -> None:
    monkeypatch.setenv("EMBEDMESH_WORD_MEMO", value)
    assert ours()._memo.on is on


def _with_added(tokenizer_json: str, special: bool, *contents: str) -> str:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    (tok.add_special_tokens if special else tok.add_tokens)(list(contents))
    return tok.to_str()


def _both_ways(tokenizer_json: str, texts: list[str], limit: int) -> None:
    tok = ours(tokenizer_json, limit)
    ref = want(tokenizer_json, texts, limit)
    assert got(tok, texts) == ref
    for way in (tok.encode, tok.encode_in_thread):
        ids, lengths = way(texts, truncate=True)
        assert ids.tolist() == [i for ids_, _ in ref for i in ids_]


@pytest.mark.parametrize("limit", [4, 256])
@pytest.mark.parametrize("spelling", ["QFOO BAR", "qfoo b\x00ar", "foo bar", "FOO BAR"])
def test_a_multi_word_added_token_across_the_cut(limit: int, spelling: str) -> None:
    """tokenizer.add_tokens(["foo bar"]) (matched on the normalized text) spelled so that the
    raw text does not show it, across the cut: the words before it stay the token's."""
    added = _with_added(MINILM_JSON, False, "foo bar")
    cut = ours(added, limit).cut_chars
    texts = []
    for shift in range(2, 9):
        head = "a " * (limit - 4) if limit > 8 else ""
        texts.append(head + " " * (cut - shift - len(head)) + spelling + " tail" * 10)
    _both_ways(added, texts, limit)


@pytest.mark.parametrize("limit", [4, 256])
def test_a_special_token_of_four_words_across_the_cut(limit: int) -> None:
    """ "</e1>" is "<", "/", "e1", ">" to the pre-tokenizer: the tokenizer's own way (the cut
    piece's settling) must leave all four to the token too, not only the last word."""
    added = _with_added(MINILM_JSON, True, "</e1>")
    cut = ours(added, limit).cut_chars
    texts = [
        "x " * p + " " * (cut - back - 2 * p) + "</e1> tail tail"
        for p in range(max(0, limit - 4), limit)
        for back in (2, 3, 4)
    ]
    _both_ways(added, texts, limit)


def test_a_unicode_form_joining_the_character_past_the_cut() -> None:
    """NFKC turns "<" + U+0338 into "≮", which is not punctuation: the character after the cut
    is looked at even for a tokenizer without added tokens."""
    spec = json.loads(MINILM_JSON)
    spec["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"},
                                                              {"type": "Lowercase"}]}  # fmt: skip
    spec["added_tokens"] = []
    tokenizer_json = json.dumps(spec)
    tok = ours(tokenizer_json, 4)
    cut = tok.cut_chars
    text = "a" + " " * (cut - 14) + "tokenization<" + "\u0338 tail tail"
    assert text[cut] == "\u0338" and tok._memo.on
    _both_ways(tokenizer_json, [text], 4)


def test_the_memo_counts_pieces_too(monkeypatch) -> None:
    monkeypatch.setattr(word_memo, "MAX_PIECES", 6)
    tok = ours()
    text = "unbelievable tokenization antidisestablishmentarianism hello"
    for _ in range(3):
        assert got(tok, [text]) == want(MINILM_JSON, [text], 256)
        assert tok._memo._stored <= 6 + 10
    # One shared int object per id: the memo's pieces are the ids list's own objects.
    pieces = tok._memo._memo.get("hello") or tok._memo._pieces("hello")
    assert all(p is tok._memo._ints[p] for p in pieces)
