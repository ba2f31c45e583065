"""The broker's idle-query path: the plan of a batch made of one slice (an idle query's)."""

from __future__ import annotations

import numpy as np
import pytest

from mesh.broker.batches import plan_batch
from mesh.broker.queue import Lane, Request, Slice
from proto_msgs import BatchAssign, OutputOptions, SubmitRequest, decode, encode


def _request(msg: SubmitRequest) -> Request:
    lengths = (msg.offsets[1:] - msg.offsets[:-1]).tolist()
    return Request(
        key=(b"i", msg.cid), model="m", lane=Lane.INTERACTIVE, lengths=lengths,
        deadline=None, submitted_at=0.0, payload=msg,
    )  # fmt: skip


@pytest.mark.parametrize("pairs", [False, True])
def test_a_one_slice_plan_carries_exactly_that_slices_sequences(pairs: bool) -> None:
    gen = np.random.default_rng(3)
    for trial in range(50):
        n = int(gen.integers(1, 9))
        lengths = gen.integers(3, 40, size=n)  # room for a pair's second segment
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        ids = gen.integers(0, 30000, size=int(offsets[-1])).astype(np.int32)
        starts = gen.integers(1, 3, size=n).astype(np.int32) if pairs else None
        msg = SubmitRequest(
            cid=trial + 1, model="m", lane=0, timeout_ms=None, output=OutputOptions(dims=8),
            token_ids=ids, offsets=offsets, segment_b_start=starts,
        )  # fmt: skip
        start = int(gen.integers(0, n))
        end = int(gen.integers(start + 1, n + 1))
        plan = plan_batch(7, "m", [Slice(_request(msg), start, end, 1)], 2.0)
        got = decode(encode(plan.message))  # what the worker receives
        assert isinstance(got, BatchAssign)
        assert got.token_ids.tolist() == ids[offsets[start] : offsets[end]].tolist()
        assert got.offsets.tolist() == (offsets[start : end + 1] - offsets[start]).tolist()
        assert got.output_index.tolist() == [0] * (end - start)
        assert got.outputs == [msg.output] and got.timeout_ms == 2000
        want_starts = None if starts is None else starts[start:end].tolist()
        assert (None if got.segment_b_start is None else got.segment_b_start.tolist()) == (
            want_starts
        )
        assert (plan.groups, plan.rows, plan.counts) == ([0], [0], [end - start])
