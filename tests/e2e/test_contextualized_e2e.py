"""Perplexity's ``/v1/contextualizedembeddings`` on a real mesh: its shapes, every
``encoding_format``, its limits as 4xx, and late chunking itself: each chunk's vector is the
mean of its tokens' states in the whole document (transformers' hidden states, fp32), which
differs from embedding the chunk alone."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from tests.e2e.conftest import AUTH, MODEL, Ingress, Reference, cosines
from tests.e2e.test_tei_e2e import call

ROUTE = "/v1/contextualizedembeddings"
DOCS = [
    [
        "The Eiffel Tower was finished in 1889.",
        "It was the tallest structure in the world for decades.",
        "Today it draws millions of visitors.",
    ],
    ["Mitochondria make most of a cell's energy.", "They carry their own DNA."],
    ["One lonely chunk."],
]


def late_chunking_reference(reference: Reference, documents: list[list[str]]) -> list[np.ndarray]:
    """Per document ``[chunks, 384]``: [CLS] + each chunk's tokens + [SEP] through transformers
    at once, the mean of each chunk's last hidden states, L2-normalized (MiniLM's Normalize)."""
    tokenizer = reference.model.tokenizer
    bert = reference.model[0].auto_model
    out = []
    for doc in documents:
        pieces = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in doc]
        ids = [tokenizer.cls_token_id] + [t for p in pieces for t in p] + [tokenizer.sep_token_id]
        with torch.no_grad():
            hidden = bert(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
        bounds = np.cumsum([0] + [len(p) for p in pieces]) + 1
        rows = torch.stack(
            [hidden[a:b].mean(0) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        )
        out.append(torch.nn.functional.normalize(rows, dim=1).numpy())
    return out


def post(ing: Ingress, body: dict) -> tuple[int, dict]:
    status, _, doc = call(ing, ROUTE, body, AUTH)
    return status, doc  # type: ignore[return-value]


def vectors(doc: dict, decode=None) -> list[np.ndarray]:  # noqa: ANN001
    return [
        np.array([decode(e["embedding"]) if decode else e["embedding"] for e in d["data"]])
        for d in doc["data"]
    ]


def test_shapes_and_values_equal_late_chunking_on_transformers(
    ingress: Ingress, reference: Reference
) -> None:
    status, doc = post(ingress, {"model": MODEL, "input": DOCS, "encoding_format": "float"})
    assert status == 200, doc
    assert doc["object"] == "list" and doc["model"] == MODEL
    assert [d["object"] for d in doc["data"]] == ["list"] * 3
    assert [d["index"] for d in doc["data"]] == [0, 1, 2]
    for d, chunks in zip(doc["data"], DOCS, strict=True):
        assert [e["index"] for e in d["data"]] == list(range(len(chunks)))
        assert {e["object"] for e in d["data"]} == {"embedding"}
    usage = doc["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0
    got = vectors(doc)
    expected = late_chunking_reference(reference, DOCS)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        assert cosines(g, e).min() >= 0.99999
        np.testing.assert_allclose(g, e, atol=5e-5)
    # A chunk embedded inside its document knows the document: not the chunk alone.
    alone = reference.embed(DOCS[0])
    assert cosines(got[0], alone).max() < 0.99


def test_every_encoding_format_and_dimensions(ingress: Ingress) -> None:
    body = {"model": MODEL, "input": DOCS[:2], "dimensions": 64}
    _, floats_doc = post(ingress, {**body, "encoding_format": "float"})
    floats = vectors(floats_doc)
    assert floats[0].shape == (3, 64)
    status, doc = post(ingress, {**body, "encoding_format": "base64"})
    assert status == 200
    as_f32 = vectors(doc, lambda s: np.frombuffer(base64.b64decode(s), "<f4"))
    np.testing.assert_array_equal(as_f32[0], floats[0].astype(np.float32))
    status, doc = post(ingress, body)  # Perplexity's default: base64_int8
    assert status == 200
    as_i8 = vectors(doc, lambda s: np.frombuffer(base64.b64decode(s), np.int8))
    assert (
        as_i8[1].shape == (2, 64) and cosines(as_i8[1].astype(np.float32), floats[1]).min() > 0.99
    )
    status, doc = post(ingress, {**body, "encoding_format": "base64_binary"})
    assert status == 200
    bits = vectors(
        doc,
        lambda s: np.unpackbits(np.frombuffer(base64.b64decode(s), np.uint8), bitorder="little"),
    )
    np.testing.assert_array_equal(bits[0][:, :64], (floats[0] > 0).astype(np.uint8))


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"input": [["a"]] * 513}, 413, "at most 512 documents"),
        ({"input": [["a"] * 8001, ["b"] * 8000]}, 413, "at most 16000 chunks"),
        ({"input": [["word " * 300]]}, 422, "the limit of a document"),
        ({"input": [["word " * 200]] * 600 + [["x"]]}, 413, "documents"),
        ({"input": [[" ".join(["word"] * 250)]] * 490}, 413, "over 120000 tokens"),
        ({"input": [[]]}, 422, "no chunk"),
        ({"input": [["fine", ""]]}, 422, "input[0][1] tokenizes to nothing"),
        ({"input": ["not", "nested"]}, 422, "list of documents"),
        ({"input": [["x"]], "encoding_format": "int4"}, 422, "encoding_format"),
        ({"input": [["x"]], "dimensions": 999}, 422, "dimensions"),
    ],
)
def test_limits_and_bad_bodies_are_clear_4xx(
    ingress: Ingress, body: dict, status: int, words: str
) -> None:
    got, doc = post(ingress, {"model": MODEL, **body})
    assert got == status, doc
    assert words in doc["error"]["message"]
    assert doc["error"]["type"] == "invalid_request_error"
