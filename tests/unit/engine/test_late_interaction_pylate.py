"""Our ColBERT vectors against PyLate itself, where it is installed (it pins its own
sentence-transformers, so it is not in our environment: skipped there). Checked once on
2026-12-03 with PyLate 1.6.0 and sentence-transformers 5.3.0 put on the path beside ours
(``pip install --no-deps --target``; PyLate's training and index dependencies stubbed):
both layouts, queries and documents, cos >= 0.9999999 per token."""

from __future__ import annotations

import numpy as np
import pytest

from mesh.worker.engine.engine import Engine
from tests.colbert_reference import served_vectors
from tests.st_models import build_colbert_ai, build_pylate

TEXTS = ["hello, world! how are you?", "a much longer text " * 4 + ".", "short"]


@pytest.mark.parametrize("build", [build_colbert_ai, build_pylate])
@pytest.mark.parametrize("query", [True, False])
def test_our_vectors_are_pylates(tmp_path, build, query):  # noqa: ANN001
    models = pytest.importorskip("pylate.models")
    model_dir = build(tmp_path / "m")
    theirs = models.ColBERT(str(model_dir), device="cpu").encode(
        TEXTS, is_query=query, convert_to_numpy=True
    )
    ours = served_vectors(Engine.load(model_dir, tune_allocator=False), TEXTS, [query] * 3)
    for (v, _), t in zip(ours, theirs, strict=True):
        t = np.asarray(t, np.float32)
        assert v.shape == t.shape
        cos = (v * t).sum(-1) / np.linalg.norm(v, axis=-1) / np.linalg.norm(t, axis=-1)
        assert cos.min() >= 0.99999, cos
