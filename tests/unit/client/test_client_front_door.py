"""MeshClient's front door without a broker: resolve once, validate once, remember models."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from mesh.client import MeshClient
from mesh.errors import InvalidInput, ModelNotFound, Overloaded, Unavailable
from proto_msgs import BrokerStats, Lane, ModelInfo, OutputOptions, SubmitRequest
from proto_msgs.checks import submit_problem
from proto_msgs.small_arrays import SMALL

MODEL = ModelInfo(
    name="tiny", aliases=["org/tiny"], dims=8, max_input_tokens=4, vocab_size=100,
    pooling="mean", normalize=True, tokenizer_digest="d", workers=1,
)  # fmt: skip


@pytest.fixture
def client() -> Iterator[MeshClient]:
    """A client whose one broker link is never started, made to look alive and serving."""
    c = MeshClient("ipc:///nowhere")
    c.brokers[0].alive = True
    c.brokers[0].models = [MODEL]
    c.brokers[0].catalog_known = True
    yield c
    c.tokenizers.close()
    c._ctx.destroy(linger=0)


def test_token_ids_are_resolved_and_validated_into_one_ready_request(client: MeshClient) -> None:
    req = client.prepare_tokens(
        np.array([1, 2, 3, 4, 5, 6, 7]), np.array([0, 2, 7]), "org/tiny", dims=4, truncate=True
    )
    assert req.model.name == "tiny" and req.output.dims == 4
    assert req.lengths.tolist() == [2, 4] and req.token_ids.tolist() == [1, 2, 3, 4, 5, 6]
    assert req.lane == Lane.INTERACTIVE


def test_bad_ids_and_options_are_refused_before_anything_is_sent(client: MeshClient) -> None:
    ids, offsets = np.array([1, 200]), np.array([0, 2])
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        client.prepare_tokens(ids, offsets, "tiny")
    with pytest.raises(InvalidInput, match="between 1 and 8"):
        client.prepare_tokens(np.array([1]), np.array([0, 1]), "tiny", dims=9)


@pytest.mark.parametrize(
    ("ids", "offsets", "dims"),
    [
        ([1, 200], [0, 2], None),  # outside the vocabulary
        ([1, 2, 3, 4, 5, 6], [0, 1, 6], None),  # input[1] over the limit of 4
        ([1], [0, 1], 9),  # dimensions over the width of 8
    ],
)
def test_the_client_refuses_early_what_the_broker_would_in_the_same_words(
    client: MeshClient, ids: list[int], offsets: list[int], dims: int | None
) -> None:
    """One check (proto_msgs.checks): a request that bypassed the client meets the same rule."""
    with pytest.raises(InvalidInput) as refused:
        client.prepare_tokens(np.array(ids), np.array(offsets), "tiny", dims=dims)
    raw = SubmitRequest(
        cid=1, model="org/tiny", lane=0, timeout_ms=None, output=OutputOptions(dims=dims),
        token_ids=np.array(ids, np.int32), offsets=np.array(offsets, np.int32),
    )  # fmt: skip
    problem = submit_problem(MODEL, raw, raw.offsets[1:] - raw.offsets[:-1])
    assert problem is not None
    assert (refused.value.message, refused.value.param) == (problem.message, problem.param)


@pytest.mark.parametrize("n", [2, SMALL, SMALL + 1])
def test_token_checks_read_few_and_many_sequences_alike(client: MeshClient, n: int) -> None:
    """Short arrays are reduced in Python, long ones in numpy: the same answers."""
    offsets = np.arange(n + 1)
    for bad, says in ((-1, "token id -1 is outside"), (100, "token id 100 is outside")):
        ids = np.ones(n, dtype=np.int64)
        ids[-1] = bad
        with pytest.raises(InvalidInput, match=says):
            client.prepare_tokens(ids, offsets, "tiny")
    empty = np.concatenate([offsets[:-1], offsets[-2:-1]])  # the last sequence holds nothing
    with pytest.raises(InvalidInput, match=rf"input\[{n - 1}\] is empty"):
        client.prepare_tokens(np.ones(n - 1, dtype=np.int64), empty, "tiny")
    long = np.append(offsets, n + 5)  # a last sequence of 5 tokens, over the limit of 4
    with pytest.raises(InvalidInput, match=rf"input\[{n}\] has 5 tokens"):
        client.prepare_tokens(np.ones(n + 5, dtype=np.int64), long, "tiny")
    cut = client.prepare_tokens(np.ones(n + 5, dtype=np.int64), long, "tiny", truncate=True)
    assert cut.lengths.tolist() == [1] * n + [4]


def test_a_model_that_lost_its_workers_is_unavailable_and_an_unknown_one_not_found(
    client: MeshClient,
) -> None:
    client.brokers[0]._on_catalog(client.brokers[0])  # a heartbeat's catalog reply arrives
    assert client.seen.find("tiny") is not None
    client.brokers[0].models = []
    with pytest.raises(Unavailable, match="no worker"):
        client.resolve("org/tiny")
    with pytest.raises(ModelNotFound):
        client.resolve("other")
    client.brokers[0].alive = False
    with pytest.raises(Unavailable, match="no broker"):
        client.resolve("other")


async def test_embed_tokens_refuses_invalid_input_through_the_same_validation(
    client: MeshClient,
) -> None:
    with pytest.raises(InvalidInput, match=r"input\[0\] has 5 tokens"):
        await client.embed_tokens(np.arange(5), np.array([0, 5]), "tiny")


def test_a_live_broker_whose_catalog_has_not_arrived_makes_a_model_unavailable_not_unknown(
    client: MeshClient,
) -> None:
    link = client.brokers[0]
    link.models, link.catalog_known = [], False  # a Pong came first: (re)connected just now
    with pytest.raises(Unavailable, match="catalog is still arriving"):
        client.resolve("anything")
    link.catalog_known = True  # its catalog said: nothing is served
    with pytest.raises(ModelNotFound):
        client.resolve("anything")


def test_an_unknown_lane_is_invalid_input_naming_the_lanes(client: MeshClient) -> None:
    with pytest.raises(InvalidInput, match="lane must be one of 0 .interactive., 1 .batch.") as e:
        client.prepare_tokens(np.array([1, 2]), np.array([0, 2]), "tiny", lane=7)
    assert e.value.param == "lane"


def test_the_early_429_measures_the_backlog_against_the_calls_own_timeout(
    client: MeshClient,
) -> None:
    # 10 s of interactive work queued ahead, 100 tokens/s: a 2-token request ends at ~10 s.
    client.brokers[0].stats = BrokerStats(
        backlog_s={"tiny": [10.0, 0.0]}, drain_rate={"tiny": 100.0}
    )
    ids, offsets = np.array([1, 2]), np.array([0, 2])
    assert client.default_timeout_s > 11  # with the default timeout it still fits
    client.prepare_tokens(ids, offsets, "tiny")
    with pytest.raises(Overloaded, match="after its 5s timeout"):
        client.prepare_tokens(ids, offsets, "tiny", timeout_s=5.0)
    client.prepare_tokens(ids, offsets, "tiny", timeout_s=60.0)


def test_a_text_request_counts_its_words_only_when_it_could_be_refused(
    client: MeshClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mesh.client.client as client_module

    counted: list[int] = []
    real = client_module.text_floor

    def counting(inputs, chosen, max_tokens=None):  # noqa: ANN001, ANN202
        counted.append(len(inputs))
        return real(inputs, chosen, max_tokens)

    monkeypatch.setattr(client_module, "text_floor", counting)
    texts = ["some words here"] * 3  # at most 3 x 4 tokens (the model's limit)
    link = client.brokers[0]
    # 10 s queued in one lane, 100 tokens/s: 12 tokens end at 10.12 s.
    link.stats = BrokerStats(backlog_s={"tiny": [0.0, 10.0]}, drain_rate={"tiny": 100.0})
    client._check_text_backlog(MODEL, texts, None, 11.0)  # nothing could be refused: not counted
    assert counted == []
    with pytest.raises(Overloaded):  # now some size could be: counted, and refused (lane 1)
        client._check_text_backlog(MODEL, texts, Lane.BATCH, 10.05)
    assert counted == [3]
    client._check_text_backlog(MODEL, texts, Lane.INTERACTIVE, 10.05)  # counted, its lane free
    assert counted == [3, 3]
    for timeout in (10.05, 11.0):  # a bad lane is said whether the words are counted or not
        with pytest.raises(InvalidInput, match="lane must be one of"):
            client._check_text_backlog(MODEL, texts, 7, timeout)


def test_the_merged_catalog_follows_every_new_catalog_and_every_broker_liveness() -> None:
    """models() keeps its merge until a broker's catalog or liveness changes: each change
    shows at once (two brokers' worker counts summed, a dead broker's left out)."""
    c = MeshClient(["ipc:///nowhere-a", "ipc:///nowhere-b"])
    try:
        a, b = c.brokers
        a.alive = b.alive = True
        a.models, b.models = [MODEL], [ModelInfo(**{**MODEL.__dict__, "workers": 2})]
        first = c.models()
        again = c.models()  # nothing changed: the same merge, in a list of the caller's own
        assert [m.workers for m in first] == [3] and again == first and again is not first
        assert all(a is b for a, b in zip(again, first, strict=True))
        b.alive = False
        assert [m.workers for m in c.models()] == [1]
        b.alive = True
        b.models = [ModelInfo(**{**MODEL.__dict__, "workers": 5})]  # b's next catalog
        assert [m.workers for m in c.models()] == [6]
        a.models = []
        assert [m.workers for m in c.models()] == [5]
        a.alive = b.alive = False
        assert c.models() == []
    finally:
        c.tokenizers.close()
        c._ctx.destroy(linger=0)
