"""The HTTP layer over a fake mesh client: routing, auth, limits, error shapes, health, metrics."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from mesh import errors
from mesh.client import EmbedResult, MeshClient, ValidRequest
from mesh.client.admission import check_backlog
from mesh.client.models import ModelBook
from mesh.client.request import output_options, prompt_text, valid_tokenized
from mesh.ingress.app import INTERACTIVE_MAX_TOKENS, create_app
from mesh.ingress.config import IngressConfig
from proto_msgs import BrokerStats, Lane, ModelInfo
from proto_msgs.checks import over_limit_message

MODEL = ModelInfo(
    name="tiny", aliases=["org/tiny"], dims=8, max_input_tokens=16, vocab_size=100,
    pooling="mean", normalize=True, tokenizer_digest="d", workers=1,
    prompts={"query": "query: find "},  # no default: texts go as they are unless one is named
)  # fmt: skip


@dataclass
class FakeBroker:
    endpoint: str = "ipc://fake"
    alive: bool = True
    catalog_known: bool = True
    outstanding_tokens: int = 0
    failovers: int = 0
    stats: BrokerStats | None = field(
        default_factory=lambda: BrokerStats({"tiny": 5}, {"tiny": 2}, {"tiny": 1}, 3, 0)
    )
    pinging: bool = True

    def heard_ago(self) -> float | None:
        return 0.5 if self.alive else None

    def sound(self) -> bool:
        return self.pinging


class FakeClient:
    """Tokenizes words to ids, embeds each sequence as a one-hot of its length. Resolution,
    validation of token ids and "seen" are the real client's code."""

    def __init__(self) -> None:
        self.brokers = [FakeBroker()]
        self.served = True
        self.error: errors.MeshError | None = None
        self.calls: list[dict] = []
        self.block: asyncio.Event | None = None
        self.cancelled = asyncio.Event()
        self.seen = ModelBook()

    def _served(self) -> list[ModelInfo]:
        return [MODEL] if self.served and self.brokers[0].alive else []

    def models(self) -> list[ModelInfo]:
        served = self._served()
        self.seen.note(served)
        return served

    # The real client's rules (unknown → 404, seen but workerless or no broker → 503; the one
    # validation of token ids), so these tests check the ingress against what the client does.
    resolve = MeshClient.resolve
    prepare_tokens = MeshClient.prepare_tokens

    def _check_backlog(
        self, model: ModelInfo, lane: int, tokens: int, timeout_s: float | None = None
    ) -> None:
        # The real admission rule over the fake brokers' stats (no backlog: never refuses).
        timeout = 120.0 if timeout_s is None else timeout_s
        check_backlog([b.stats for b in self.brokers], model.name, lane, tokens, timeout)

    async def prepare_texts(self, texts, model, *, dims=None, normalize=True, kind="float32",
                            lane=None, truncate=False, prompt_name=None) -> ValidRequest:  # fmt: skip
        info = self.resolve(model)
        output = output_options(info, dims, normalize, kind)
        texts = [prompt_text(info, prompt_name) + t for t in texts]
        seqs = [[len(w) % 100 for w in t.split()] or [1] for t in texts]
        for i, seq in enumerate(seqs):
            if len(seq) > info.max_input_tokens and not truncate:
                raise errors.InvalidInput(over_limit_message(i, info), param="input")
        seqs = [seq[: info.max_input_tokens] for seq in seqs]
        ids = np.array([t for seq in seqs for t in seq], dtype=np.int32)
        lengths = np.array([len(seq) for seq in seqs], dtype=np.int32)
        return valid_tokenized(info, ids, lengths, output, lane)

    async def submit(self, request: ValidRequest, timeout_s: float | None = None) -> EmbedResult:
        self.calls.append({"request": request, "timeout_s": timeout_s})
        if self.block is not None:
            try:
                await self.block.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if self.error is not None:
            raise self.error
        n, opts = request.n, request.output
        out = np.zeros((n, opts.dims or MODEL.dims), dtype=np.float32)
        out[np.arange(n), np.minimum(request.lengths, out.shape[1]) - 1] = 1.0
        if opts.kind == "int8":
            out = (out * 127).astype(np.int8)
        elif opts.kind == "binary":
            out = np.packbits(out > 0, axis=1)
        return EmbedResult(out, request.tokens, timings={"worker_compute": 0.5})


@pytest.fixture
def fake() -> FakeClient:
    return FakeClient()


async def serve(fake: FakeClient, **cfg: object) -> TestClient:
    app = create_app(IngressConfig(brokers=["ipc://fake"], **cfg), fake)  # type: ignore[arg-type]
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
async def http(fake: FakeClient) -> AsyncIterator[TestClient]:
    client = await serve(fake)
    yield client
    await client.close()


async def test_embeddings_answers_in_input_order_with_usage(http: TestClient, fake) -> None:
    resp = await http.post("/v1/embeddings", json={"model": "org/tiny", "input": ["a b", "a"]})
    assert resp.status == 200
    doc = await resp.json()
    assert doc["model"] == "tiny" and doc["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert [int(np.argmax(d["embedding"])) for d in doc["data"]] == [1, 0]
    sent = fake.calls[0]["request"]
    assert sent.lane == Lane.INTERACTIVE and sent.output.kind == "float32"


async def test_large_requests_go_to_the_batch_lane(http: TestClient, fake) -> None:
    texts = ["w " * 16] * (INTERACTIVE_MAX_TOKENS // 16 + 1)
    resp = await http.post("/v1/embeddings", json={"model": "tiny", "input": texts})
    assert resp.status == 200 and fake.calls[0]["request"].lane == Lane.BATCH


async def test_encoding_and_dimensions_reach_the_mesh(http: TestClient, fake) -> None:
    body = {"model": "tiny", "input": [[5, 6, 7]], "encoding_format": "base64_binary",
            "dimensions": 4}  # fmt: skip
    resp = await http.post("/v1/embeddings", json=body)
    assert resp.status == 200
    sent = fake.calls[0]["request"]
    assert sent.output.kind == "binary" and sent.output.dims == 4
    assert sent.token_ids.dtype == np.int32 and sent.token_ids.tolist() == [5, 6, 7]


async def error_of(resp) -> dict:
    doc = await resp.json()
    assert set(doc) == {"error"} and set(doc["error"]) == {"message", "type", "param", "code"}
    return doc["error"]


async def test_unknown_model_is_404(http: TestClient) -> None:
    resp = await http.post("/v1/embeddings", json={"model": "nope", "input": "x"})
    assert resp.status == 404
    assert (await error_of(resp))["code"] == "model_not_found"


async def test_a_model_seen_before_but_without_workers_now_is_503(http: TestClient, fake) -> None:
    assert (await http.post("/v1/embeddings", json={"model": "tiny", "input": "x"})).status == 200
    fake.served = False
    resp = await http.post("/v1/embeddings", json={"model": "org/tiny", "input": "x"})
    assert resp.status == 503 and (await error_of(resp))["code"] == "unavailable"
    assert (await http.post("/v1/embeddings", json={"model": "nope", "input": "x"})).status == 404


async def test_any_model_is_503_while_no_broker_answers(http: TestClient, fake) -> None:
    fake.brokers[0].alive = False
    resp = await http.post("/v1/embeddings", json={"model": "nope", "input": "x"})
    assert resp.status == 503 and "no broker" in (await error_of(resp))["message"]


async def test_text_over_the_token_limit_is_422(http: TestClient) -> None:
    resp = await http.post("/v1/embeddings", json={"model": "tiny", "input": "w " * 17})
    assert resp.status == 422
    err = await error_of(resp)
    assert err["param"] == "input" and "16" in err["message"]


async def test_auto_truncate_cuts_over_long_inputs(fake: FakeClient) -> None:
    http = await serve(fake, auto_truncate=True)
    try:
        for body in ({"model": "tiny", "input": "w " * 17}, {"model": "tiny", "input": [1] * 20}):
            resp = await http.post("/v1/embeddings", json=body)
            assert resp.status == 200 and (await resp.json())["usage"]["prompt_tokens"] == 16
    finally:
        await http.close()


@pytest.mark.parametrize("auto_truncate", [False, True])
async def test_the_body_s_truncate_is_honoured_over_the_server_s_setting(
    fake: FakeClient, auto_truncate: bool
) -> None:
    http = await serve(fake, auto_truncate=auto_truncate)
    try:
        long = {"model": "tiny", "input": "w " * 17}
        cut = await http.post("/v1/embeddings", json={**long, "truncate": True})
        assert cut.status == 200 and (await cut.json())["usage"]["prompt_tokens"] == 16
        kept = await http.post("/v1/embeddings", json={**long, "truncate": False})
        assert kept.status == 422 and (await error_of(kept))["param"] == "input"
        absent = await http.post("/v1/embeddings", json=long)
        assert absent.status == (200 if auto_truncate else 422)
        bad = await http.post("/v1/embeddings", json={**long, "truncate": "yes"})
        assert bad.status == 422 and (await error_of(bad))["param"] == "truncate"
    finally:
        await http.close()


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.Overloaded("busy", retry_after_s=2.5), 429),
        (errors.Unavailable("lost the broker"), 503),
        (errors.DeadlineExceeded("too slow"), 504),
        (errors.TooLarge("too many tokens to queue"), 413),
        (errors.WorkerFailed("workers died"), 502),
        (errors.InternalError("bug"), 500),
    ],
)
async def test_mesh_errors_become_their_status(http: TestClient, fake, error, status) -> None:
    fake.error = error
    resp = await http.post("/v1/embeddings", json={"model": "tiny", "input": "x"})
    assert resp.status == status
    assert (await error_of(resp))["message"] == error.message
    if status == 429:
        assert resp.headers["Retry-After"] == "3"


async def test_a_body_over_the_limit_is_413(fake: FakeClient) -> None:
    http = await serve(fake, max_body_bytes=1000)
    try:
        resp = await http.post("/v1/embeddings", json={"model": "tiny", "input": "x" * 2000})
        assert resp.status == 413 and "1000 bytes" in (await error_of(resp))["message"]
        resp = await http.post("/v1/embeddings", data=_chunked(b"x" * 4000))  # no length
        assert resp.status == 413
    finally:
        await http.close()


async def _chunked(data: bytes):
    for i in range(0, len(data), 500):
        yield data[i : i + 500]


async def test_malformed_json_is_400(http: TestClient) -> None:
    resp = await http.post("/v1/embeddings", data=b"{nope")
    assert resp.status == 400 and (await error_of(resp))["code"] == "malformed_request"


async def test_unknown_routes_and_methods_answer_in_the_error_shape(http: TestClient) -> None:
    assert (await http.get("/v2/nothing")).status == 404
    resp = await http.get("/v1/embeddings")
    assert resp.status == 405 and (await error_of(resp))["code"] == "method_not_allowed"


async def test_api_key_guards_v1_but_not_health_or_metrics(fake: FakeClient) -> None:
    http = await serve(fake, api_key="sekret")
    try:
        body = {"model": "tiny", "input": "x"}
        resp = await http.post("/v1/embeddings", json=body)
        assert resp.status == 401 and (await error_of(resp))["code"] == "invalid_api_key"
        bad = {"Authorization": "Bearer wrong"}
        assert (await http.post("/v1/embeddings", json=body, headers=bad)).status == 401
        assert (await http.get("/v1/models", headers={"Authorization": "sekret"})).status == 401
        good = {"Authorization": "Bearer sekret"}
        assert (await http.post("/v1/embeddings", json=body, headers=good)).status == 200
        assert (await http.get("/v1/models", headers=good)).status == 200
        assert (await http.get("/health")).status == 200
        assert (await http.get("/metrics")).status == 200
    finally:
        await http.close()


async def test_models_lists_served_models_in_the_openai_shape(http: TestClient) -> None:
    doc = await (await http.get("/v1/models")).json()
    assert doc["object"] == "list" and [m["id"] for m in doc["data"]] == ["tiny"]
    card = doc["data"][0]
    assert card["object"] == "model" and card["owned_by"] == "embedmesh"
    assert card["aliases"] == ["org/tiny"] and card["dimensions"] == 8
    assert (await (await http.get("/v1/models/org/tiny")).json())["id"] == "tiny"
    assert (await http.get("/v1/models/nope")).status == 404


async def test_health_is_green_only_with_a_worker_for_every_model_seen(
    http: TestClient, fake: FakeClient
) -> None:
    resp = await http.get("/health")
    assert resp.status == 200 and (await resp.json())["models"] == {"tiny": 1}
    fake.served = False
    resp = await http.get("/health")
    assert resp.status == 503 and "tiny" in (await resp.json())["reason"]
    fake.brokers[0].alive = False
    resp = await http.get("/health")
    assert resp.status == 503 and (await resp.json())["reason"] == "no broker is reachable"


async def test_health_is_red_before_any_model_is_seen(fake: FakeClient) -> None:
    fake.served = False
    http = await serve(fake)
    try:
        resp = await http.get("/health")
        assert resp.status == 503 and "no worker" in (await resp.json())["reason"]
    finally:
        await http.close()


async def test_metrics_count_requests_errors_tokens_and_show_broker_gauges(
    http: TestClient,
) -> None:
    await http.post("/v1/embeddings", json={"model": "tiny", "input": ["a b c", "d"]})
    await http.post("/v1/embeddings", json={"model": "nope", "input": "x"})
    text = await (await http.get("/metrics")).text()
    for line in [
        'embedmesh_ingress_requests_total{route="/v1/embeddings",status="200"} 1.0',
        'embedmesh_ingress_requests_total{route="/v1/embeddings",status="404"} 1.0',
        'embedmesh_ingress_errors_total{code="model_not_found"} 1.0',
        'embedmesh_ingress_prompt_tokens_total{model="tiny"} 4.0',
        'embedmesh_ingress_inputs_total{model="tiny"} 2.0',
        'embedmesh_broker_up{broker="ipc://fake"} 1.0',
        'embedmesh_broker_queued_tokens{broker="ipc://fake",model="tiny"} 5.0',
        'embedmesh_broker_queued_sequences{broker="ipc://fake",model="tiny"} 2.0',
        'embedmesh_broker_workers{broker="ipc://fake",model="tiny"} 1.0',
        'embedmesh_broker_inflight_batches{broker="ipc://fake"} 3.0',
    ]:
        assert line in text, line
    assert 'embedmesh_ingress_mesh_duration_seconds_count{lane="interactive",model="tiny"}' in text
    assert 'embedmesh_ingress_queue_duration_seconds_count{lane="interactive",model="tiny"}' in text
    assert (
        'embedmesh_ingress_inference_duration_seconds_count{lane="interactive",model="tiny"}'
        in text
    )
    assert "embedmesh_ingress_tokenize_duration_seconds_count 1.0" in text
    assert 'embedmesh_ingress_request_duration_seconds_bucket{le="0.005"' in text


async def test_a_client_that_hangs_up_cancels_its_mesh_call(http: TestClient, fake) -> None:
    fake.block = asyncio.Event()
    request = asyncio.create_task(http.post("/v1/embeddings", json={"model": "tiny", "input": "x"}))
    while not fake.calls:
        await asyncio.sleep(0.01)
    request.cancel()  # closes the connection mid-request
    await asyncio.wait_for(fake.cancelled.wait(), 5)


@pytest.mark.parametrize(
    ("body", "headers", "lane"),
    [
        ({"priority": "batch"}, {}, Lane.BATCH),
        ({}, {"X-Embedmesh-Priority": "batch"}, Lane.BATCH),
        ({"priority": "interactive"}, {"X-Embedmesh-Priority": "batch"}, Lane.INTERACTIVE),
    ],
)
async def test_the_client_can_choose_its_lane(http: TestClient, fake, body, headers, lane) -> None:
    resp = await http.post(
        "/v1/embeddings", json={"model": "tiny", "input": "x", **body}, headers=headers
    )
    assert resp.status == 200 and fake.calls[0]["request"].lane == lane


async def test_a_large_request_asking_for_the_interactive_lane_gets_it(
    http: TestClient, fake
) -> None:
    texts = ["w " * 16] * (INTERACTIVE_MAX_TOKENS // 16 + 1)
    body = {"model": "tiny", "input": texts, "priority": "interactive"}
    assert (await http.post("/v1/embeddings", json=body)).status == 200
    assert fake.calls[0]["request"].lane == Lane.INTERACTIVE


async def test_an_invalid_priority_header_is_422_naming_it(http: TestClient, fake) -> None:
    headers = {"X-Embedmesh-Priority": "urgent"}
    resp = await http.post("/v1/embeddings", json={"model": "tiny", "input": "x"}, headers=headers)
    err = await error_of(resp)
    assert resp.status == 422 and err["param"] == "X-Embedmesh-Priority" and not fake.calls


async def test_timings_are_returned_only_when_asked(http: TestClient) -> None:
    body = {"model": "tiny", "input": "a b"}
    resp = await http.post("/v1/embeddings", json=body)
    assert resp.status == 200 and "x-embedmesh-timings" not in resp.headers
    resp = await http.post("/v1/embeddings", json=body, headers={"X-Embedmesh-Timings": "1"})
    hops = dict(part.split("=") for part in resp.headers["x-embedmesh-timings"].split(","))
    assert list(hops) == [
        "worker_compute", "ingress_parse", "ingress_tokenize", "ingress_render", "ingress_total",
    ]  # fmt: skip
    assert float(hops["worker_compute"]) == 0.5  # the mesh's hops pass through as reported
    assert all(
        0 <= float(hops[k]) <= float(hops["ingress_total"]) for k in hops if k != "worker_compute"
    )


async def test_dimensions_over_the_width_are_422_naming_the_field(http: TestClient, fake) -> None:
    for inp in ("x", [1, 2]):
        resp = await http.post(
            "/v1/embeddings", json={"model": "tiny", "input": inp, "dimensions": 9}
        )
        err = await error_of(resp)
        assert resp.status == 422 and err["param"] == "dimensions" and "8" in err["message"]
    assert not fake.calls


async def test_a_prompt_name_puts_its_prompt_before_every_text(http: TestClient, fake) -> None:
    body = {"model": "tiny", "input": ["a b", "a"], "prompt_name": "query"}
    resp = await http.post("/v1/embeddings", json=body)
    assert resp.status == 200
    # The fake embeds a one-hot of the token count: two prompt words more each.
    assert [int(np.argmax(d["embedding"])) for d in (await resp.json())["data"]] == [3, 2]


async def test_an_unknown_prompt_name_is_422_naming_the_prompts(http: TestClient, fake) -> None:
    body = {"model": "tiny", "input": "a", "prompt_name": "passage"}
    resp = await http.post("/v1/embeddings", json=body)
    err = await error_of(resp)
    assert resp.status == 422 and err["param"] == "prompt_name"
    assert "'passage'" in err["message"] and "'query'" in err["message"]
    assert not fake.calls


async def test_a_prompt_name_with_token_ids_is_422(http: TestClient, fake) -> None:
    body = {"model": "tiny", "input": [[1, 2]], "prompt_name": "query"}
    resp = await http.post("/v1/embeddings", json=body)
    err = await error_of(resp)
    assert resp.status == 422 and err["param"] == "prompt_name" and "token ids" in err["message"]
    assert not fake.calls


async def test_the_model_card_lists_its_prompts(http: TestClient) -> None:
    card = await (await http.get("/v1/models/tiny")).json()
    assert card["prompts"] == {"query": "query: find "} and card["default_prompt_name"] is None


async def test_token_ids_outside_the_vocabulary_are_422(http: TestClient, fake) -> None:
    resp = await http.post("/v1/embeddings", json={"model": "tiny", "input": [[1, 2], [3, 100]]})
    err = await error_of(resp)
    assert resp.status == 422 and err["param"] == "input" and "0..99" in err["message"]
    assert not fake.calls


async def test_a_body_that_is_not_the_gzip_it_claims_is_400_in_the_error_shape(
    http: TestClient, fake
) -> None:
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    resp = await http.post("/v1/embeddings", data=b'{"model": "tiny"}', headers=headers)
    err = await error_of(resp)
    assert resp.status == 400 and err["code"] == "malformed_request"
    assert "gzip" in err["message"] and not fake.calls


async def test_a_gzip_body_that_inflates_over_the_limit_is_413(fake: FakeClient) -> None:
    http = await serve(fake, max_body_bytes=1 << 20)
    try:
        bomb = gzip.compress(b'{"model": "tiny", "input": "' + b"a " * (1 << 20) + b'"}')
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
        resp = await http.post("/v1/embeddings", data=bomb, headers=headers)
        assert resp.status == 413 and (await error_of(resp))["code"] == "request_too_large"
    finally:
        await http.close()


async def test_an_http10_post_without_content_length_is_400_in_the_error_shape(
    http: TestClient,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", http.server.port)
    try:
        writer.write(
            b"POST /v1/embeddings HTTP/1.0\r\nContent-Type: application/json\r\n\r\n"
            b'{"model": "tiny", "input": "x"}'
        )
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400") and b"application/json" in head
    err = orjson.loads(body)["error"]
    assert err["code"] == "malformed_request" and "Content-Length" in err["message"]


async def test_a_model_unserved_past_the_window_leaves_health_and_becomes_unknown(
    http: TestClient, fake: FakeClient
) -> None:
    assert (await http.get("/health")).status == 200
    fake.served = False
    assert (await http.get("/health")).status == 503  # gone now: maybe a restart
    fake.seen.forget_after_s = 0.0  # as if FORGET_UNSERVED_AFTER_S had passed
    doc = await (await http.get("/health")).json()
    assert doc["models"] == {} and "no worker has announced" in doc["reason"]
    resp = await http.post("/v1/embeddings", json={"model": "tiny", "input": "x"})
    assert resp.status == 404
