"""The front door's checks of a sparse request: the server's top_k bound and default, the
threshold, no dimensions, and the model's task named when a route does not fit it."""

from __future__ import annotations

import dataclasses
import re

import pytest

from mesh.client.request import check_task, output_options
from mesh.config import SPARSE_TOP_K, SPARSE_TOP_K_MAX
from mesh.errors import InvalidInput
from proto_msgs import ModelInfo


def _model(task: str) -> ModelInfo:
    return ModelInfo("m", [], 30522, 128, 30522, "splade", False, "0" * 64, task=task)


def test_sparse_options_take_the_server_default_and_never_normalize() -> None:
    out = output_options(_model("sparse"), None, True, "sparse")
    assert (out.kind, out.top_k, out.threshold, out.normalize) == ("sparse", SPARSE_TOP_K, 0, False)
    out = output_options(_model("sparse"), None, True, "sparse", SPARSE_TOP_K_MAX, 0.25)
    assert (out.top_k, out.threshold) == (SPARSE_TOP_K_MAX, 0.25)


@pytest.mark.parametrize(
    ("dims", "top_k", "threshold", "param"),
    [
        (None, 0, 0.0, "top_k"),
        (None, SPARSE_TOP_K_MAX + 1, 0.0, "top_k"),
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
