"""A worker's card is checked on arrival: the ingress relies on what it says."""

from __future__ import annotations

import dataclasses

import pytest

from proto_msgs import LateInteraction, ModelInfo, ProtocolError, WorkerReady, decode, encode

CARD = ModelInfo(
    name="m", aliases=[], dims=2, max_input_tokens=16, vocab_size=100, pooling="cls",
    normalize=False, tokenizer_digest="d", task="score", labels=["no", "yes"],
    activation="softmax",
)  # fmt: skip


def _ready(card: ModelInfo) -> WorkerReady:
    return WorkerReady("w", card, b"{}", 64, 8, 2, 1000, "cpu")


def test_a_sound_card_decodes():
    assert decode(encode(_ready(CARD))).model == CARD


@pytest.mark.parametrize(
    "change",
    [
        {"task": "translate"},
        {"labels": ["only one"]},  # /predict would index past it: a 500 for every request
        {"activation": "bogus"},  # every score request would fail
        {"prompts": {"q": "query: "}, "default_prompt_name": "passage"},
        {"dims": 0},
        {"max_input_tokens": 0},
        {"lexical": True},  # a scorer's: lexical weights are an embedder's
    ],
)
def test_a_card_the_ingress_could_not_use_is_refused_on_arrival(change):
    with pytest.raises(ProtocolError):
        decode(encode(_ready(dataclasses.replace(CARD, **change))))


def test_a_sparse_card_may_be_as_wide_as_its_vocabulary():
    sparse = dataclasses.replace(
        CARD, task="sparse", dims=250_002, vocab_size=250_002, labels=[], activation=""
    )
    assert decode(encode(_ready(sparse))).model.dims == 250_002


def test_a_lexical_embedder_card_decodes():
    m3 = dataclasses.replace(CARD, task="embed", labels=[], activation="", lexical=True)
    assert decode(encode(_ready(m3))).model.lexical


COLBERT = dataclasses.replace(
    CARD, task="embed", labels=[], activation="", dims=32, multivector_dims=16,
    late_interaction=LateInteraction(1, 2, 12, 16, expansion=99, skiplist=[5, 6]),
)  # fmt: skip


def test_a_colbert_card_travels_whole():
    assert decode(encode(_ready(COLBERT))).model == COLBERT


@pytest.mark.parametrize(
    "change",
    [
        {"multivector_dims": 0},  # the ingress would ask for vectors of no head
        {"late_interaction": LateInteraction(1, 2, 12, 17, expansion=99)},  # over the limit
        {"late_interaction": LateInteraction(1, 100, 12, 16)},  # a marker outside the vocab
        {"late_interaction": LateInteraction(1, 2, 12, 16, skiplist=[-1])},
    ],
)
def test_a_colbert_card_the_ingress_could_not_lay_out_is_refused(change):
    with pytest.raises(ProtocolError):
        decode(encode(_ready(dataclasses.replace(COLBERT, **change))))
