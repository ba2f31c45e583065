"""The broker refuses a request for colbert vectors that a model's workers would fail on: no
multi-vector head, or dims past the head's width; two workers of one name agree on the head."""

from __future__ import annotations

import dataclasses

import numpy as np

from mesh.broker.trust import card_differences
from proto_msgs import Lane, ModelInfo, OutputOptions, SubmitRequest
from proto_msgs.checks import submit_problem

M3 = ModelInfo("m3", [], 64, 128, 1000, "cls", True, "d", hidden_size=64, multivector_dims=48)


def _submit(dims: int | None = None) -> SubmitRequest:
    return SubmitRequest(
        cid=1, model="m3", lane=Lane.INTERACTIVE, timeout_ms=None,
        output=OutputOptions(dims=dims, rows="multivector"),
        token_ids=np.array([5, 6, 7], np.int32), offsets=np.array([0, 3], np.int32),
        spans=np.array([[1, 2], [2, 3]], np.int32), span_offsets=np.array([0, 2], np.int32),
    )  # fmt: skip


def test_colbert_rows_need_the_head_and_dims_within_its_width() -> None:
    lengths = np.array([3])

    def problem(msg: SubmitRequest, model: ModelInfo = M3) -> str:
        found = submit_problem(model, msg, lengths)
        return "" if found is None else found.message

    assert submit_problem(M3, _submit(), lengths) is None
    assert submit_problem(M3, _submit(48), lengths) is None
    assert "48 per token" in problem(_submit(49))
    plain = dataclasses.replace(M3, multivector_dims=0)
    assert "no multi-vector head" in problem(_submit(), plain)
    assert card_differences(M3, plain) == ["multivector_dims"]
