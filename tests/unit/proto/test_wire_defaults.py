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
