"""A field added with a default decodes from a peer that predates it; required fields stay
required. ModelInfo's prompts are the case in point: a worker or broker of the previous release
sends none."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from wire_samples import minilm

from proto_msgs import CatalogReply, ProtocolError, WorkerReady, decode, encode


def _ready(**model_changes) -> WorkerReady:
    return WorkerReady(
        name="w", model=dataclasses.replace(minilm(), **model_changes), tokenizer_json=b"{}",
        max_batch_tokens=8192, max_batch_requests=256, credits=2, heartbeat_ms=1000,
        device="cpu",
    )  # fmt: skip


def _without(frames: list, *names: str) -> list:
    body = msgpack.unpackb(frames[1])
    for name in names:
        del body["model"][name]
    return [frames[0], msgpack.packb(body, use_bin_type=True), *frames[2:]]


def test_prompts_travel_with_the_model() -> None:
    sent = _ready(prompts={"query": "query: ", "doc": ""}, default_prompt_name="query")
    got = decode(encode(sent))
    assert got.model.prompts == {"query": "query: ", "doc": ""}
    assert got.model.default_prompt_name == "query"


def test_a_model_from_a_peer_without_prompts_decodes_with_none() -> None:
    frames = _without(encode(_ready(prompts={"q": "q: "})), "prompts", "default_prompt_name")
    got = decode(frames)
    assert got.model.prompts == {} and got.model.default_prompt_name is None
    # Each decode gets its own dict: a default is never shared between messages.
    assert decode(frames).model.prompts is not got.model.prompts


def test_a_field_without_a_default_is_still_required() -> None:
    with pytest.raises(ProtocolError, match="dims: missing"):
        decode(_without(encode(_ready()), "dims"))


def test_a_prompt_of_the_wrong_type_is_refused() -> None:
    frames = encode(CatalogReply(cid=1, models=[minilm()]))
    body = msgpack.unpackb(frames[1])
    body["models"][0]["prompts"] = {"query": 3}
    with pytest.raises(ProtocolError, match="prompts"):
        decode([frames[0], msgpack.packb(body), *frames[2:]])


def test_a_ready_from_a_worker_without_a_live_lane_field_keeps_no_credit_for_one() -> None:
    frames = encode(dataclasses.replace(_ready(), live_credits=1, live_tokens=1024))
    assert decode(frames).live_credits == 1 and decode(frames).live_tokens == 1024
    body = msgpack.unpackb(frames[1])
    del body["live_credits"], body["live_tokens"]
    got = decode([frames[0], msgpack.packb(body, use_bin_type=True), *frames[2:]])
    assert (got.live_credits, got.live_tokens) == (0, 0)


def test_a_ready_without_a_probe_rate_has_none_and_a_wild_one_is_refused() -> None:
    frames = encode(dataclasses.replace(_ready(), probe_rate=1234.5))
    assert decode(frames).probe_rate == 1234.5
    body = msgpack.unpackb(frames[1])
    del body["probe_rate"]
    assert decode([frames[0], msgpack.packb(body, use_bin_type=True), *frames[2:]]).probe_rate == 0
    for wild in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ProtocolError, match="probe_rate"):
            decode(encode(dataclasses.replace(_ready(), probe_rate=wild)))


@pytest.mark.parametrize(
    ("credits", "live_credits", "live_tokens", "problem"),
    [
        (2, 2, 1024, "leave bulk at least one credit"),
        (2, -1, 0, "leave bulk at least one credit"),
        (2, 1, 0, "live_tokens out of"),
        (2, 1, 8193, "live_tokens out of"),
    ],
)
def test_a_ready_whose_live_lane_leaves_bulk_nothing_is_refused(
    credits: int, live_credits: int, live_tokens: int, problem: str
) -> None:
    bad = dataclasses.replace(
        _ready(), credits=credits, live_credits=live_credits, live_tokens=live_tokens
    )
    with pytest.raises(ProtocolError, match=problem):
        decode(encode(bad))
