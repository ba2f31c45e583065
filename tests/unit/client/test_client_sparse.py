"""The front door's checks of a sparse request: every weight by default, top_k's bound (the
vocabulary), the answer's size bound, the threshold, no dimensions, and the model's task named
when a route does not fit it."""

from __future__ import annotations

import dataclasses
import re

import pytest

from mesh.client.request import check_task, output_options
from mesh.config import MAX_SPARSE_PAIRS
from mesh.errors import InvalidInput, TooLarge
from proto_msgs import ModelInfo, limits

VOCAB = 30522


def _model(task: str) -> ModelInfo:
    return ModelInfo("m", [], 30522, 128, 30522, "splade", False, "0" * 64, task=task)


def test_sparse_options_keep_every_weight_by_default_and_never_normalize() -> None:
    out = output_options(_model("sparse"), None, True, "sparse")
    assert (out.kind, out.top_k, out.threshold, out.normalize) == ("sparse", VOCAB, 0, False)
    out = output_options(_model("sparse"), None, True, "sparse", VOCAB, 0.25)
    assert (out.top_k, out.threshold) == (VOCAB, 0.25)
    out.check("options")  # the wire carries a whole vocabulary's row


def test_an_answer_that_could_be_over_the_bound_is_413_saying_what_to_do() -> None:
    most = MAX_SPARSE_PAIRS // VOCAB
    assert output_options(_model("sparse"), None, True, "sparse", n=most).top_k == VOCAB
    with pytest.raises(TooLarge) as exc:
        output_options(_model("sparse"), None, True, "sparse", n=most + 1)
    assert exc.value.param == "inputs"
    assert f"send at most {most} inputs" in str(exc.value) and "'top_k'" in str(exc.value)
    # With top_k the same request fits; a top_k too wide for it is refused naming top_k.
    assert output_options(_model("sparse"), None, True, "sparse", 64, n=most + 1).top_k == 64
    with pytest.raises(TooLarge) as exc:
        output_options(_model("sparse"), None, True, "sparse", VOCAB, n=most + 1)
    assert exc.value.param == "top_k"


def test_a_vocabulary_wider_than_a_row_needs_top_k() -> None:
    wide = limits.MAX_SPARSE_TOP_K + 1
    model = ModelInfo("m", [], wide, 128, wide, "splade", False, "0" * 64, task="sparse")
    with pytest.raises(InvalidInput) as exc:
        output_options(model, None, True, "sparse")
    assert exc.value.param == "top_k" and "set 'top_k'" in str(exc.value)
    assert output_options(model, None, True, "sparse", 100).top_k == 100


@pytest.mark.parametrize(
    ("dims", "top_k", "threshold", "param"),
    [
        (None, 0, 0.0, "top_k"),
        (None, VOCAB + 1, 0.0, "top_k"),
        (None, True, 0.0, "top_k"),
        (None, None, -0.5, "threshold"),
        (None, None, float("nan"), "threshold"),
        (8, None, 0.0, "dimensions"),
    ],
)
def test_sparse_options_out_of_bounds_are_invalid_input(dims, top_k, threshold, param) -> None:
    with pytest.raises(InvalidInput) as exc:
        output_options(_model("sparse"), dims, True, "sparse", top_k, threshold)
    assert exc.value.param == param


@pytest.mark.parametrize(
    ("task", "asked", "says"),
    [
        ("sparse", "embed", "is a sparse (SPLADE) model"),
        ("sparse", "score", "is a sparse (SPLADE) model"),
        ("embed", "sparse", "is a dense embedding model: it has no sparse weights"),
        ("score", "sparse", "is a cross-encoder: it has no sparse weights"),
    ],
)
def test_a_route_the_model_does_not_serve_names_what_it_does(task, asked, says) -> None:
    with pytest.raises(InvalidInput, match=re.escape(says)):
        check_task(_model(task), asked)


def test_a_lexical_embedder_serves_embeddings_and_sparse_weights_but_no_scores() -> None:
    m3 = dataclasses.replace(_model("embed"), lexical=True)
    check_task(m3, "embed")
    check_task(m3, "sparse")
    with pytest.raises(InvalidInput, match="is an embedding model: it has no scores"):
        check_task(m3, "score")
