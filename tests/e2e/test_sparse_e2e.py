"""A sparse (SPLADE) model served by a real broker and worker, through HTTP: TEI's
``/embed_sparse`` equals ``SparseEncoder.encode`` (every non-zero weight, sorted by index, as
TEI), ``top_k`` and ``threshold`` bound the answer, token-id input, ``/info``'s model type, and
the errors: dense routes to the sparse model, ``/embed_sparse`` to a dense model, bad bounds,
an answer that could be over the size bound.

The sparse worker has a small batch budget, so a request of many texts is cut across batches."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from mesh.config import MAX_SPARSE_PAIRS
from tests.e2e.conftest import in_process_ingress
from tests.integration.conftest import Mesh
from tests.st_models import build_splade, build_st_model, build_tiny_bert

SPARSE, DENSE = "tiny-splade", "tiny-dense"
HEADER = "X-Embedmesh-Model"
TEXTS = [
    f"document {i}: " + " ".join(["sparse", "lexical", "retrieval", "expansion", "terms"][: i % 5])
    + " inverted index" * (i % 3)
    for i in range(20)
]  # fmt: skip


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sparse-models")
    bert = build_tiny_bert(root / "bert")
    return {SPARSE: build_splade(root / SPARSE), DENSE: build_st_model(bert, root / DENSE)}


@pytest.fixture(scope="module")
def sparse_mesh(dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    mesh = Mesh(tmp_path_factory.mktemp("sparse-mesh"))
    mesh.start_broker()
    # 20 texts of ~10 tokens in batches of at most 64 tokens: the request spans batches.
    mesh.start_worker("--model", str(dirs[SPARSE]), "--served-name", SPARSE,
                      "--max-batch-tokens", "64")  # fmt: skip
    mesh.start_worker("--model", str(dirs[DENSE]), "--served-name", DENSE)
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def reference(dirs: dict[str, Path]) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(dirs[SPARSE]), device="cpu")
    return model.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()


@pytest.fixture
async def url(sparse_mesh: Mesh) -> AsyncIterator[str]:
    async with in_process_ingress(sparse_mesh, models=(SPARSE, DENSE), wait_s=90) as (url, _):
        yield url


async def _post(url: str, path: str, body: object, model: str | None = None):  # noqa: ANN202
    headers = {HEADER: model} if model else {}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}{path}", json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


def _check_top(pairs: list[dict], ref: np.ndarray, k: int, threshold: float = 0.0) -> None:
    """``pairs`` are ``ref``'s k largest weights over ``threshold``, sorted by index."""
    index = [p["index"] for p in pairs]
    assert index == sorted(set(index))
    values = np.array([p["value"] for p in pairs], dtype=np.float32)
    np.testing.assert_allclose(values, ref[index], rtol=1e-4, atol=1e-6)
    top = np.sort(ref[ref > threshold])[::-1][:k]
    assert len(pairs) == len(top)
    np.testing.assert_allclose(np.sort(values)[::-1], top, rtol=1e-4, atol=1e-6)


async def test_embed_sparse_equals_sparse_encoder_every_weight(
    url: str, reference: np.ndarray
) -> None:
    status, body = await _post(url, "/embed_sparse", {"inputs": TEXTS}, SPARSE)
    assert status == 200, body
    assert len(body) == len(TEXTS)
    for pairs, ref in zip(body, reference, strict=True):
        _check_top(pairs, ref, ref.shape[0])  # every non-zero weight, as TEI
        assert len(pairs) == int((ref > 0).sum())
    # One string: still a list of lists, as TEI answers.
    status, one = await _post(url, "/embed_sparse", {"inputs": TEXTS[3]}, SPARSE)
    assert status == 200 and len(one) == 1 and one[0] == body[3]


async def test_top_k_and_threshold_bound_each_answer(url: str, reference: np.ndarray) -> None:
    body = {"inputs": TEXTS[:4], "top_k": 5, "threshold": 0.5}
    status, answer = await _post(url, "/embed_sparse", body, SPARSE)
    assert status == 200, answer
    for pairs, ref in zip(answer, reference[:4], strict=True):
        assert len(pairs) <= 5
        _check_top(pairs, ref, 5, 0.5)


async def test_token_ids_give_what_their_text_gives(url: str, dirs: dict[str, Path]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(dirs[SPARSE] / "tokenizer.json"))
    tok.no_padding()  # the shipped MiniLM tokenizer.json pads to 128
    ids = tok.encode(TEXTS[7]).ids
    status, by_ids = await _post(url, "/embed_sparse", {"inputs": [ids], "top_k": 32}, SPARSE)
    status2, by_text = await _post(url, "/embed_sparse", {"inputs": TEXTS[7], "top_k": 32}, SPARSE)
    assert status == status2 == 200, (by_ids, by_text)
    assert by_ids == by_text


async def test_info_reports_splade_pooling(url: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/info", headers={HEADER: SPARSE}) as resp,
    ):
        info = await resp.json()
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}


@pytest.mark.parametrize(
    ("path", "body", "model", "words"),
    [
        ("/embed", {"inputs": "x"}, SPARSE, "sparse (SPLADE) model"),
        ("/v1/embeddings", {"input": "x", "model": SPARSE}, None, "sparse (SPLADE) model"),
        ("/embed_sparse", {"inputs": "x"}, DENSE, "no sparse weights"),
        ("/embed_sparse", {"inputs": "x", "top_k": 10**6}, SPARSE, "top_k"),
        ("/embed_sparse", {"inputs": "x", "top_k": 0}, SPARSE, "top_k"),
        ("/embed_sparse", {"inputs": "x", "threshold": -1}, SPARSE, "threshold"),
    ],
)
async def test_what_a_model_does_not_do_is_a_422_naming_it(
    url: str, path: str, body: dict, model: str | None, words: str
) -> None:
    status, err = await _post(url, path, body, model)
    assert status == 422, err
    message = err["error"] if path != "/v1/embeddings" else err["error"]["message"]
    assert words in message
    if path != "/v1/embeddings":
        assert err["error_type"] == "Validation"


async def test_an_answer_that_could_be_over_the_bound_is_413_naming_top_k(
    url: str, reference: np.ndarray
) -> None:
    n = MAX_SPARSE_PAIRS // reference.shape[1] + 1
    status, err = await _post(url, "/embed_sparse", {"inputs": ["x"] * n}, SPARSE)
    assert status == 413 and err["error_type"] == "Validation", err
    assert "set 'top_k'" in err["error"] and f"send at most {n - 1} inputs" in err["error"]
