"""``segment_b_start``, the one optional array on the wire: it round-trips, a message without
it sends no frame and decodes as None (so a peer of the previous release still decodes what
holds no pair), and a split outside its sequence is refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from proto_msgs import BatchAssign, OutputOptions, ProtocolError, SubmitRequest
from proto_msgs.codec import decode, encode


def _submit(starts: np.ndarray | None) -> SubmitRequest:
    return SubmitRequest(
        cid=1,
        model="m",
        lane=0,
        timeout_ms=None,
        output=OutputOptions(normalize=False),
        token_ids=np.arange(1, 10, dtype=np.int32),
        offsets=np.array([0, 4, 9], dtype=np.int32),
        segment_b_start=starts,
    )


def test_pairs_round_trip_and_their_absence_sends_no_frame() -> None:
    msg = _submit(np.array([2, 0], dtype=np.int32))
    frames = encode(msg)
    back = decode(frames)
    assert back.segment_b_start.tolist() == [2, 0]
    plain = encode(_submit(None))
    assert len(plain) == len(frames) - 1
    assert decode(plain).segment_b_start is None


def test_batch_assign_carries_them_too() -> None:
    batch = BatchAssign(
        batch_id=3,
        model="m",
        timeout_ms=100,
        outputs=[OutputOptions()],
        output_index=np.zeros(2, dtype=np.int32),
        token_ids=np.arange(1, 10, dtype=np.int32),
        offsets=np.array([0, 4, 9], dtype=np.int32),
        segment_b_start=np.array([0, 3], dtype=np.int32),
    )
    assert decode(encode(batch)).segment_b_start.tolist() == [0, 3]


@pytest.mark.parametrize(
    "starts",
    [
        np.array([4, 0], dtype=np.int32),  # at its sequence's end: no second text
        np.array([-1, 0], dtype=np.int32),
        np.array([1], dtype=np.int32),  # not one per sequence
        np.array([1, 0], dtype=np.float32),
    ],
)
def test_a_split_outside_its_sequence_is_refused(starts: np.ndarray) -> None:
    frames = encode(dataclasses.replace(_submit(None), segment_b_start=starts))
    with pytest.raises(ProtocolError):
        decode(frames)
