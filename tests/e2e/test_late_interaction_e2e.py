"""ColBERT checkpoints (colbert-ai's and PyLate's layouts) served by a real broker and workers,
through HTTP: ``/embed_multivector`` with ``input_type`` query or document equals the
libraries' formula (tests/colbert_reference.py), queries and documents sent at once so that
batches can mix them (that a mixed batch keys each sequence its own way is asserted in
``tests/unit/engine/test_late_interaction.py``); what a ColBERT model does not take is
refused by name."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from tests.colbert_reference import colbert_reference
from tests.e2e.conftest import in_process_ingress
from tests.integration.conftest import Mesh
from tests.st_models import build_colbert_ai, build_pylate

AI, PL = "tiny-colbert-ai", "tiny-pylate"
HEADER = "X-Embedmesh-Model"
TEXTS = ["late interaction, over tokens!", "Grüße aus München", "a", "word " * 30]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colbert-models")
    return {AI: build_colbert_ai(root / AI), PL: build_pylate(root / PL)}


@pytest.fixture(scope="module")
def cb_mesh(dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    mesh = Mesh(tmp_path_factory.mktemp("colbert-mesh"))
    mesh.start_broker()
    for name, path in dirs.items():
        mesh.start_worker("--model", str(path), "--served-name", name, "--max-batch-tokens", "48")
    yield mesh
    mesh.stop()


@pytest.fixture
async def url(cb_mesh: Mesh) -> AsyncIterator[str]:
    async with in_process_ingress(cb_mesh, models=(AI, PL), wait_s=90) as (url, _):
        yield url


async def _call(url: str, body: object, model: str, path: str = "/embed_multivector"):  # noqa: ANN202
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}{path}", json=body, headers={HEADER: model}) as resp,
    ):
        return resp.status, await resp.json()


@pytest.mark.parametrize("model", [AI, PL])
async def test_queries_and_documents_equal_the_libraries_formula(
    url: str, dirs: dict[str, Path], model: str
) -> None:
    bodies = [{"inputs": [t], "input_type": kind, "truncate": True}
              for kind in ("query", "document") for t in TEXTS]  # fmt: skip
    answers = await asyncio.gather(*(_call(url, b, model) for b in bodies))
    expected = colbert_reference(dirs[model], TEXTS, True)
    expected += colbert_reference(dirs[model], TEXTS, False)
    for (status, doc), (vectors, _) in zip(answers, expected, strict=True):
        assert status == 200, doc
        got = np.array(doc[0], np.float32)
        assert got.shape == vectors.shape
        cos = (got * vectors).sum(-1) / np.linalg.norm(vectors, axis=-1)
        assert cos.min() >= 0.99999, cos


async def test_info_states_the_lengths(url: str) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/info", headers={HEADER: AI}) as r:
        info = await r.json()
    assert info["multivector_dims"] == 16
    assert info["late_interaction"] == {"query_length": 12, "document_length": 24}


async def test_base64_and_the_default_document(url: str, dirs: dict[str, Path]) -> None:
    status, doc = await _call(url, {"inputs": TEXTS[0], "encoding_format": "base64"}, PL)
    assert status == 200, doc
    decoded = np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in doc[0]])
    np.testing.assert_allclose(decoded, colbert_reference(dirs[PL], TEXTS[:1], False)[0][0],
                               atol=1e-5)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"inputs": TEXTS[3]}, "document length"),  # over 24 tokens without truncate
        ({"inputs": [[101, 7, 102]]}, "send texts"),
        ({"inputs": "x", "input_type": "passage"}, "input_type"),
        ({"inputs": "x", "truncate": True, "truncation_direction": "Left"}, "Left"),
    ],
)
async def test_what_a_colbert_model_does_not_take_is_refused(
    url: str, body: dict, match: str
) -> None:
    status, doc = await _call(url, body, AI)
    assert status in (413, 422) and match in doc["error"], doc


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/embed", {"inputs": "x"}),
        ("/embed_all", {"inputs": "x"}),
        ("/v1/embeddings", {"input": "x", "model": PL}),
        ("/v1/contextualizedembeddings", {"input": [["x"]], "model": PL}),
    ],
)
async def test_a_colbert_model_gives_no_other_vectors(url: str, path: str, body: dict) -> None:
    status, doc = await _call(url, body, PL, path)
    assert status in (400, 422) and "ColBERT model" in str(doc), doc
