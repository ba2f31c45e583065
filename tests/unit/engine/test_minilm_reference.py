"""The engine's all-MiniLM-L6-v2 equals sentence-transformers on real and awkward texts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from engine_helpers import cosines, load_corpus, pack
from tokenizers import Tokenizer

from mesh.worker.engine.engine import Engine

HAND_WRITTEN = [
    "日本語の文章を埋め込みに変換します。",
    "机器学习模型可以把句子变成向量。",
    "한국어 문장도 잘 처리되어야 합니다.",
    "🎉🚀 emoji party 🤖👍🏽 with skin tones and ZWJ 👩‍👩‍👧",
    "Crème brûlée, naïve café, Ångström, Straße, Øresund, ñandú.",
    "مرحبا بالعالم، هذا نص باللغة العربية من اليمين إلى اليسار.",
    "שלום עולם, זהו טקסט בעברית.",
    "Mixed: English, Русский текст, Ελληνικά, हिन्दी, ไทย.",
    "a",
    ".",
    " ",
    "",
    "\t\n",
    "A",
    "???!!!",
    "x" * 600,
]


def _texts_at_the_limit(tokenizer: Tokenizer) -> list[str]:
    # "word" is one wordpiece: 254 of them plus [CLS] and [SEP] is exactly 256 tokens, with
    # no truncation; the passage of 2000 words is cut at 256.
    exact = " ".join(["word"] * 254)
    assert len(tokenizer.encode(exact).ids) == 256
    assert tokenizer.encode(exact + " more").overflowing  # one more would be cut
    return [exact, "the cat sat on the mat " * 400]


def _corpus_sample() -> list[str]:
    rows = load_corpus()
    # Every 9th query and every 16th passage: 112 + 94 texts spread over all sources.
    queries = [r["text"] for r in rows if r["kind"] == "query"][::9]
    passages = [r["text"] for r in rows if r["kind"] == "passage"][::16]
    return queries + passages


@pytest.fixture(scope="module")
def texts(minilm_tokenizer: Tokenizer) -> list[str]:
    return _corpus_sample() + HAND_WRITTEN + _texts_at_the_limit(minilm_tokenizer)


@pytest.fixture(scope="module")
def reference(minilm_dir: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    assert model.max_seq_length == 256
    return model.encode(texts, batch_size=32, normalize_embeddings=True)


@pytest.fixture(scope="module")
def engine(minilm_dir: Path) -> Engine:
    return Engine.load(minilm_dir)


def test_every_text_matches_sentence_transformers(
    engine: Engine, minilm_tokenizer: Tokenizer, texts: list[str], reference: np.ndarray
) -> None:
    assert len(texts) >= 220
    seqs = [e.ids for e in minilm_tokenizer.encode_batch(texts)]
    assert max(len(s) for s in seqs) == 256
    ours = np.concatenate(
        [engine.embed_final(*pack(seqs[i : i + 64])) for i in range(0, len(seqs), 64)]
    )
    assert ours.shape == reference.shape and ours.dtype == np.float32
    cos = cosines(ours, reference)
    worst = int(cos.argmin())
    assert cos.min() >= 0.9999, f"text {worst} {texts[worst][:60]!r}: cosine {cos[worst]}"
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_a_packed_batch_equals_one_text_at_a_time(
    engine: Engine, minilm_tokenizer: Tokenizer, texts: list[str]
) -> None:
    # Short and long texts interleaved, so that every sequence has neighbours of other
    # lengths on both sides in the packed tensor.
    chosen = texts[:12] + texts[112:124] + HAND_WRITTEN + texts[-2:]
    seqs = [e.ids for e in minilm_tokenizer.encode_batch(chosen)]
    order = sorted(range(len(seqs)), key=lambda i: (i % 2, len(seqs[i]) * (-1) ** i))
    packed = engine.embed(*pack([seqs[i] for i in order]))
    alone = torch.cat([engine.embed(*pack([seqs[i]])) for i in order])
    assert cosines(packed, alone).min() >= 0.99999


def test_the_card_of_the_embedded_model(engine: Engine) -> None:
    card = engine.card
    assert card.name == "all-MiniLM-L6-v2"
    assert card.aliases == ["sentence-transformers/all-MiniLM-L6-v2"]
    assert (card.dims, card.max_input_tokens, card.pooling) == (384, 256, "mean")
    assert card.normalize and not card.causal and card.family == "bert"
