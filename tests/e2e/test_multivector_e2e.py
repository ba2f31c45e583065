"""bge-m3-style colbert vectors served by a real broker and worker, through HTTP:
``/embed_multivector`` equals FlagEmbedding's formula on transformers' fp32 hidden states
(every token after the first, normalized), base64 included; ``/embed_all`` still answers raw
hidden states for the same model; ``/info`` states the width; a model without the head is
refused."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.conftest import in_process_ingress
from tests.integration.conftest import Mesh
from tests.st_models import build_m3_colbert, build_tiny_bert

M3, PLAIN = "tiny-m3", "tiny-plain"
HEADER = "X-Embedmesh-Model"
TEXTS = ["late interaction over tokens", "Grüße aus München!", "a"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("multivector-models")
    return {M3: build_m3_colbert(root / M3), PLAIN: build_tiny_bert(root / PLAIN)}


@pytest.fixture(scope="module")
def mv_mesh(dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    mesh = Mesh(tmp_path_factory.mktemp("multivector-mesh"))
    mesh.start_broker()
    # Batches of at most 16 tokens: a request of several texts is cut across batches.
    mesh.start_worker("--model", str(dirs[M3]), "--served-name", M3, "--max-batch-tokens", "16")
    mesh.start_worker("--model", str(dirs[PLAIN]), "--served-name", PLAIN)
    yield mesh
    mesh.stop()


@pytest.fixture
async def url(mv_mesh: Mesh) -> AsyncIterator[str]:
    async with in_process_ingress(mv_mesh, models=(M3, PLAIN), wait_s=90) as (url, _):
        yield url


async def _call(url: str, method: str, path: str, body: object, model: str):  # noqa: ANN202
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{url}{path}", json=body, headers={HEADER: model}) as resp,
    ):
        return resp.status, await resp.json()


def _hidden(model_dir: Path, text: str) -> torch.Tensor:
    import transformers
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()  # the shipped MiniLM tokenizer.json pads to 128
    model = transformers.XLMRobertaModel.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return model(torch.tensor([tok.encode(text).ids])).last_hidden_state[0]


def _colbert(model_dir: Path, hidden: torch.Tensor) -> np.ndarray:
    head = load_file(str(model_dir / "colbert_linear.safetensors"))
    vecs = hidden[1:] @ head["weight"].T + head["bias"]
    return torch.nn.functional.normalize(vecs, dim=-1).numpy()


async def test_colbert_vectors_equal_the_formula_and_embed_all_stays_raw(
    url: str, dirs: dict[str, Path]
) -> None:
    status, doc = await _call(url, "POST", "/embed_multivector", {"inputs": TEXTS}, M3)
    assert status == 200, doc
    for got, text in zip(doc, TEXTS, strict=True):
        hidden = _hidden(dirs[M3], text)
        expected = _colbert(dirs[M3], hidden)
        assert np.array(got).shape == expected.shape  # every token after <s>
        np.testing.assert_allclose(np.array(got, np.float32), expected, atol=1e-5)
    # bge-m3 encodes queries and documents alike: input_type changes nothing.
    status, queries = await _call(url, "POST", "/embed_multivector",
                                  {"inputs": TEXTS, "input_type": "query"}, M3)  # fmt: skip
    assert status == 200 and queries == doc, queries
    body = {"inputs": TEXTS[1], "encoding_format": "base64"}
    status, doc = await _call(url, "POST", "/embed_multivector", body, M3)
    assert status == 200, doc
    decoded = np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in doc[0]])
    np.testing.assert_allclose(decoded, _colbert(dirs[M3], _hidden(dirs[M3], TEXTS[1])), atol=1e-5)
    status, doc = await _call(url, "POST", "/embed_all", {"inputs": TEXTS[0]}, M3)
    assert status == 200, doc
    np.testing.assert_allclose(np.array(doc[0], np.float32), _hidden(dirs[M3], TEXTS[0]).numpy(),
                               atol=5e-5, rtol=1e-4)  # fmt: skip


async def test_info_states_the_width_and_a_model_without_the_head_is_refused(url: str) -> None:
    status, info = await _call(url, "GET", "/info", None, M3)
    assert status == 200 and info["multivector_dims"] == 32 and info["late_interaction"] is None
    status, info = await _call(url, "GET", "/info", None, PLAIN)
    assert status == 200 and info["multivector_dims"] == 0
    status, doc = await _call(url, "POST", "/embed_multivector", {"inputs": "x"}, PLAIN)
    assert status == 422 and "no multi-vector head" in doc["error"], doc


async def test_the_head_vectors_take_normalize_true_and_refuse_what_they_cannot_do(
    url: str,
) -> None:
    # Its vectors are unit length: normalize true asks nothing else; false and a Matryoshka
    # width would, and are refused rather than ignored.
    status, doc = await _call(
        url, "POST", "/embed_multivector", {"inputs": "x", "normalize": True}, M3
    )
    assert status == 200, doc
    for name, value in (("normalize", False), ("dimensions", 8)):
        body = {"inputs": "x", name: value}
        status, doc = await _call(url, "POST", "/embed_multivector", body, M3)
        assert status == 422 and f"'{name}' does not apply to /embed_multivector" in doc["error"]
