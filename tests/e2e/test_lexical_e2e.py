"""A bge-m3 look-alike (dense embedder with FlagEmbedding's sparse head) served by a real broker
and worker, through HTTP: ``/embed_sparse`` gives its lexical weights (the engine's, top_k
largest sorted by index), ``/embed`` and ``/v1/embeddings`` its dense vectors
(``SentenceTransformer``'s), both at once in mixed batches, and ``/info`` says it takes both.

The worker has a small batch budget, so concurrent dense and sparse requests share batches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from mesh.worker.engine.engine import Engine
from tests.e2e.conftest import in_process_ingress
from tests.integration.conftest import Mesh
from tests.st_models import build_m3_lexical

M3 = "tiny-m3"
HEADER = "X-Embedmesh-Model"
TEXTS = [
    f"passage {i}: " + "lexical weights of the the bge model " * (1 + i % 3) for i in range(12)
]


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_m3_lexical(tmp_path_factory.mktemp("m3-model") / M3)


@pytest.fixture(scope="module")
def m3_mesh(m3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    mesh = Mesh(tmp_path_factory.mktemp("m3-mesh"))
    mesh.start_broker()
    mesh.start_worker("--model", str(m3_dir), "--served-name", M3, "--max-batch-tokens", "128")
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def lexical(m3_dir: Path) -> np.ndarray:
    """The engine's lexical weights of TEXTS, in process (test_lexical checks them against
    FlagEmbedding's formula)."""
    engine = Engine.load(m3_dir, threads=1)
    ids = _token_ids(m3_dir, TEXTS)
    offsets = np.cumsum([0] + [len(i) for i in ids]).astype(np.int32)
    return engine.embed_lexical(np.concatenate(ids).astype(np.int32), offsets)[1].numpy()


def _token_ids(m3_dir: Path, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(m3_dir / "tokenizer.json"))
    tok.no_padding()  # the shipped MiniLM tokenizer.json pads to 128
    return [e.ids for e in tok.encode_batch(texts)]


@pytest.fixture
async def url(m3_mesh: Mesh) -> AsyncIterator[str]:
    async with in_process_ingress(m3_mesh, models=(M3,), wait_s=90) as (url, _):
        yield url


async def _post(url: str, path: str, body: object):  # noqa: ANN202
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}{path}", json=body, headers={HEADER: M3}) as resp,
    ):
        return resp.status, await resp.json()


def _check(pairs: list[dict], ref: np.ndarray, k: int) -> None:
    index = [p["index"] for p in pairs]
    assert index == sorted(set(index)) and pairs
    values = np.array([p["value"] for p in pairs], dtype=np.float32)
    np.testing.assert_allclose(values, ref[index], rtol=1e-4, atol=1e-6)
    top = np.sort(ref[ref > 0])[::-1][:k]
    np.testing.assert_allclose(np.sort(values)[::-1], top, rtol=1e-4, atol=1e-6)


async def test_embed_sparse_and_embed_served_together_by_one_model(
    url: str, m3_dir: Path, lexical: np.ndarray
) -> None:
    from sentence_transformers import SentenceTransformer

    # Concurrent: the broker may put dense and sparse requests in one batch.
    sparse, dense, openai = await asyncio.gather(
        _post(url, "/embed_sparse", {"inputs": TEXTS, "top_k": 6}),
        _post(url, "/embed", {"inputs": TEXTS}),
        _post(url, "/v1/embeddings", {"input": TEXTS[:3], "model": M3}),
    )
    assert sparse[0] == dense[0] == openai[0] == 200, (sparse, dense, openai)
    for pairs, ref in zip(sparse[1], lexical, strict=True):
        _check(pairs, ref, 6)
    reference = SentenceTransformer(str(m3_dir), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(np.array(dense[1]), reference, atol=1e-4)
    vectors = np.array([d["embedding"] for d in openai[1]["data"]])
    np.testing.assert_allclose(vectors, reference[:3], atol=1e-4)


async def test_token_ids_give_what_their_text_gives(url: str, m3_dir: Path) -> None:
    ids = _token_ids(m3_dir, [TEXTS[4]])
    status, by_ids = await _post(url, "/embed_sparse", {"inputs": ids})
    status2, by_text = await _post(url, "/embed_sparse", {"inputs": TEXTS[4]})
    assert status == status2 == 200, (by_ids, by_text)
    assert by_ids == by_text


async def test_info_says_the_embedder_also_takes_embed_sparse(url: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/info", headers={HEADER: M3}) as resp,
    ):
        info = await resp.json()
    assert info["model_type"] == {"embedding": {"pooling": "cls"}}
    assert info["embed_sparse"] is True
