"""TEI's ``/embed_all`` on a real mesh: per input, every token's last hidden state equal to
transformers' (fp32), special tokens included; base64 as our extension; the size cap stated in
``/info`` and a 413 beyond it, in TEI's error shape."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from mesh.client.spans import MAX_TOKEN_VECTOR_VALUES
from tests.e2e.conftest import AUTH, Ingress, Reference
from tests.e2e.test_tei_e2e import call

TEXTS = ["How do I undo the last commit?", "Grüße aus München!", "a"]


def hidden_states(reference: Reference, text: str) -> np.ndarray:
    ids = reference.token_ids([text])[0]
    with torch.no_grad():
        out = reference.model[0].auto_model(input_ids=torch.tensor([ids])).last_hidden_state
    return out[0].float().numpy()


def test_every_tokens_vector_equals_transformers_hidden_states(
    ingress: Ingress, reference: Reference
) -> None:
    status, _, doc = call(ingress, "/embed_all", {"inputs": TEXTS}, AUTH)
    assert status == 200, doc
    assert len(doc) == len(TEXTS)
    for got, text in zip(doc, TEXTS, strict=True):
        expected = hidden_states(reference, text)
        got = np.array(got, dtype=np.float32)
        assert got.shape == expected.shape  # [tokens incl. [CLS]/[SEP], 384]
        np.testing.assert_allclose(got, expected, atol=5e-5, rtol=1e-4)
    status, headers, doc = call(
        ingress, "/embed_all", {"inputs": TEXTS[0], "encoding_format": "base64"}, AUTH
    )
    assert status == 200 and "x-compute-tokens" in {k.lower() for k in headers}
    decoded = np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in doc[0]])
    np.testing.assert_allclose(decoded, hidden_states(reference, TEXTS[0]), atol=5e-5, rtol=1e-4)


def test_the_cap_is_in_info_and_a_request_over_it_is_413(ingress: Ingress) -> None:
    status, _, info = call(ingress, "/info", None, AUTH)
    assert status == 200 and info["max_embed_all_values"] == MAX_TOKEN_VECTOR_VALUES
    tokens = MAX_TOKEN_VECTOR_VALUES // 384 + 1
    ids = [[101] + [2000] * 254 + [102]] * (tokens // 256 + 1)
    status, _, doc = call(ingress, "/embed_all", {"inputs": ids}, AUTH)
    assert status == 413, doc
    assert doc["error_type"] == "Validation" and "over the limit" in doc["error"]
    status, _, doc = call(ingress, "/embed_all", {"inputs": "x", "encoding_format": "int8"}, AUTH)
    assert status == 422 and "encoding_format" in doc["error"]


@pytest.mark.parametrize("option", [{"normalize": True}, {"dimensions": 8}])
def test_pooled_options_are_refused_not_ignored(ingress: Ingress, option: dict) -> None:
    # These shape a pooled embedding; /embed_all's token states are raw, so a body asking
    # for them gets told, instead of an answer that silently did something else.
    status, _, doc = call(ingress, "/embed_all", {"inputs": "x", **option}, AUTH)
    name = next(iter(option))
    assert status == 422 and f"'{name}' does not apply to /embed_all" in doc["error"], doc


@pytest.mark.parametrize("option", [{"normalize": False}, {"dimensions": None}])
def test_options_that_ask_nothing_else_are_accepted(ingress: Ingress, option: dict) -> None:
    # normalize false is what /embed_all does anyway; null is absent, as /embed reads it.
    status, _, doc = call(ingress, "/embed_all", {"inputs": "x", **option}, AUTH)
    assert status == 200 and len(doc) == 1, doc
