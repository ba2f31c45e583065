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

from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.heads.late_interaction import key_lengths
from tests.colbert_reference import colbert_reference, served_vectors
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
    engine = Engine.load(model_dir, tune_allocator=False)
    return served_vectors(engine, texts, [query] * len(texts), truncate)


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


def test_one_batch_of_queries_and_documents_keys_each_sequence_its_own_way(model_dir):
    engine = Engine.load(model_dir, tune_allocator=False)
    roles = [True, False] * len(TEXTS)
    texts = [t for t in TEXTS for _ in range(2)]
    ours = served_vectors(engine, texts, roles)
    queries = colbert_reference(model_dir, TEXTS, query=True)
    documents = colbert_reference(model_dir, TEXTS, query=False)
    assert_same(ours, [x for pair in zip(queries, documents, strict=True) for x in pair])


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
        # A marker that is the expansion token would cut a query's keys at the marker.
        ("artifact.metadata", {"query_token_id": "[MASK]"}, "marker is the query expansion"),
        # Masked expansion tokens over a window narrower than the query: some see no key.
        ("config.json", {"local_attention": 8}, "sliding window"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_refused_by_name(tmp_path, file, change, match):
    import json

    model_dir = (build_colbert_ai if file == "artifact.metadata" else build_pylate)(tmp_path / "m")
    cfg = json.loads((model_dir / file).read_text())
    (model_dir / file).write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ValueError, match=match):
        read_card(model_dir)


def test_the_gpu_backends_key_rows_are_each_sequence_s_leading_keys():
    from mesh.worker.engine.kernels.attention import SdpaPerSequence
    from mesh.worker.engine.kernels.flashinfer_attention import kept_keys

    gen = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 5, 12, 15], dtype=torch.int32)
    keys = np.array([3, 7, 1])
    q, k, v = (torch.randn(15, 2, 8, generator=gen) for _ in range(3))
    kv_cu, rows = kept_keys(cu, keys, torch.device("cpu"))
    assert kv_cu.tolist() == [0, 3, 10, 11]
    assert rows.tolist() == [0, 1, 2, 5, 6, 7, 8, 9, 10, 11, 12]
    backend = SdpaPerSequence()
    backend.plan(cu, causal=False, keys=keys)
    got = backend.run(q, k, v)
    kk, vv = k[rows], v[rows]  # what FlashInfer and varlen read with kv offsets kv_cu
    for i in range(3):
        a, b, c, d = int(cu[i]), int(cu[i + 1]), int(kv_cu[i]), int(kv_cu[i + 1])
        ref = torch.softmax(torch.einsum("qhd,khd->hqk", q[a:b], kk[c:d]) / 8**0.5, -1)
        torch.testing.assert_close(got[a:b], torch.einsum("hqk,khd->qhd", ref, vv[c:d]))


def test_a_colbert_architecture_of_a_layout_not_served_is_refused(tmp_path):
    import json

    model_dir = build_colbert_ai(tmp_path / "m")
    (model_dir / "artifact.metadata").unlink()
    cfg = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**cfg, "architectures": ["ColBERTModel"]}))
    # Without it, it would load as a pooled embedder of the BERT under it: wrong vectors.
    with pytest.raises(ValueError, match="ColBERTModel.*layout not served"):
        read_card(model_dir)
