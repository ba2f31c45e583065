"""ColBERT checkpoints (colbert-ai's HF_ColBERT, PyLate): per-token vectors equal to the
libraries' formula over transformers' BertModel in fp32, for queries (marker, [MASK]
expansion no token attends to) and documents (marker, punctuation skiplist).

The reference (tests/colbert_reference.py) is written from colbert-ai's and PyLate's
tokenization and encoding over transformers' own tokenizer and model: nothing of ours but the
ids it is compared on.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mesh.client.late_interaction import layout
from mesh.client.tokenize import ModelTokenizer
from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.late_interaction import key_lengths
from proto_msgs import ModelInfo
from tests.colbert_reference import colbert_reference
from tests.st_models import ColbertSpec, build_colbert_ai, build_pylate

TEXTS = [
    "hello, world! how are you?",
    "a much longer text that runs past the query length, with commas; and more words " * 2,
    "short",
    "...!?",
]
LAYOUTS = {"colbert-ai": build_colbert_ai, "pylate": build_pylate}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def model_dir(request, tmp_path_factory):
    return LAYOUTS[request.param](tmp_path_factory.mktemp(request.param) / "m")


def served(model_dir, texts, query, truncate=True):
    """Our ids (the ingress's layout) through the engine: per text, the vectors and ids."""
    card = read_card(model_dir)
    engine = Engine.load(model_dir, tune_allocator=False)
    info = ModelInfo(card.name, [], card.dims, card.max_input_tokens, engine.vocab_size,
                     card.pooling, False, card.tokenizer_digest, hidden_size=32,
                     multivector_dims=card.multivector.out_features,
                     late_interaction=card.colbert.tokens)  # fmt: skip
    tok = ModelTokenizer(card.tokenizer_json, info)
    ids, lengths = tok.encode(texts, truncate=True)
    ids, lengths, spans, span_offsets = layout(tok, info.late_interaction, ids, lengths,
                                               query, truncate)  # fmt: skip
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    seq = np.repeat(np.arange(len(lengths)), np.diff(span_offsets))
    absolute = spans + offsets[:-1][seq, None]
    _, rows = engine.embed_with_spans(ids, offsets, absolute)
    vectors = torch.nn.functional.normalize(engine.project_multivector(rows), dim=-1).numpy()
    return [
        (vectors[span_offsets[i] : span_offsets[i + 1]], ids[absolute[span_offsets[i] : span_offsets[i + 1], 0]])
        for i in range(len(texts))
    ]  # fmt: skip


def assert_same(ours, theirs):
    for (v, ids), (rv, rids) in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(ids, rids)
        cos = (v * rv).sum(-1) / np.linalg.norm(v, axis=-1) / np.linalg.norm(rv, axis=-1)
        assert cos.min() >= 0.99999, cos


def test_queries_are_marked_expanded_and_their_expansion_is_no_key(model_dir):
    ours = served(model_dir, TEXTS, query=True)
    assert {len(ids) for _, ids in ours} == {ColbertSpec().query_length}
    assert_same(ours, colbert_reference(model_dir, TEXTS, query=True))


def test_documents_are_marked_cut_and_lose_their_punctuation(model_dir):
    ours = served(model_dir, TEXTS, query=False)
    assert_same(ours, colbert_reference(model_dir, TEXTS, query=False))
    assert len(ours[3][1]) == 3  # "...!?": [CLS], [D], [SEP] only


def test_a_query_attending_to_its_expansion_is_computed_whole(tmp_path):
    spec = ColbertSpec(attend_to_expansion=True)
    model_dir = build_pylate(tmp_path / "m", spec)
    assert not read_card(model_dir).colbert.mask_expansion
    assert_same(served(model_dir, TEXTS, True), colbert_reference(model_dir, TEXTS, True, spec))


def test_without_expansion_a_query_keeps_its_own_length(tmp_path):
    spec = ColbertSpec(expansion=False, bias=True)
    model_dir = build_pylate(tmp_path / "m", spec)
    ours = served(model_dir, TEXTS, True)
    assert len(ours[2][1]) == 4  # [CLS] [Q] short [SEP]
    assert_same(ours, colbert_reference(model_dir, TEXTS, True, spec))


def test_a_long_document_without_truncation_is_refused(model_dir):
    from mesh.errors import InvalidInput

    with pytest.raises(InvalidInput, match="document length"):
        served(model_dir, TEXTS, query=False, truncate=False)


def test_key_lengths_leave_out_only_a_query_s_trailing_expansion():
    from proto_msgs import LateInteraction

    tokens = LateInteraction(1, 2, 6, 8, expansion=103)
    # query: CLS Q w SEP MASK MASK | document with a literal [MASK] at its end | query cut
    ids = np.array([101, 1, 7, 102, 103, 103, 101, 2, 103, 102, 101, 1, 7, 8, 9, 102])
    offsets = np.array([0, 6, 10, 16])
    np.testing.assert_array_equal(key_lengths(ids, offsets, tokens), [4, 4, 6])
    assert key_lengths(ids[6:10], offsets[1:3] - 6, tokens) is None
    assert key_lengths(ids, offsets, dataclasses.replace(tokens, expansion=-1)) is None


@pytest.mark.parametrize(
    ("file", "change", "match"),
    [
        ("artifact.metadata", {"similarity": "l2"}, "similarity"),
        ("1_Dense/config.json", {"activation_function": "torch.nn.modules.activation.Tanh"},
         "Identity"),
        ("config_sentence_transformers.json", {"query_prefix": "[nope] "}, "query_prefix"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_refused_by_name(tmp_path, file, change, match):
    import json

    model_dir = (build_colbert_ai if file == "artifact.metadata" else build_pylate)(tmp_path / "m")
    cfg = json.loads((model_dir / file).read_text())
    (model_dir / file).write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ValueError, match=match):
        read_card(model_dir)
