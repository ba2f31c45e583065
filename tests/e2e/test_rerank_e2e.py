"""Cross-encoders served by a real broker and workers, through HTTP: TEI's ``/rerank`` (sorted,
equal to ``CrossEncoder.predict``, raw logits), ``/predict`` (labels, softmax of a classifier
without a configured activation), ``/v1/rerank`` and ``/v2/rerank`` (``top_n``,
``return_documents``, usage), ``/info``'s model type, and the errors: scores from an embedder,
embeddings from a cross-encoder, a classifier on a rerank route, bad bodies, over-long pairs.

The re-ranker's worker has a small batch budget, so a request of many pairs is cut across
batches by the broker and each pair keeps its token types (the scores prove it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from mesh.client import MeshClient
from tests.e2e.conftest import in_process_ingress
from tests.integration.conftest import TEST_LIVENESS, Mesh
from tests.st_models import MAX_TOKENS, build_cross_encoder, build_st_model, build_tiny_bert

RERANKER, CLASSIFIER, EMBEDDER = "tiny-ce", "tiny-cls", "tiny-st"
HEADER = "X-Embedmesh-Model"
QUERY = "where do cross encoders help"
DOCS = [
    f"passage {i}: " + " ".join(["cross", "encoders", "rank", "search", "results", "well"][: i % 6])
    + (" bananas" * (i % 4))
    for i in range(24)
]  # fmt: skip


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ce-models")
    ce = build_cross_encoder(root / RERANKER, num_labels=1)
    build_cross_encoder(root / "cls", num_labels=3, seed=11)
    bert = build_tiny_bert(root / "bert")
    # The classifier as transformers saved it (no CrossEncoder config): TEI's softmax applies.
    return {
        RERANKER: ce,
        CLASSIFIER: root / "cls-hf",
        EMBEDDER: build_st_model(bert, root / EMBEDDER),
    }


@pytest.fixture(scope="module")
def ce_mesh(dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    mesh = Mesh(tmp_path_factory.mktemp("ce-mesh"))
    mesh.start_broker()
    # 24 pairs of ~20 tokens in batches of at most 160 tokens: the request spans batches.
    mesh.start_worker("--model", str(dirs[RERANKER]), "--served-name", RERANKER,
                      "--max-batch-tokens", "160")  # fmt: skip
    mesh.start_worker("--model", str(dirs[CLASSIFIER]), "--served-name", CLASSIFIER)
    mesh.start_worker("--model", str(dirs[EMBEDDER]), "--served-name", EMBEDDER)
    yield mesh
    mesh.stop()


@pytest.fixture
async def url(ce_mesh: Mesh) -> AsyncIterator[str]:
    async with in_process_ingress(ce_mesh, models=(RERANKER, CLASSIFIER, EMBEDDER), wait_s=90) as (
        url,
        _,
    ):
        yield url


async def _post(url: str, path: str, body: object, model: str | None = None):  # noqa: ANN202
    headers = {HEADER: model} if model else {}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}{path}", json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json(), resp.headers


def _cross_encoder(path: Path):  # noqa: ANN202
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(path), device="cpu", max_length=MAX_TOKENS)


async def test_rerank_is_sorted_and_equals_cross_encoder_predict(
    url: str, dirs: dict[str, Path]
) -> None:
    import torch

    body = {"query": QUERY, "texts": DOCS, "return_text": True}
    status, ranks, headers = await _post(url, "/rerank", body, RERANKER)
    assert status == 200, ranks
    ce = _cross_encoder(dirs[RERANKER])
    ref = ce.predict([(QUERY, d) for d in DOCS])
    scores = [r["score"] for r in ranks]
    assert scores == sorted(scores, reverse=True)
    assert sorted(r["index"] for r in ranks) == list(range(len(DOCS)))
    for r in ranks:
        assert r["text"] == DOCS[r["index"]]
        assert r["score"] == pytest.approx(float(ref[r["index"]]), abs=2e-5)
    for name in ("x-compute-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert name in headers
    status, raw, _ = await _post(url, "/rerank", {**body, "raw_scores": True}, RERANKER)
    logits = ce.predict([(QUERY, d) for d in DOCS], activation_fn=torch.nn.Identity())
    assert status == 200 and "text" in raw[0]
    for r in raw:
        assert r["score"] == pytest.approx(float(logits[r["index"]]), abs=2e-5)


async def test_predict_answers_every_label_sorted_for_texts_and_pairs(
    url: str, dirs: dict[str, Path]
) -> None:
    import torch
    import transformers

    hf = transformers.AutoModelForSequenceClassification.from_pretrained(dirs[CLASSIFIER])
    tok = transformers.AutoTokenizer.from_pretrained(dirs[CLASSIFIER])
    labels = [hf.config.id2label[i] for i in range(3)]

    def expected(x: str | list[str]) -> np.ndarray:
        enc = tok(*x, return_tensors="pt") if isinstance(x, list) else tok(x, return_tensors="pt")
        with torch.no_grad():
            return torch.softmax(hf(**enc).logits[0], -1).numpy()

    pair = [QUERY, DOCS[3]]
    for inputs in ("a single text", pair):
        status, preds, _ = await _post(url, "/predict", {"inputs": inputs}, CLASSIFIER)
        assert status == 200, preds
        assert [p["score"] for p in preds] == sorted((p["score"] for p in preds), reverse=True)
        ref = expected(inputs)
        assert {p["label"]: p["score"] for p in preds} == pytest.approx(
            dict(zip(labels, ref.tolist(), strict=True)), abs=2e-5
        )
    status, batch, _ = await _post(url, "/predict", {"inputs": ["one", pair, "three"]}, CLASSIFIER)
    assert status == 200 and len(batch) == 3 and all(len(p) == 3 for p in batch)
    assert batch[1][0]["score"] == pytest.approx(float(expected(pair).max()), abs=2e-5)
    # A re-ranker on /predict: one label, its sigmoid.
    status, one, _ = await _post(url, "/predict", {"inputs": pair}, RERANKER)
    assert status == 200 and [p["label"] for p in one] == ["LABEL_0"]


async def test_v1_rerank_top_n_documents_and_usage(url: str, dirs: dict[str, Path]) -> None:
    ref = _cross_encoder(dirs[RERANKER]).predict([(QUERY, d) for d in DOCS])
    best = np.argsort(-ref, kind="stable")[:5].tolist()
    docs = [{"text": d} if i % 2 else d for i, d in enumerate(DOCS)]  # both shapes
    body = {"model": RERANKER, "query": QUERY, "documents": docs, "top_n": 5}
    status, doc, _ = await _post(url, "/v1/rerank", body)
    assert status == 200, doc
    assert doc["model"] == RERANKER and doc["id"].startswith("rerank-")
    assert doc["usage"]["total_tokens"] > len(DOCS) * 5
    assert [r["index"] for r in doc["results"]] == best
    for r in doc["results"]:
        assert r["document"] == {"text": DOCS[r["index"]]}
        assert r["relevance_score"] == pytest.approx(float(ref[r["index"]]), abs=2e-5)
    body = {**body, "return_documents": False, "top_n": 100}
    status, bare, _ = await _post(url, "/v2/rerank", body)
    assert status == 200 and len(bare["results"]) == len(DOCS)
    assert all("document" not in r for r in bare["results"])


async def test_info_reports_reranker_and_classifier(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for name, kind, n in ((RERANKER, "reranker", 1), (CLASSIFIER, "classifier", 3)):
            async with http.get(f"{url}/info", headers={HEADER: name}) as resp:
                info = await resp.json()
            assert list(info["model_type"]) == [kind]
            assert len(info["model_type"][kind]["id2label"]) == n


@pytest.mark.parametrize(
    ("path", "body", "model", "status", "says"),
    [
        ("/rerank", {"query": "q", "texts": ["a"]}, EMBEDDER, 422, "is an embedding model"),
        ("/predict", {"inputs": "a"}, EMBEDDER, 422, "is an embedding model"),
        ("/embed", {"inputs": "a"}, RERANKER, 422, "is a cross-encoder"),
        ("/rerank", {"query": "q", "texts": ["a"]}, CLASSIFIER, 422, "not a re-ranker"),
        ("/rerank", {"query": "q", "texts": []}, RERANKER, 400, "cannot be empty"),
        ("/rerank", {"query": "q", "texts": ["long " * 300]}, RERANKER, 422, "more than 128"),
        ("/predict", {"inputs": 3}, CLASSIFIER, 422, "must be a string"),
    ],
)
async def test_tei_route_errors_in_tei_shape(
    url: str, path: str, body: dict, model: str, status: int, says: str
) -> None:
    got, doc, _ = await _post(url, path, body, model)
    assert got == status, doc
    assert says in doc["error"] and doc["error_type"] in ("Validation", "Empty")


async def test_truncate_cuts_an_over_long_pair(url: str) -> None:
    body = {"query": QUERY, "texts": ["long " * 300], "truncate": True}
    status, ranks, _ = await _post(url, "/rerank", body, RERANKER)
    assert status == 200 and len(ranks) == 1


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v1/embeddings", {"model": RERANKER, "input": "a"}, 422, "is a cross-encoder"),
        ("/v1/rerank", {"model": EMBEDDER, "query": "q", "documents": ["a"]}, 422, "embedding"),
        ("/v1/rerank", {"model": RERANKER, "query": "q", "documents": ["a"], "top_n": 0}, 422,
         "top_n"),
        ("/v1/rerank", {"model": RERANKER, "query": "q", "documents": [{"t": 1}]}, 422,
         "documents"),
        ("/v1/rerank", {"model": "nope", "query": "q", "documents": ["a"]}, 404, "nope"),
    ],
)  # fmt: skip
async def test_openai_shaped_errors(
    url: str, path: str, body: dict, status: int, says: str
) -> None:
    got, doc, _ = await _post(url, path, body)
    assert got == status, doc
    assert says in doc["error"]["message"]


async def test_mesh_client_scores_equal_cross_encoder_predict(
    ce_mesh: Mesh, dirs: dict[str, Path]
) -> None:
    async with MeshClient([ce_mesh.frontend], liveness=TEST_LIVENESS) as client:
        await client.wait_ready(60, RERANKER)
        pairs = [(QUERY, d) for d in DOCS[:5]]
        scores = await client.score(pairs, RERANKER)
        assert scores.shape == (5, 1) and scores.dtype == np.float32
        ref = _cross_encoder(dirs[RERANKER]).predict(pairs)
        np.testing.assert_allclose(scores[:, 0], ref, atol=2e-5)
        logits = await client.score(["one text", *pairs[:1]], CLASSIFIER, raw=True)
        assert logits.shape == (2, 3)
