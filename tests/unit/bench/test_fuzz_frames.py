"""The fuzz's frames and its verdict: what it sends is what it says, and a failure is flagged."""

from __future__ import annotations

import random
from typing import Any

import pytest

from bench.harness.fuzz import judge
from bench.harness.fuzz_frames import FAKE_MODELS, KINDS, Mutator, Templates, as_bytes
from bench.harness.fuzz_peers import FuzzCounts
from proto_msgs import (
    REGISTRY,
    BatchResult,
    Ping,
    ProtocolError,
    SubmitRequest,
    WorkerReady,
    decode,
    encode,
)

MODEL = "all-MiniLM-L6-v2"


def decodes(frames: list[bytes]) -> bool:
    try:
        decode(frames)
    except ProtocolError:
        return False
    return True


def test_the_mutator_makes_every_advertised_kind_on_both_sides() -> None:
    mutator = Mutator(MODEL, seed=1)
    seen = {(side, mutator.next(side)[0]) for _ in range(3000) for side in ("front", "back")}
    assert seen == {(side, kind) for side in ("front", "back") for kind in KINDS}


@pytest.mark.parametrize("kind", ["random", "huge"])
def test_random_and_huge_frames_never_decode(kind: str) -> None:
    mutator = Mutator(MODEL, seed=2)
    frames = [mutator.make(kind, side) for _ in range(400) for side in ("front", "back")]
    assert not any(decodes(f) for f in frames)


def test_truncated_frames_almost_never_decode() -> None:
    mutator = Mutator(MODEL, seed=2)
    frames = [mutator.make("truncated", side) for _ in range(400) for side in ("front", "back")]
    # Only what had nothing to cut survives: an empty payload frame stays empty.
    assert sum(decodes(f) for f in frames) < 0.05 * len(frames)


def test_huge_frames_declare_far_more_than_they_carry() -> None:
    mutator = Mutator(MODEL, seed=3)
    frames = [mutator.make("huge", "front") for _ in range(300)]
    # A 4 G-entry msgpack header, an absurd shape, or too many frames: each is a lie about size.
    assert any(f[1][:1] in (b"\xdf", b"\xdd", b"\xdb", b"\xc6", b"\xc9") for f in frames)
    assert any(len(f) > 256 for f in frames)


def test_wrong_command_bytes_change_only_the_header() -> None:
    mutator = Mutator(MODEL, seed=4)
    for _ in range(200):
        frames = mutator.make("command", "back")
        assert len(frames[0]) == 4
    assert sum(decodes(mutator.make("command", "front")) for _ in range(500)) < 100


def test_valid_messages_mostly_decode_and_cover_every_class() -> None:
    templates = Templates(MODEL, random.Random(5))
    classes = {type(templates.pick(side)) for _ in range(3000) for side in ("front", "back")}
    assert classes == set(REGISTRY.values())
    mutator = Mutator(MODEL, seed=5)
    valid = [mutator.make("valid", side) for _ in range(500) for side in ("front", "back")]
    assert sum(decodes(f) for f in valid) > 0.8 * len(valid)


def test_the_served_model_gets_only_tiny_submits_and_conflicting_readies() -> None:
    templates = Templates(MODEL, random.Random(6))
    for _ in range(5000):
        msg = templates.pick("back" if random.random() < 0.5 else "front")
        if isinstance(msg, WorkerReady) and msg.model.name == MODEL:
            assert msg.model.dims == 1  # never the served card: it must be refused
        if isinstance(msg, SubmitRequest) and msg.model == MODEL:
            assert len(msg.token_ids) <= 12
        if isinstance(msg, WorkerReady):
            assert msg.model.name in {MODEL, *(f"fuzz-model-{k}" for k in range(FAKE_MODELS))}


def test_a_seeded_mutator_repeats_itself() -> None:
    a, b = Mutator(MODEL, seed=7), Mutator(MODEL, seed=7)
    assert [a.next("front") for _ in range(50)] == [b.next("front") for _ in range(50)]


def test_counts_say_what_the_broker_must_drop() -> None:
    counts = FuzzCounts()
    counts.add("front", "random", [b"junk"])
    counts.add("front", "valid", as_bytes(encode(Ping(cid=1))))  # accepted on the frontend
    stray = as_bytes(encode(BatchResult(1, 1.0, [])))
    counts.add("front", "valid", stray)  # a worker's message on the frontend: dropped
    counts.add("back", "valid", stray)  # on the backend it is acted on (or answered)
    assert (counts.messages, counts.must_drop) == (4, 2)
    assert counts.frames == 1 + 2 + 2 + 2
    assert counts.decoded_as == {"front:Ping": 1, "front:BatchResult": 1, "back:BatchResult": 1}


def passing_result() -> dict[str, Any]:
    return {
        "alive_at_end": {"broker": True, "worker": True},
        "exit_codes": {"broker": None, "worker": None},
        "legit_client": {"ok": 10, "errors": 0, "wrong": 0},
        "frames_asked": 100,
        "frames_sent": 100,
        "broker_before": {"dropped_frames": 5},
        "broker_after": {"dropped_frames": 95},
        "must_drop": 90,
        "handler_failures": [],
        "local_decode_bugs": [],
    }


def test_a_clean_fuzz_run_passes() -> None:
    assert judge(passing_result()) == []


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"alive_at_end": {"broker": False, "worker": True}}, "broker died"),
        ({"legit_client": {"ok": 10, "errors": 1, "wrong": 0}}, "1 errors"),
        ({"legit_client": {"ok": 10, "errors": 0, "wrong": 2}}, "2 wrong"),
        ({"frames_sent": 99}, "only 99"),
        ({"must_drop": 91}, "fewer frames"),
        ({"broker_after": None}, "did not answer"),
        ({"handler_failures": ["Traceback"]}, "handler failures"),
        ({"local_decode_bugs": ["x"]}, "ProtocolError"),
    ],
)
def test_a_fuzz_failure_is_flagged(change: dict[str, Any], why: str) -> None:
    failures = judge({**passing_result(), **change})
    assert len(failures) == 1 and why in failures[0], failures
