"""A sentence-transformers model with prompts left out of its weighted-mean pooling
(``include_prompt: false``) and a Dense layer, served by a real broker and worker:
``/v1/embeddings`` with ``prompt_name`` (or without, for the default prompt) returns what
``SentenceTransformer.encode`` returns with that prompt, requests with other prompts sharing
batches included."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from tests.e2e.conftest import in_process_ingress
from tests.integration.conftest import Mesh
from tests.st_models import PROMPTS, DenseSpec, build_st_model, build_tiny_bert

NAME = "tiny-st"
TEXTS = ["What is the capital of France?", "a", "Paris is the capital and largest city of France."]


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("st-prompts")
    bert = build_tiny_bert(root / "bert")
    return build_st_model(
        bert, root / NAME, pooling="weightedmean", dense=[DenseSpec(24, "Tanh")],
        prompts=PROMPTS, default_prompt_name="query", include_prompt=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def st_mesh(st_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    mesh = Mesh(tmp_path_factory.mktemp("st-mesh"))
    mesh.start_broker()
    mesh.start_worker("--model", str(st_dir), "--served-name", NAME)
    yield mesh
    mesh.stop()


@pytest.fixture
async def url(st_mesh: Mesh) -> AsyncIterator[str]:
    async with in_process_ingress(st_mesh, models=(NAME,), wait_s=60) as (url, _):
        yield url


async def _embed(url: str, **extra: object) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        body = {"model": NAME, "input": TEXTS, **extra}
        async with http.post(f"{url}/v1/embeddings", json=body) as resp:
            return resp.status, await resp.json()


@pytest.mark.parametrize("prompt_name", [None, "passage", "instruct"])
async def test_embeddings_with_a_prompt_equal_sentence_transformers(
    url: str, st_dir: Path, prompt_name: str | None
) -> None:
    from sentence_transformers import SentenceTransformer

    extra = {} if prompt_name is None else {"prompt_name": prompt_name}
    status, doc = await _embed(url, **extra)
    assert status == 200, doc
    ours = np.array([d["embedding"] for d in doc["data"]], dtype=np.float32)
    # None: the model's default prompt ("query") applies, in both.
    ref = SentenceTransformer(str(st_dir), device="cpu").encode(TEXTS, prompt_name=prompt_name)
    assert ours.shape == ref.shape == (len(TEXTS), 24)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


async def test_requests_with_other_prompts_at_once_each_get_their_own(
    url: str, st_dir: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    names = ["query", "passage", "instruct"] * 3
    answers = await asyncio.gather(*(_embed(url, prompt_name=name) for name in names))
    st = SentenceTransformer(str(st_dir), device="cpu")
    refs = {name: st.encode(TEXTS, prompt_name=name) for name in set(names)}
    for name, (status, doc) in zip(names, answers, strict=True):
        assert status == 200, doc
        ours = np.array([d["embedding"] for d in doc["data"]], dtype=np.float32)
        np.testing.assert_allclose(ours, refs[name], rtol=1e-5, atol=1e-5)


async def test_an_unknown_prompt_is_422_naming_the_model_prompts(url: str) -> None:
    status, doc = await _embed(url, prompt_name="search")
    assert status == 422 and doc["error"]["param"] == "prompt_name"
    assert all(repr(name) in doc["error"]["message"] for name in PROMPTS)
