"""TEI's routes on a real mesh, through ``mesh-launch --role ingress``: ``huggingface_hub``'s
``InferenceClient`` unchanged, and raw HTTP for the rest of TEI's surface."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import huggingface_hub.constants
import numpy as np
import pytest
from huggingface_hub import InferenceClient

from tests.e2e.conftest import ALIAS, API_KEY, AUTH, MAX_TOKENS, MODEL, Ingress, Reference, cosines

TIMING = ["x-compute-time", "x-total-time", "x-tokenization-time", "x-queue-time",
          "x-inference-time", "x-compute-tokens", "x-compute-characters"]  # fmt: skip
LONG = " ".join(f"word{i % 50} and more" for i in range(400))  # ~1600 tokens


def call(
    ing: Ingress, path: str, body: object = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], object]:
    """(status, headers, JSON body) of one request; GET when ``body`` is None."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{ing.url}{path}", data=data, headers={"Content-Type": "application/json",
                                                **(headers or {})},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def embed(ing: Ingress, body: dict, path: str = "/embed") -> np.ndarray:
    status, _, doc = call(ing, path, body, AUTH)
    assert status == 200, doc
    return np.array(doc, dtype=np.float32)


def test_inference_client_feature_extraction_equals_v1_embeddings(
    ingress: Ingress, reference: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HF_HUB_OFFLINE (the tests' setting, for the reference model) blocks every request of
    # huggingface_hub's session, ours on loopback too: lift it for this client only.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    text = "How do I undo the last commit?"
    client = InferenceClient(base_url=ingress.url, api_key=API_KEY, timeout=60)
    got = client.feature_extraction(text)
    assert got.shape == (1, 384)
    status, _, doc = call(ingress, "/v1/embeddings", {"model": MODEL, "input": text}, AUTH)
    assert status == 200
    openai_vector = np.array([doc["data"][0]["embedding"]], dtype=np.float32)
    assert cosines(got, openai_vector)[0] >= 0.9999
    assert cosines(got, reference.embed([text]))[0] >= 0.9999
    # Its options travel as TEI's fields.
    assert client.feature_extraction(text, dimensions=32).shape == (1, 32)


def test_embed_a_list_matches_sentence_transformers(
    ingress: Ingress, reference: Reference, texts: list[str]
) -> None:
    got = embed(ingress, {"inputs": texts[:16]})
    assert got.shape == (16, 384)
    assert cosines(got, reference.embed(texts[:16])).min() >= 0.9999
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)


def test_normalize_false_and_dimensions(ingress: Ingress, texts: list[str]) -> None:
    normalized = embed(ingress, {"inputs": texts[:4]})
    raw = embed(ingress, {"inputs": texts[:4], "normalize": False})
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-2)
    assert cosines(raw, normalized).min() >= 0.9999
    short = embed(ingress, {"inputs": texts[:4], "dimensions": 64})
    assert short.shape == (4, 64)
    assert np.allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-4)


def test_token_id_inputs_equal_text_inputs(ingress: Ingress, reference: Reference) -> None:
    text = "Grüße aus München"
    ids = reference.token_ids([text])[0]
    assert cosines(embed(ingress, {"inputs": ids}), embed(ingress, {"inputs": text}))[0] >= 0.9999


def test_truncate_true_vs_false_on_a_long_text(
    ingress: Ingress, strict_ingress: Ingress, reference: Reference
) -> None:
    status, _, doc = call(ingress, "/embed", {"inputs": LONG}, AUTH)
    assert status == 422 and doc["error_type"] == "Validation", doc
    assert f"{MAX_TOKENS} tokens" in doc["error"]
    right = embed(ingress, {"inputs": LONG, "truncate": True})
    assert cosines(right, reference.embed([LONG]))[0] >= 0.9999  # it truncates on the right
    left = embed(ingress, {"inputs": LONG, "truncate": True, "truncation_direction": "Left"})
    ids = reference.token_ids([LONG])[0]
    kept = [ids[0], *ids[-(MAX_TOKENS - 1) :]]  # [CLS] + the last tokens, [SEP] among them
    assert cosines(left, embed(ingress, {"inputs": kept}))[0] >= 0.9999
    # Without "truncate", the server's --auto-truncate decides, as in TEI.
    assert embed(strict_ingress, {"inputs": LONG}).shape == (1, 384)


def test_tokenize_offsets_are_slices_of_the_text(ingress: Ingress, reference: Reference) -> None:
    texts = ["Hello, world!", "Grüße aus 東京 🚀"]
    status, _, tokens = call(ingress, "/tokenize", {"inputs": texts}, AUTH)
    assert status == 200 and len(tokens) == 2
    for text, seq, ids in zip(texts, tokens, reference.token_ids(texts), strict=True):
        assert [t["id"] for t in seq] == ids
        assert seq[0]["special"] and seq[0]["start"] is None and seq[-1]["text"] == "[SEP]"
        raw = text.encode()
        for token in seq[1:-1]:
            assert raw[token["start"] : token["stop"]].decode() == token["text"]
    status, _, bare = call(ingress, "/tokenize", {"inputs": texts[0],
                                                  "add_special_tokens": False}, AUTH)  # fmt: skip
    assert [t["id"] for t in bare[0]] == reference.token_ids(texts[:1])[0][1:-1]


def test_decode_round_trips_tokenize(ingress: Ingress, reference: Reference) -> None:
    texts = ["the quick brown fox", "jumps over the lazy dog"]
    ids = reference.token_ids(texts)
    assert call(ingress, "/decode", {"ids": ids}, AUTH)[2] == texts
    assert call(ingress, "/decode", {"ids": ids[0], "skip_special_tokens": False}, AUTH)[2] == [
        "[CLS] the quick brown fox [SEP]"
    ]


def test_info_describes_the_model(ingress: Ingress) -> None:
    status, _, info = call(ingress, "/info", headers=AUTH)
    assert status == 200
    assert info["model_id"] == ALIAS and info["served_model_name"] == MODEL
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == MAX_TOKENS and info["max_client_batch_size"] == 2048
    assert isinstance(info["max_batch_tokens"], int) and isinstance(info["version"], str)
    assert info["model_dtype"] == "float32"  # the CPU worker's default, from its card
    assert call(ingress, "/info")[0] == 401  # guarded like TEI's, when a key is set


def test_errors_have_teis_shape_and_statuses(strict_ingress: Ingress) -> None:
    status, _, doc = call(strict_ingress, "/embed", {"inputs": ["a"] * 9})
    assert (status, doc) == (413, {"error": "batch size 9 > maximum allowed batch size 8",
                                   "error_type": "Validation"})  # fmt: skip
    status, _, doc = call(strict_ingress, "/", {"inputs": []})
    assert status == 400 and doc["error_type"] == "Empty"
    status, _, doc = call(strict_ingress, "/", {"inputs": "a", "prompt_name": "query"})
    assert status == 422 and "unknown prompt_name 'query'" in doc["error"]  # it has none
    status, _, doc = call(strict_ingress, "/", {"inputs": [10**6]})
    assert status == 422 and "vocabulary" in doc["error"]


def test_an_unknown_model_in_the_header_is_a_clear_422(ingress: Ingress) -> None:
    status, _, doc = call(ingress, "/", {"inputs": "a"}, {**AUTH, "X-Embedmesh-Model": "nope"})
    assert status == 422 and doc["error_type"] == "Validation"
    assert "'nope' is not served" in doc["error"] and "X-Embedmesh-Model" in doc["error"]
    status, _, _ = call(ingress, "/", {"inputs": "a"}, {**AUTH, "X-Embedmesh-Model": ALIAS})
    assert status == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [("/embed", {"inputs": ["a b", "c"]}), ("/v1/embeddings", {"model": MODEL, "input": "a"})],
)
def test_timing_headers_are_whole_milliseconds(ingress: Ingress, path: str, body: dict) -> None:
    status, headers, _ = call(ingress, path, body, AUTH)
    assert status == 200
    lower = {k.lower(): v for k, v in headers.items()}
    values = {name: int(lower[name]) for name in TIMING}
    assert values["x-compute-tokens"] >= 3 and values["x-compute-characters"] >= 1
    assert values["x-total-time"] == values["x-compute-time"]
    assert values["x-total-time"] >= values["x-inference-time"]
