"""The client refuses, before tokenizing, what every broker's backlog already makes hopeless."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.client.admission import check_backlog, may_refuse, text_floor
from mesh.client.request import INTERACTIVE_MAX_TOKENS
from mesh.errors import InvalidInput, Overloaded
from proto_msgs import BrokerStats, Lane


def test_the_floor_counts_words_and_is_batch_only_when_they_pass_the_interactive_limit():
    assert text_floor(["a short query"], None) == (Lane.INTERACTIVE, 3)
    # Many characters but one word (one token at least, maybe many): not surely batch.
    assert text_floor(["x" * 100_000], None) == (Lane.INTERACTIVE, 1)
    assert text_floor(["", "", ""], None) == (Lane.INTERACTIVE, 3)  # each input is a token
    lane, words = text_floor(["w " * (INTERACTIVE_MAX_TOKENS + 1)], None)
    assert lane == Lane.BATCH and words == INTERACTIVE_MAX_TOKENS + 1
    assert text_floor(["w " * 600, "w " * 600], None) == (Lane.BATCH, 1200)
    # A huge text is counted from a prefix only: still a lower bound.
    lane, words = text_floor(["w " * 5_000_000], None)
    assert lane == Lane.BATCH and INTERACTIVE_MAX_TOKENS < words < 5_000_000
    assert text_floor(["a short query"], Lane.BATCH) == (Lane.BATCH, 3)
    with pytest.raises(InvalidInput):
        text_floor(["q"], 7)


def _stats(interactive_s: float, batch_s: float, rate: float = 1000.0) -> BrokerStats:
    return BrokerStats(backlog_s={"m": [interactive_s, batch_s]}, drain_rate={"m": rate})


def test_a_request_is_refused_early_only_when_at_every_serving_broker_it_would_end_late():
    slow = _stats(0.5, 100.0)
    check_backlog([slow], "m", Lane.INTERACTIVE, 10, timeout_s=120.0)  # queries still pass
    check_backlog([slow], "m", Lane.BATCH, 10_000, timeout_s=120.0)  # 100 + 10 s: fits
    with pytest.raises(Overloaded) as raised:
        check_backlog([slow], "m", Lane.BATCH, 30_000, timeout_s=120.0)  # 100 + 30 s
    assert raised.value.retry_after_s == pytest.approx(10.0)
    assert "120s timeout" in raised.value.message
    # Another broker with room, one whose backlog is not known, or nothing ahead: let it decide.
    check_backlog([slow, _stats(0.0, 1.0)], "m", Lane.BATCH, 30_000, 120.0)
    check_backlog([slow, BrokerStats()], "m", Lane.BATCH, 30_000, 120.0)
    check_backlog([slow, None], "m", Lane.BATCH, 30_000, 120.0)
    check_backlog([_stats(0.0, 0.0)], "m", Lane.BATCH, 10**9, 120.0)
    check_backlog([], "m", Lane.BATCH, 30_000, 120.0)


def test_the_floor_caps_each_input_at_the_model_limit():
    # One auto-truncated 32 KB text is at most 512 tokens, not 5,000 words: a live query.
    assert text_floor(["w " * 5000], None, max_tokens=512) == (Lane.INTERACTIVE, 512)
    lane, words = text_floor(["w " * 5000] * 3, None, max_tokens=512)
    assert lane == Lane.BATCH and words == 1536


def test_pairs_are_counted_without_joining_them():
    import tracemalloc

    query = "q " * 500_000  # 1 MB, repeated for every passage as /rerank does
    pairs = [(query, "a passage of words") for _ in range(2048)]
    tracemalloc.start()
    try:
        lane, words = text_floor(pairs, None, max_tokens=512)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lane == Lane.BATCH and words > INTERACTIVE_MAX_TOKENS
    assert peak < 8 << 20, f"sizing 2048 pairs of a 1 MB query allocated {peak} bytes"
    assert text_floor([("one two", "three")], None) == (Lane.INTERACTIVE, 3)


def test_the_floor_is_needed_only_when_the_largest_request_could_be_refused():
    slow = _stats(0.5, 100.0)  # 1000 tokens/s
    assert not may_refuse([slow], "m", 16_384, timeout_s=120.0)  # 100 + 16.4 s: always fits
    assert may_refuse([slow], "m", 30_000, timeout_s=120.0)  # 100 + 30 s: some size might not
    assert may_refuse([_stats(100.0, 0.5)], "m", 30_000, 120.0)  # either lane's backlog counts
    # Another broker with room, one whose backlog is not known, or none: nothing is refused.
    assert not may_refuse([slow, _stats(0.0, 1.0)], "m", 30_000, 120.0)
    assert not may_refuse([slow, BrokerStats()], "m", 30_000, 120.0)
    assert not may_refuse([slow, None], "m", 30_000, 120.0)
    assert not may_refuse([], "m", 30_000, 120.0)


_backlog = st.floats(0.0, 200.0)


@given(
    st.lists(st.tuples(_backlog, _backlog, st.floats(1.0, 1e6)), max_size=3),
    st.integers(0, 100_000),
    st.integers(0, 100_000),
    st.sampled_from(list(Lane)),
    st.floats(1.0, 300.0),
)
def test_what_may_refuse_rules_out_check_backlog_never_refuses(
    brokers: list[tuple[float, float, float]], most: int, tokens: int, lane: Lane, timeout: float
) -> None:
    stats = [_stats(i, b, rate) for i, b, rate in brokers]
    if tokens > most or may_refuse(stats, "m", most, timeout):
        return
    check_backlog(stats, "m", lane, tokens, timeout)  # raises Overloaded if the rule is wrong
