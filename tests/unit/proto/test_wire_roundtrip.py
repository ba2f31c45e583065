"""Every message survives encode → frames → decode, in memory and over a real zmq socket."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from wire_samples import assert_same_message, ragged, sample_messages

from proto_msgs import (
    OUTPUT_KINDS,
    REGISTRY,
    WIRE_DTYPES,
    BatchResult,
    Lane,
    OutputOptions,
    RequestResult,
    SubmitRequest,
    decode,
    encode,
)

SAMPLES = sample_messages()
CLASSES = sorted(REGISTRY.values(), key=lambda cls: cls.COMMAND)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_registered_message_round_trips_field_by_field(cls):
    instances = [m for m in SAMPLES if type(m) is cls]
    assert instances, f"add a realistic {cls.__name__} to tests/unit/proto/wire_samples.py"
    for msg in instances:
        frames = encode(msg)
        assert all(isinstance(f, bytes | np.ndarray) for f in frames)
        assert_same_message(decode(frames), msg)


def test_every_wire_dtype_is_exercised_by_the_samples():
    seen = {
        str(arr.dtype)
        for msg in SAMPLES
        for value in vars(msg).values()
        for arr in (value if isinstance(value, list) else [value])
        if isinstance(arr, np.ndarray)
    }
    assert seen >= set(WIRE_DTYPES)


def test_round_trip_accepts_bytearray_and_memoryview_frames():
    for msg in SAMPLES:
        frames = encode(msg)
        as_views = [memoryview(bytes(f)) for f in frames]
        as_bytearrays = [bytearray(bytes(f)) for f in frames]
        assert_same_message(decode(as_views), msg)
        assert_same_message(decode(tuple(as_bytearrays)), msg)


def test_big_endian_arrays_arrive_little_endian_with_the_same_values():
    vectors = np.arange(12, dtype=">f4").reshape(3, 4)
    msg = RequestResult(
        cid=1, prompt_tokens=3, indices=np.arange(3, dtype=">i4"), embeddings=vectors
    )
    got = decode(encode(msg))
    assert got.embeddings.dtype == np.dtype("<f4") and got.indices.dtype == np.dtype("<i4")
    assert np.array_equal(got.embeddings, vectors) and np.array_equal(got.indices, [0, 1, 2])


def test_encode_refuses_a_dtype_the_wire_does_not_carry():
    msg = RequestResult(
        cid=1, prompt_tokens=1, indices=np.zeros(1, np.int32), embeddings=np.zeros((1, 4))
    )
    with pytest.raises(TypeError, match="float64"):
        encode(msg)


@pytest.fixture
def pair():
    ctx = zmq.Context()
    tx, rx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    rx.bind("inproc://proto-roundtrip")
    tx.connect("inproc://proto-roundtrip")
    for sock in (tx, rx):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 2000)
    yield tx, rx
    tx.close()
    rx.close()
    ctx.term()


def test_frames_received_zero_copy_over_zmq_decode_to_the_same_message(pair):
    tx, rx = pair
    for msg in SAMPLES:
        tx.send_multipart(encode(msg), copy=False)
        frames = rx.recv_multipart(copy=False)
        assert all(isinstance(f, zmq.Frame) for f in frames)
        assert_same_message(decode(frames), msg)


def test_zero_copy_arrays_stay_valid_after_the_frames_are_dropped(pair):
    tx, rx = pair
    # Over zmq's copy threshold (64 KiB), so the payload really travels without a copy.
    vectors = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    msg = RequestResult(
        cid=9, prompt_tokens=512, indices=np.arange(512, dtype=np.int32), embeddings=vectors
    )
    tx.send_multipart(encode(msg), copy=False)
    frames = rx.recv_multipart(copy=False)
    got = decode(frames)
    del frames
    gc.collect()
    assert np.array_equal(got.embeddings, vectors)


sequences = st.lists(
    st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=20), min_size=1, max_size=20
)
options = st.builds(
    OutputOptions,
    dims=st.none() | st.integers(1, 4096),
    normalize=st.booleans(),
    kind=st.sampled_from(sorted(k for k in OUTPUT_KINDS if k != "sparse")),
) | st.builds(
    OutputOptions,
    normalize=st.just(False),
    kind=st.just("sparse"),
    top_k=st.integers(1, 4096),
    threshold=st.floats(0.0, 100.0),
)


@settings(max_examples=100, deadline=None)
@given(
    seqs=sequences,
    output=options,
    cid=st.integers(0, 2**64 - 1),
    timeout=st.none() | st.integers(1, 2**31),
)
def test_any_valid_submit_round_trips(seqs, output, cid, timeout):
    token_ids, offsets = ragged(seqs)
    msg = SubmitRequest(
        cid=cid,
        model="m",
        lane=Lane.BATCH,
        timeout_ms=timeout,
        output=output,
        token_ids=token_ids,
        offsets=offsets,
    )
    assert_same_message(decode(encode(msg)), msg)


wire_arrays = st.sampled_from(sorted(WIRE_DTYPES)).flatmap(
    lambda name: hnp.arrays(WIRE_DTYPES[name], hnp.array_shapes(min_dims=2, max_dims=2, min_side=0))
)


@settings(max_examples=100, deadline=None)
@given(arrays=st.lists(wire_arrays, max_size=5), compute_ms=st.floats(0, 1e6))
def test_any_batch_result_round_trips(arrays, compute_ms):
    msg = BatchResult(batch_id=1, compute_ms=compute_ms, embeddings=arrays)
    got = decode(encode(msg))
    assert got.compute_ms == compute_ms
    assert len(got.embeddings) == len(arrays)
    for g, a in zip(got.embeddings, arrays, strict=True):
        assert g.dtype == a.dtype and g.shape == a.shape
        assert g.tobytes() == a.tobytes()  # bit-exact, NaN payloads included
