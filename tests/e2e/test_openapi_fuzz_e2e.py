"""A schema-driven fuzz of every route through a real ingress process and a real mesh:
bodies generated from ``/openapi.json``'s request schemas, then bodies whose described fields
hold any JSON, then bytes that are not JSON. Whatever comes in, no answer is a 5xx, every error
has its route family's shape, and every answer's body and headers match the description.

Why strategies built from the description by ``test_openapi.bodies_of`` rather than
schemathesis or hypothesis-jsonschema: the description uses a small subset of JSON Schema
(types, enums, bounds, oneOf/anyOf) that 30 lines turn into strategies; hypothesis-jsonschema
0.23 breaks on the hypothesis we use (it calls a removed internal), and schemathesis brings its
own runner, HTTP stack and pins for what this file does.

The mesh serves one model of each kind, tiny and random (an embedder, a re-ranker, a classifier
of three labels, a SPLADE model), and the generated bodies and headers name them (or no model,
or an unknown one), so the fuzz reaches every route's happy path as well as its refusals.
Bounded: ``EXAMPLES`` bodies per route and strategy, ``--max-inputs 8``; about 25 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_schema_validator import OAS30Validator

from mesh.ingress.openapi import OPERATIONS, TIMINGS_HEADER, Operation
from mesh.ingress.schema import PRIORITY_HEADER
from mesh.ingress.tei import MODEL_HEADER
from tests.e2e.conftest import Ingress
from tests.integration.conftest import Mesh
from tests.st_models import build_cross_encoder, build_splade, build_st_model, build_tiny_bert
from tests.unit.ingress.test_openapi import bodies_of, inline_refs

EMBEDDER, RERANKER, CLASSIFIER, SPARSE = "tiny-st", "tiny-ce", "tiny-cls", "tiny-splade"
NAMES = [EMBEDDER, RERANKER, CLASSIFIER, SPARSE]
# Per route and strategy; EMBEDMESH_FUZZ_EXAMPLES=500 for a deeper run by hand.
EXAMPLES = int(os.environ.get("EMBEDMESH_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no .hypothesis/ in the checkout; a failure prints its example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
POSTS = [op for op in OPERATIONS if op.body is not None]
GETS = [op for op in OPERATIONS if op.method == "get"]
JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


@dataclass
class Served:
    url: str
    doc: dict

    def call(self, method: str, path: str, body: bytes | None, headers: dict[str, str]):  # noqa: ANN201
        """(status, headers, body). A 503 is asked again once the mesh is healthy: the test
        heartbeats (1 s of silence) can lose a link for a moment on a loaded 2-core machine,
        and that is the mesh's honest answer, not the request's doing; a request that kills a
        worker stays 503 (nothing restarts it here) and fails the test."""
        status, got, data = self._call(method, path, body, headers)
        if status == 503 and self._healthy():
            status, got, data = self._call(method, path, body, headers)
        return status, got, data

    def _healthy(self, timeout_s: float = 10) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, _, doc = self._call("get", "/health", None, {})
            if status == 200 and set(json.loads(doc)["models"]) >= set(NAMES):
                return True
            time.sleep(0.2)
        return False

    def _call(self, method: str, path: str, body: bytes | None, headers: dict[str, str]):  # noqa: ANN202
        req = urllib.request.Request(self.url + path, data=body, method=method.upper())
        req.add_header("Content-Type", "application/json")
        for name, value in headers.items():
            req.add_header(name, value)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("fuzz-models")
    bert = build_tiny_bert(root / "bert")
    build_cross_encoder(root / "cls", num_labels=3, seed=11)
    dirs = {
        EMBEDDER: build_st_model(bert, root / EMBEDDER, prompts={"query": "query: "}),
        RERANKER: build_cross_encoder(root / RERANKER),
        CLASSIFIER: root / "cls-hf",
        SPARSE: build_splade(root / SPARSE),
    }
    mesh = Mesh(tmp_path_factory.mktemp("fuzz-mesh"))
    mesh.start_broker()
    for name, path in dirs.items():
        mesh.start_worker("--model", str(path), "--served-name", name)
    ingress = Ingress(mesh, "--max-inputs", "8")
    try:
        ingress.wait_health()
        doc = _wait_for_models(ingress.url, mesh)
        yield Served(ingress.url, doc)
        assert ingress.stop() == 0, mesh.logs()
    finally:
        ingress.stop()
        mesh.stop()


def _wait_for_models(url: str, mesh: Mesh, timeout_s: float = 90) -> dict:
    """The description, once every model has a worker."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:
            names = {m["id"] for m in json.loads(resp.read())["data"]}
        if names >= set(NAMES):
            with urllib.request.urlopen(f"{url}/openapi.json", timeout=5) as resp:
                return json.loads(resp.read())
        time.sleep(0.2)
    raise TimeoutError(f"not every model registered\n{mesh.logs()}")


def check(served: Served, op: Operation, status: int, headers, body: bytes) -> None:  # noqa: ANN001
    """No 5xx; the body matches the description's schema for its status (errors: the family's
    shape), and it carries the headers the description says it always sends."""
    assert status < 500, (op.path, status, body[:500])
    responses = served.doc["paths"][op.path][op.method]["responses"]
    response = inline_refs(served.doc, responses.get(str(status), responses["default"]))
    content = response.get("content", {})
    if "application/json" in content:
        OAS30Validator(content["application/json"]["schema"]).validate(json.loads(body))
    for name, header in response.get("headers", {}).items():
        assert name in headers or not header.get("required"), (op.path, name)


def _with_model(body: object, name: str | None) -> object:
    if isinstance(body, dict) and name is not None and "model" in body:
        return {**body, "model": name}
    return body


def _headers(
    op: Operation, model: str | None, priority: str | None, timings: bool = False
) -> dict[str, str]:
    headers = {TIMINGS_HEADER: "1"} if timings and TIMINGS_HEADER in op.headers else {}
    if MODEL_HEADER in op.headers and model is not None:
        headers[MODEL_HEADER] = model
    if PRIORITY_HEADER in op.headers and priority is not None:
        headers[PRIORITY_HEADER] = priority
    return headers


MODEL_CHOICES = st.sampled_from([*NAMES, None, "no-such-model"])
PRIORITY_CHOICES = st.sampled_from([None, "interactive", "batch", " Batch ", "urgent"])


@pytest.mark.parametrize("op", POSTS, ids=lambda op: op.path)
def test_bodies_the_description_allows_get_no_5xx(served: Served, op: Operation) -> None:
    schema = inline_refs(served.doc, served.doc["components"]["schemas"][op.body])
    # Bodies of the required fields alone too: each optional field may be one the model
    # refuses (a prompt it lacks, dimensions over its width), so few full bodies reach a 200.
    required = {k: v for k, v in schema["properties"].items() if k in schema.get("required", ())}

    @FUZZ
    @given(
        bodies_of(schema) | bodies_of({**schema, "properties": required}),
        MODEL_CHOICES,
        PRIORITY_CHOICES,
        st.booleans(),
    )
    def run(body: object, model: str | None, priority: str | None, timings: bool) -> None:
        data = json.dumps(_with_model(body, model)).encode()
        headers = _headers(op, model, priority, timings)
        check(served, op, *served.call(op.method, op.path, data, headers))

    run()


@pytest.mark.parametrize("op", POSTS, ids=lambda op: op.path)
def test_described_fields_holding_any_json_get_no_5xx(served: Served, op: Operation) -> None:
    props = sorted(served.doc["components"]["schemas"][op.body]["properties"])
    bodies = st.dictionaries(st.sampled_from(props), JSON_VALUES, max_size=len(props))

    @FUZZ
    @given(body=bodies | JSON_VALUES, model=MODEL_CHOICES)
    def run(body: object, model: str | None) -> None:
        data = json.dumps(body).encode()
        check(served, op, *served.call(op.method, op.path, data, _headers(op, model, None)))

    run()


@pytest.mark.parametrize("op", POSTS, ids=lambda op: op.path)
def test_bytes_that_are_not_json_get_no_5xx(served: Served, op: Operation) -> None:
    @FUZZ
    @given(data=st.binary(max_size=64) | st.text(max_size=32).map(str.encode))
    def run(data: bytes) -> None:
        check(served, op, *served.call(op.method, op.path, data, _headers(op, EMBEDDER, None)))

    run()


@pytest.mark.parametrize("op", GETS, ids=lambda op: op.path)
def test_get_routes_answer_as_described(served: Served, op: Operation) -> None:
    # A path parameter from its examples and from hypothesis; the model header as above.
    values = {"{model}": [*NAMES, "org/unknown"], "{name}": ["swagger-ui.css", "nope.js"]}
    params = next((v for k, v in values.items() if k in op.path), [""])

    @settings(FUZZ, max_examples=10)
    @given(value=st.sampled_from(params) | st.text(min_size=1, max_size=12), model=MODEL_CHOICES)
    def run(value: str, model: str | None) -> None:
        path = op.path
        for key in values:
            path = path.replace(key, urllib.parse.quote(value, safe=""))
        check(served, op, *served.call("get", path, None, _headers(op, model, None)))

    run()
