"""The official ``openai`` client, unchanged, against ``mesh-launch --role ingress``: results
equal sentence-transformers'."""

from __future__ import annotations

import base64

import aiohttp
import numpy as np
import openai
import pytest

from tests.e2e.conftest import ALIAS, API_KEY, AUTH, MODEL, Ingress, Reference, cosines


@pytest.fixture
def oai(ingress: Ingress) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{ingress.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def vectors(response: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([d.embedding for d in response.data], dtype=np.float32)


def test_default_base64_results_match_sentence_transformers(
    reference: Reference, oai: openai.OpenAI, texts: list[str]
) -> None:
    response = oai.embeddings.create(model=ALIAS, input=texts)  # the client asks for base64
    got = vectors(response)
    assert got.shape == (len(texts), 384)
    assert cosines(got, reference.embed(texts)).min() >= 0.9999
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    assert response.model == MODEL
    tokens = sum(len(ids) for ids in reference.token_ids(texts))
    assert response.usage.prompt_tokens == response.usage.total_tokens == tokens


def test_float_results_match_sentence_transformers(
    reference: Reference, oai: openai.OpenAI, texts: list[str]
) -> None:
    response = oai.embeddings.create(model=MODEL, input=texts[:20], encoding_format="float")
    assert cosines(vectors(response), reference.embed(texts[:20])).min() >= 0.9999


def test_a_single_string_gets_one_embedding(reference: Reference, oai: openai.OpenAI) -> None:
    text = "How do I undo the last commit?"
    response = oai.embeddings.create(model=MODEL, input=text, user="someone")
    assert len(response.data) == 1
    assert cosines(vectors(response), reference.embed([text]))[0] >= 0.9999


@pytest.mark.parametrize("dims", [1, 64, 128, 383])
def test_dimensions_are_the_renormalized_matryoshka_prefix(
    reference: Reference, oai: openai.OpenAI, texts: list[str], dims: int
) -> None:
    response = oai.embeddings.create(model=MODEL, input=texts[:12], dimensions=dims)
    got = vectors(response)
    assert got.shape == (12, dims)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    want = reference.embed(texts[:12])[:, :dims]
    if dims == 1:
        assert np.array_equal(np.sign(got), np.sign(want))
    else:
        assert cosines(got, want).min() >= 0.9999


def test_token_id_input_embeds_like_the_text(
    reference: Reference, oai: openai.OpenAI, texts: list[str]
) -> None:
    sample = texts[:10]
    ids = reference.token_ids(sample)
    many = oai.embeddings.create(model=MODEL, input=ids)
    assert cosines(vectors(many), reference.embed(sample)).min() >= 0.9999
    one = oai.embeddings.create(model=MODEL, input=ids[3])
    assert len(one.data) == 1 and one.usage.prompt_tokens == len(ids[3])
    assert cosines(vectors(one), reference.embed([sample[3]]))[0] >= 0.9999


def test_a_request_of_256_inputs_answers_each_in_order(
    reference: Reference, oai: openai.OpenAI, corpus: list[dict]
) -> None:
    queries = [r["text"] for r in corpus if r["kind"] == "query"]
    # Mostly queries, some short passages: every size, few tokens (the CI machine has 2 cores).
    passages = [r["text"] for r in corpus if r["kind"] == "passage" and len(r["text"]) < 500]
    batch = queries[1:500:2][:226] + passages[:30]
    assert len(batch) == 256
    got = vectors(oai.embeddings.create(model=ALIAS, input=batch))
    assert got.shape == (256, 384)
    assert cosines(got, reference.embed(batch)).min() >= 0.9999


async def test_int8_and_binary_encodings_agree_with_float(
    ingress: Ingress, texts: list[str]
) -> None:
    sample = texts[:16]
    out = {}
    async with aiohttp.ClientSession(headers=AUTH) as http:
        for fmt in ("float", "base64_int8", "base64_binary"):
            body = {"model": MODEL, "input": sample, "encoding_format": fmt, "dimensions": 100}
            async with http.post(f"{ingress.url}/v1/embeddings", json=body) as resp:
                assert resp.status == 200
                out[fmt] = [d["embedding"] for d in (await resp.json())["data"]]
    floats = np.array(out["float"], dtype=np.float32)
    q = np.stack([np.frombuffer(base64.b64decode(s), dtype=np.int8) for s in out["base64_int8"]])
    assert q.shape == (16, 100) and np.abs(q).max(axis=1).tolist() == [127] * 16
    assert cosines(q.astype(np.float32), floats).min() >= 0.999
    raw = [np.frombuffer(base64.b64decode(s), dtype=np.uint8) for s in out["base64_binary"]]
    assert {len(r) for r in raw} == {13}  # ceil(100 / 8)
    bits = np.stack([np.unpackbits(r, bitorder="little")[:100] for r in raw]).astype(bool)
    # Same worker math for every format; allow a flip only for a component at ~0.
    assert (bits != (floats > 0)).sum() <= 2


def test_models_list_through_the_openai_client(oai: openai.OpenAI) -> None:
    models = oai.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert oai.models.retrieve(ALIAS).id == MODEL


def test_a_wrong_api_key_is_an_authentication_error(ingress: Ingress) -> None:
    bad = openai.OpenAI(base_url=f"{ingress.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.embeddings.create(model=MODEL, input="hello")
    assert info.value.status_code == 401
    assert info.value.body["code"] == "invalid_api_key"  # type: ignore[index]
