"""Each malformed message is refused with ProtocolError, carrying the cid when it was readable."""

from __future__ import annotations

import struct
import warnings

import msgpack
import numpy as np
import pytest
from wire_samples import SENTENCES, embeddings, ragged, sample_messages, submit

from proto_msgs import (
    MAGIC,
    REGISTRY,
    VERSION,
    BatchAssign,
    ErrorCode,
    OutputOptions,
    ProtocolError,
    RequestError,
    RequestResult,
    SubmitRequest,
    TokenizerReply,
    WorkerReady,
    decode,
    encode,
    limits,
)

HEADER = struct.Struct("<2sBB")
CID = 77


def frames_of(msg) -> list[bytes]:
    return [bytes(f) for f in encode(msg)]


def with_body(frames: list[bytes], **changes) -> list[bytes]:
    body = msgpack.unpackb(frames[1], raw=False)
    body.update(changes)
    return [frames[0], msgpack.packb(body, use_bin_type=True), *frames[2:]]


def refused(frames, match: str | None = None) -> ProtocolError:
    # A huge shape must not reach numpy's overflowing arithmetic either: warnings are errors.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ProtocolError, match=match) as info:
            decode(frames)
    return info.value


# ---- header and framing: refused before the body is read, so no cid ---------------------------


@pytest.mark.parametrize("version", [0, VERSION + 1, 255])
def test_other_protocol_version_is_refused(version):
    frames = frames_of(submit())
    frames[0] = HEADER.pack(MAGIC, version, SubmitRequest.COMMAND)
    assert refused(frames, "version").cid is None


def test_unknown_command_is_refused():
    unknown = [c for c in range(256) if c not in REGISTRY]
    for command in (unknown[0], unknown[-1]):
        frames = frames_of(submit())
        frames[0] = HEADER.pack(MAGIC, VERSION, command)
        assert refused(frames, "unknown command").cid is None


@pytest.mark.parametrize(
    ("header", "match"),
    [(b"\x00\x00\x01\x01", "magic"), (b"\xe3m\x01", "header length"), (b"", "header length")],
)
def test_foreign_or_short_header_is_refused(header, match):
    refused([header, *frames_of(submit())[1:]], match)


@pytest.mark.parametrize("frames", [[], [b"\xe3m\x01\x01"], None, b"\xe3m\x01\x01"])
def test_fewer_than_two_frames_is_refused(frames):
    refused(frames, "header and a body")


def test_more_frames_than_the_limit_is_refused():
    frames = frames_of(submit())
    refused(frames + [b""] * limits.MAX_FRAMES, "frames")


@pytest.mark.parametrize("frame", ["text", 42, None, object()])
def test_frames_that_are_not_bytes_are_refused(frame):
    refused([frame, frame])
    refused([*frames_of(submit()), frame])


def test_non_contiguous_buffers_are_refused():
    header = np.frombuffer(frames_of(submit())[0] * 2, np.uint8)[::2]
    refused([header, frames_of(submit())[1]], "contiguous")


# ---- body --------------------------------------------------------------------------------------


def test_body_over_the_size_limit_is_refused_before_it_is_parsed():
    frames = frames_of(submit())
    frames[1] = b"\xc0" * (limits.MAX_BODY_BYTES + 1)
    assert refused(frames, "size limit").cid is None


@pytest.mark.parametrize(
    "body",
    [b"", b"\xc1", b"\x81\xa3cid", b"\x93\x01\x02", b"\xa3abc", b"\x81\x01\x02", b"\x91" * 100_000],
    ids=["empty", "reserved-byte", "truncated", "list", "string", "int-key", "deep-nesting"],
)
def test_body_that_is_not_a_msgpack_map_is_refused(body):
    frames = frames_of(submit())
    assert refused([frames[0], body, *frames[2:]]).cid is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model", 5),
        ("lane", "interactive"),
        ("lane", True),
        ("timeout_ms", 1.5),
        ("output", [None, True, "float32"]),
        ("output", {"dims": None, "normalize": 1, "kind": "float32"}),
        ("model", "x" * (limits.MAX_STRING + 1)),
    ],
)
def test_field_of_the_wrong_type_is_refused_with_the_cid(field, value):
    assert refused(with_body(frames_of(submit()), **{field: value}), field).cid == CID


def test_missing_field_is_refused_with_the_cid():
    frames = frames_of(submit())
    body = msgpack.unpackb(frames[1])
    del body["model"]
    frames[1] = msgpack.packb(body)
    assert refused(frames, "model: missing").cid == CID


@pytest.mark.parametrize("cid", ["77", True, 1.0, None, [77]])
def test_cid_that_is_not_an_int_is_not_reported(cid):
    assert refused(with_body(frames_of(submit()), cid=cid)).cid is None


# ---- payload frames ----------------------------------------------------------------------------


def test_truncated_payload_is_refused_with_the_cid():
    frames = frames_of(submit())
    frames[2] = frames[2][:-1]
    assert refused(frames, "frame size").cid == CID


def test_payload_longer_than_its_shape_is_refused_with_the_cid():
    frames = frames_of(submit())
    frames[3] += b"\x00\x00\x00\x00"
    assert refused(frames, "frame size").cid == CID


@pytest.mark.parametrize("change", ["drop", "extra"])
def test_payload_frame_count_must_match_the_descriptors(change):
    frames = frames_of(submit())
    frames = frames[:-1] if change == "drop" else [*frames, b"\x00" * 4]
    assert refused(frames, "descriptors").cid == CID


@pytest.mark.parametrize(
    "shape",
    [[2**62, 4], [2**32, 2**32], [0, 2**63], [0, 2**64 - 1], [2**64 - 1], [-1], [1, 2, 3], []],
)
def test_huge_or_malformed_declared_shape_is_refused_without_allocating(shape):
    frames = frames_of(submit())
    body = msgpack.unpackb(frames[1])
    body["_a"][0] = ["token_ids", "int32", shape]
    frames[1] = msgpack.packb(body)
    frames[2] = b""
    assert refused(frames).cid == CID


@pytest.mark.parametrize(
    "descriptor",
    [
        ["token_ids", "float64", [12]],
        ["token_ids", "bytes", 48],
        ["no_such_field", "int32", [12]],
        ["token_ids", "int32"],
        "token_ids",
        [7, "int32", [12]],
    ],
)
def test_bad_descriptor_is_refused_with_the_cid(descriptor):
    frames = frames_of(submit())
    body = msgpack.unpackb(frames[1])
    body["_a"][0] = descriptor
    frames[1] = msgpack.packb(body)
    assert refused(frames).cid == CID


def test_array_sent_twice_is_refused():
    frames = frames_of(submit())
    body = msgpack.unpackb(frames[1])
    body["_a"][1] = ["token_ids", "int32", [12]]
    frames[1] = msgpack.packb(body)
    frames[3] = frames[2]
    assert refused(frames, "twice").cid == CID


def test_array_left_out_with_its_descriptor_is_refused_with_the_cid():
    frames = frames_of(submit())
    body = msgpack.unpackb(frames[1])
    del body["_a"][1]  # offsets: descriptors and frames still agree in number
    frames[1] = msgpack.packb(body)
    del frames[3]
    assert refused(frames, r"payload missing for \['offsets'\]").cid == CID


@pytest.mark.parametrize(
    "descriptor",
    [["content", "bytes", 99], ["content", "uint8", [18]], ["content", "bytes", [18]]],
)
def test_blob_whose_descriptor_disagrees_is_refused_with_the_cid(descriptor):
    reply = TokenizerReply(cid=CID, digest="9f" * 32, found=True, content=b'{"version": "1.0"}')
    frames = frames_of(reply)
    body = msgpack.unpackb(frames[1])
    body["_a"][0] = descriptor
    frames[1] = msgpack.packb(body)
    assert refused(frames, "content: bad blob descriptor").cid == CID


def test_blob_sent_twice_is_refused():
    reply = TokenizerReply(cid=CID, digest="9f" * 32, found=True, content=b"{}")
    frames = frames_of(reply)
    body = msgpack.unpackb(frames[1])
    body["_a"].append(body["_a"][0])
    frames[1] = msgpack.packb(body)
    assert refused([*frames, frames[2]], "content: bad blob descriptor").cid == CID


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"timings": {"worker_compute": "slow"}}, r"RequestResult\.timings\.value"),
        ({"timings": {1: 0.5}}, None),  # msgpack's strict_map_key refuses it first
        ({"timings": [0.5]}, r"RequestResult\.timings: expected a map"),
        ({"queue_ms": True}, r"RequestResult\.queue_ms: expected a number"),
    ],
)
def test_nested_body_values_of_the_wrong_type_are_refused(changes, match):
    result = RequestResult(
        cid=CID,
        prompt_tokens=2,
        indices=np.arange(2, dtype=np.int32),
        embeddings=embeddings(2, "int8"),
    )
    refused(with_body(frames_of(result), **changes), match)


def test_output_group_that_is_not_a_map_is_refused():
    batch = next(m for m in sample_messages() if isinstance(m, BatchAssign))
    frames = with_body(
        frames_of(batch), outputs=[{"dims": None, "normalize": True, "kind": "int8"}, 5]
    )
    refused(frames, r"BatchAssign\.outputs\[\]: expected a map")


def test_payload_frame_over_the_array_limit_is_refused(monkeypatch):
    monkeypatch.setattr(limits, "MAX_ARRAY_BYTES", 32)  # the real limit is 1 GiB
    assert refused(frames_of(submit()), "over 32 bytes").cid == CID


# ---- message-level checks (validate) -----------------------------------------------------------


@pytest.mark.parametrize(
    "offsets",
    [
        [0, 4, 4, 12],  # an empty sequence
        [0, 10, 4, 12],  # falling
        [1, 4, 10, 12],  # not starting at 0
        [0, 4, 10, 11],  # not ending at len(token_ids)
        [0, 4, 10, 13],
        [0],  # no sequence at all
        # Rises by one in int32 arithmetic (wraps around) while really falling.
        [0, 2**31 - 1, -(2**31), -1, 12],
    ],
)
def test_offsets_that_do_not_rise_from_zero_to_the_end_are_refused(offsets):
    msg = submit(offsets=np.array(offsets, dtype=np.int32))
    assert refused(frames_of(msg), "offsets").cid == CID


def test_offsets_and_token_ids_of_another_dtype_are_refused():
    token_ids, offsets = ragged(SENTENCES)
    refused(frames_of(submit(offsets=offsets.astype(np.float32))), "offsets")
    refused(frames_of(submit(token_ids=token_ids.astype(np.float32))), "token_ids")
    refused(frames_of(submit(token_ids=token_ids.reshape(3, 4))), "token_ids")


def test_negative_token_id_is_refused_with_the_cid():
    token_ids, _ = ragged(SENTENCES)
    token_ids[5] = -1
    assert refused(frames_of(submit(token_ids=token_ids)), "negative token id").cid == CID


@pytest.mark.parametrize(
    "output",
    [
        OutputOptions(kind="float64"),
        OutputOptions(kind="ubinary"),
        OutputOptions(dims=0),
        OutputOptions(dims=limits.MAX_DIMS + 1),
        OutputOptions(kind="sparse"),  # no top_k
        OutputOptions(kind="sparse", top_k=limits.MAX_SPARSE_TOP_K + 1),
        OutputOptions(top_k=8),  # top_k of a dense kind
        OutputOptions(kind="sparse", top_k=8, threshold=float("nan")),
        OutputOptions(kind="sparse", top_k=8, threshold=-1.0),
        OutputOptions(threshold=0.5),
    ],
)
def test_bad_output_options_are_refused_with_the_cid(output):
    assert refused(frames_of(submit(output=output)), "output kind|dims|top_k|threshold").cid == CID


@pytest.mark.parametrize(("field", "value"), [("lane", 2), ("timeout_ms", 0), ("timeout_ms", -5)])
def test_bad_lane_or_timeout_is_refused_with_the_cid(field, value):
    assert refused(frames_of(submit(**{field: value})), field).cid == CID


def test_request_error_with_an_unknown_code_is_refused_with_the_cid():
    msg = RequestError(cid=CID, code=max(ErrorCode) + 1, message="?")
    assert refused(frames_of(msg), "error code").cid == CID


@pytest.mark.parametrize(
    "indices",
    [
        np.array([0, 1, 2], np.int32),  # three indices for two rows
        np.array([0, -1], np.int32),
        np.array([0.0, 1.0], np.float32),
        np.array([[0, 1]], np.int32),
    ],
)
def test_result_indices_must_be_non_negative_int32_one_per_row(indices):
    msg = RequestResult(cid=CID, prompt_tokens=2, indices=indices, embeddings=embeddings(2, "int8"))
    assert refused(frames_of(msg), "RequestResult").cid == CID


@pytest.mark.parametrize(
    "output_index",
    [
        np.array([0, 2, 0], np.int32),  # out of range: two output groups
        np.array([0, -1, 0], np.int32),
        np.array([0, 1], np.int32),
        np.array([0, 1, 0], np.float32),
    ],
)
def test_batch_output_index_must_name_an_output_group_per_sequence(output_index):
    batch = next(m for m in sample_messages() if isinstance(m, BatchAssign))
    batch.output_index = output_index
    refused(frames_of(batch), "output_index")


@pytest.mark.parametrize("credits", [0, 65])
def test_worker_ready_with_credits_out_of_range_is_refused(credits):
    ready = next(m for m in sample_messages() if isinstance(m, WorkerReady))
    ready.credits = credits
    assert refused(frames_of(ready), "credits").cid is None
