"""Anything at all thrown at ``decode`` gives a message or ``ProtocolError``: no other exception,
no hang, no allocation out of proportion to the frames received."""

from __future__ import annotations

import dataclasses
import math
import re
import struct
import time
import tracemalloc
import typing
from collections.abc import Callable

import msgpack
import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from wire_samples import assert_same_message, sample_messages

from proto_msgs import MAGIC, REGISTRY, VERSION, WIRE_DTYPES, ProtocolError, decode, encode

SAMPLES = sample_messages()
HEADER = struct.Struct("<2sBB")
FIELDS = sorted({f.name for cls in REGISTRY.values() for f in dataclasses.fields(cls)})
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Sizes where integer handling tends to break: around 2**31, 2**32, 2**63, 2**64.
EDGE_INTS = [-(2**63), -1, 0, 1, 255, 2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
ints = st.sampled_from(EDGE_INTS) | st.integers(-(2**63), 2**64 - 1)
scalars = (
    st.none() | st.booleans() | ints | st.floats() | st.text(max_size=16) | st.binary(max_size=16)
)
keys = st.sampled_from([*FIELDS, "_a"]) | st.text(max_size=8)
msgpack_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
shapes = st.lists(ints, max_size=4) | ints | st.none()
descriptors = (
    st.tuples(
        st.sampled_from(FIELDS) | st.text(max_size=4),
        st.sampled_from([*WIRE_DTYPES, "bytes", "float64", "<f4", ""]) | msgpack_values,
        shapes,
    ).map(list)
    | msgpack_values
)
headers = st.builds(
    HEADER.pack, st.just(MAGIC), st.just(VERSION), st.sampled_from(sorted(REGISTRY))
)


def decodes_safely(frames: list) -> None:
    """The property every test here checks, for one frame list."""
    received = sum(len(f) for f in frames if isinstance(f, bytes | bytearray))
    # Traced only around decode: tracing hypothesis itself would make the suite crawl.
    tracemalloc.start()
    start = time.thread_time()  # CPU time: a busy CI machine must not fail the test
    try:
        msg = decode(frames)
    except ProtocolError as exc:
        assert exc.cid is None or type(exc.cid) is int, exc.cid
        # Shown by --hypothesis-show-statistics: which checks the fuzzing reaches.
        event(re.sub(r"\d+|'[^']*'|\[.*\]", "N", exc.reason.split(":")[-1])[:48])
        msg = None
    finally:
        elapsed = time.thread_time() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < 2.0, f"decode took {elapsed:.1f} s"
    # Decoding may copy what it received a few times (blobs, validation), never more.
    assert peak < 4 * received + (1 << 20), f"decode allocated {peak} bytes for {received}"
    if msg is not None:  # whatever decode accepts must survive a round trip unchanged
        event("accepted")
        assert_same_message(decode(encode(msg)), msg)


@FUZZ
@given(frames=st.lists(st.binary(max_size=64), max_size=6))
def test_random_bytes_are_refused_cleanly(frames):
    decodes_safely(frames)


@FUZZ
@given(
    header=headers,
    body=st.binary(max_size=64),
    payload=st.lists(st.binary(max_size=32), max_size=3),
)
def test_valid_header_with_random_body_is_refused_cleanly(header, body, payload):
    decodes_safely([header, body, *payload])


def _payloads(names: list[str]) -> st.SearchStrategy:
    """A descriptor with a frame of the size it declares (so decoding reaches the fields'
    checks), or anything at all with any frame."""

    def sized(desc: tuple[str, str, list[int]]) -> st.SearchStrategy:
        size = math.prod(desc[2]) * WIRE_DTYPES[desc[1]].itemsize
        return st.binary(min_size=size, max_size=size).map(lambda b: (list(desc), b))

    well_formed = st.tuples(
        st.sampled_from(names),
        st.sampled_from(sorted(WIRE_DTYPES)),
        st.lists(st.integers(0, 4), min_size=1, max_size=3),
    ).flatmap(sized)
    return well_formed | st.tuples(descriptors, st.binary(max_size=32))


@settings(FUZZ, max_examples=200)
@given(data=st.data())
def test_random_msgpack_maps_decode_or_are_refused_cleanly(data):
    cls = data.draw(st.sampled_from(sorted(REGISTRY.values(), key=lambda c: c.COMMAND)))
    names = [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls)
    arrays = [n for n in names if hints[n] in (np.ndarray, bytes, list[np.ndarray])]
    body = data.draw(st.dictionaries(st.sampled_from(names) | keys, msgpack_values, max_size=8))
    payload = data.draw(st.lists(_payloads(arrays or names), max_size=4))
    body["_a"] = [desc for desc, _ in payload]
    header = HEADER.pack(MAGIC, VERSION, cls.COMMAND)
    decodes_safely([header, msgpack.packb(body, use_bin_type=True), *(b for _, b in payload)])


@FUZZ
@given(header=headers, body=scalars | st.lists(msgpack_values, max_size=4))
def test_body_that_is_not_a_map_is_refused_cleanly(header, body):
    decodes_safely([header, msgpack.packb(body, use_bin_type=True)])


# ---- mutations of valid messages ---------------------------------------------------------------

Mutation = Callable[[st.DataObject, list[bytes]], list[bytes]]


def _index(data: st.DataObject, frames: list[bytes]) -> int:
    # The header is one frame in four of the draws: breaking it is refused at once and teaches
    # little, while the body and payload reach the deeper checks.
    return data.draw(st.sampled_from([0, *[i for i in range(1, len(frames)) for _ in (1, 2, 3)]]))


def truncate(data, frames):
    i = _index(data, frames)
    frames[i] = frames[i][: data.draw(st.integers(0, max(len(frames[i]) - 1, 0)))]
    return frames


def mutate_byte(data, frames):
    i = _index(data, frames)
    if frames[i]:
        pos = data.draw(st.integers(0, len(frames[i]) - 1))
        byte = data.draw(st.integers(0, 255))
        frames[i] = frames[i][:pos] + bytes([byte]) + frames[i][pos + 1 :]
    return frames


def extend(data, frames):
    i = _index(data, frames)
    frames[i] = frames[i] + data.draw(st.binary(min_size=1, max_size=16))
    return frames


def swap(data, frames):
    i, j = _index(data, frames), _index(data, frames)
    frames[i], frames[j] = frames[j], frames[i]
    return frames


def reorder(data, frames):
    return list(data.draw(st.permutations(frames)))


def drop_or_duplicate(data, frames):
    i = _index(data, frames)
    return frames[:i] + frames[i + 1 :] if data.draw(st.booleans()) else frames + [frames[i]]


def rewrite_header(data, frames):
    magic = data.draw(st.sampled_from([MAGIC, b"\x00\x00", b"m\xe3"]))
    version = data.draw(st.sampled_from([VERSION, 0, VERSION + 1, 255]))
    command = data.draw(st.integers(0, 255))
    return [HEADER.pack(magic, version, command), *frames[1:]]


def _edit_body(data, frames, edit: Callable[[dict], None]) -> list[bytes]:
    try:
        body = msgpack.unpackb(frames[1], raw=False)
    except Exception:  # an earlier mutation broke it: nothing to edit
        return frames
    if isinstance(body, dict):
        edit(body)
        frames[1] = msgpack.packb(body, use_bin_type=True)
    return frames


def wrong_type_field(data, frames):
    def edit(body):
        # Mostly a field the message has, so the type checks of that field are reached.
        key = data.draw(st.sampled_from(sorted(body)) | keys) if body else data.draw(keys)
        body[key] = data.draw(msgpack_values)

    return _edit_body(data, frames, edit)


def missing_field(data, frames):
    def edit(body):
        if body:
            body.pop(data.draw(st.sampled_from(sorted(body))))

    return _edit_body(data, frames, edit)


def huge_shape(data, frames):
    def edit(body):
        descs = body.get("_a")
        lists = (
            [i for i, d in enumerate(descs) if isinstance(d, list)]
            if isinstance(descs, list)
            else []
        )
        if lists:
            i = data.draw(st.sampled_from(lists))
            descs[i] = [*descs[i][:2], data.draw(shapes)]

    return _edit_body(data, frames, edit)


def _arrays(data, frames) -> tuple[dict, int] | None:
    """The body and the index of one of its well-formed array descriptors, if any."""
    try:
        body = msgpack.unpackb(frames[1], raw=False)
        arrays = [
            k
            for k, (_, dtype, shape) in enumerate(body["_a"])
            if dtype in WIRE_DTYPES
            and 2 + k < len(frames)
            and math.prod(shape) * WIRE_DTYPES[dtype].itemsize == len(frames[2 + k])
        ]
    except Exception:  # an earlier mutation broke it
        return None
    return (body, data.draw(st.sampled_from(arrays))) if arrays else None


def rewrite_array(data, frames):
    """New values, same dtype and shape: negative ids, falling offsets, indices out of range."""
    found = _arrays(data, frames)
    if found:
        body, k = found
        name, dtype, shape = body["_a"][k]
        dtype = WIRE_DTYPES[dtype]
        small = st.integers(-3, 40) if dtype.kind in "iu" else None
        if small is not None and dtype.kind == "u":
            small = st.integers(0, 40)
        values = hnp.arrays(dtype, math.prod(shape), elements=small)
        frames[2 + k] = data.draw(values | hnp.arrays(dtype, math.prod(shape))).tobytes()
    return frames


def reshape_array(data, frames):
    """A consistent descriptor of another length, rank or dtype: arrays that disagree."""
    found = _arrays(data, frames)
    if found:
        body, k = found
        name, _, _ = body["_a"][k]
        dtype = data.draw(st.sampled_from(sorted(WIRE_DTYPES)))
        shape = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=2))
        arr = data.draw(hnp.arrays(WIRE_DTYPES[dtype], tuple(shape), elements=None))
        body["_a"][k] = [name, dtype, shape]
        frames[1] = msgpack.packb(body, use_bin_type=True)
        frames[2 + k] = arr.tobytes()
    return frames


def deep_nesting(data, frames):
    if len(frames) < 2:
        return frames
    depth = data.draw(st.sampled_from([10, 600, 5000, 100_000]))
    field = data.draw(st.sampled_from(["cid", "_a", "models", "output", "stats"])).encode()
    # {field: [[[...[nil]...]]]} written by hand: msgpack.packb itself refuses this depth.
    frames[1] = b"\x81" + bytes([0xA0 | len(field)]) + field + b"\x91" * depth + b"\xc0"
    return frames


MUTATIONS: list[Mutation] = [
    truncate,
    mutate_byte,
    extend,
    swap,
    reorder,
    drop_or_duplicate,
    rewrite_header,
    wrong_type_field,
    missing_field,
    huge_shape,
    rewrite_array,
    reshape_array,
    rewrite_array,
    reshape_array,
    deep_nesting,
]


@settings(FUZZ, max_examples=500)
@given(data=st.data())
def test_mutated_valid_messages_decode_or_are_refused_cleanly(data):
    msg = data.draw(st.sampled_from(SAMPLES), label="message")
    frames = [bytes(f) for f in encode(msg)]
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        mutation = data.draw(st.sampled_from(MUTATIONS), label="mutation")
        if frames:
            frames = mutation(data, frames)
    decodes_safely(frames)
