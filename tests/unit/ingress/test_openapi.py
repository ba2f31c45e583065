"""The OpenAPI description against the app that serves it: every served route described and every
described route served, a valid OpenAPI 3.0 document, error families and the API key as the
app applies them, and ``/docs`` with its assets served from the installed package (no network)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate
from yarl import URL

from mesh.errors import MeshError
from mesh.ingress import contextualized, docs_page, multivector
from mesh.ingress.app import create_app
from mesh.ingress.batches import CreateBatchRequest
from mesh.ingress.bodies import IGNORED, decode, field_rules, plan_of
from mesh.ingress.config import IngressConfig
from mesh.ingress.docs_page import ASSETS
from mesh.ingress.http_errors import TEI, ApiError
from mesh.ingress.openapi import OPERATIONS, Operation, document
from mesh.ingress.openapi_bodies import REQUESTS
from mesh.ingress.rerank import parse_v1_rerank_request
from mesh.ingress.schema import parse_embeddings_request
from mesh.ingress.tei_schema import (
    parse_decode_request,
    parse_embed_request,
    parse_predict_request,
    parse_rerank_request,
    parse_sparse_request,
    parse_tokenize_request,
)
from tests.unit.ingress.test_ingress_app import FakeClient, serve

KEY = "k"
# A concrete path for each templated one, to call it.
EXAMPLE_PATHS = {"/v1/models/{model}": "/v1/models/tiny", "/docs/static/{name}":
                 "/docs/static/swagger-ui.css"}  # fmt: skip


def served_routes(app: web.Application) -> dict[tuple[str, str], str | None]:
    """(method, path template) → route name of what the router really serves. HEAD is left
    out: aiohttp adds it beside every GET."""
    routes = {}
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        # DynamicResource's canonical drops the regex: "/v1/models/{model:.+}" → "{model}".
        path = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.resource.canonical)
        routes[(route.method.lower(), path)] = route.name
    return routes


@pytest.fixture
def app() -> web.Application:
    return create_app(IngressConfig(brokers=["ipc://fake"]), FakeClient())  # type: ignore[arg-type]


@pytest.fixture
async def keyed(fake: FakeClient) -> AsyncIterator[TestClient]:
    client = await serve(fake, api_key=KEY)
    yield client
    await client.close()


@pytest.fixture
def fake() -> FakeClient:
    return FakeClient()


def test_every_served_route_is_described_and_every_described_route_served(app) -> None:
    doc = document(IngressConfig(brokers=["ipc://fake"]))
    described = {(method, path) for path, item in doc["paths"].items() for method in item}
    served = set(served_routes(app))
    assert served - described == set(), "served but not in mesh/ingress/openapi.py"
    assert described - served == set(), "described but not served"


@pytest.mark.parametrize("api_key", [None, KEY])
def test_the_document_is_valid_openapi(api_key: str | None) -> None:
    validate(document(IngressConfig(brokers=["ipc://fake"], api_key=api_key)))


def test_error_family_follows_the_route_name_as_http_errors_does(app) -> None:
    names = served_routes(app)
    for op in OPERATIONS:
        name = names[(op.method, op.path)]
        is_tei = name is not None and name.startswith(f"{TEI}.")
        assert (op.family == TEI) == is_tei, op.path


def test_limits_come_from_the_settings() -> None:
    doc = document(IngressConfig(brokers=["ipc://fake"], max_inputs=7))
    texts = doc["components"]["schemas"]["TeiRerankRequest"]["properties"]["texts"]
    assert texts["maxItems"] == 7


async def test_openapi_and_docs_need_no_key_and_work_offline(keyed: TestClient) -> None:
    resp = await keyed.get("/openapi.json")
    assert resp.status == 200 and (await resp.json())["openapi"].startswith("3.0")
    page = await keyed.get("/docs")
    html = await page.text()
    assert page.status == 200 and page.content_type == "text/html"
    # Every asset the page loads is ours and answers; nothing points off the server.
    linked = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert linked and all(link.startswith("docs/static/") for link in linked)
    assert "http://" not in html and "https://" not in html
    for link in linked:
        asset = await keyed.get("/" + link)
        assert asset.status == 200 and len(await asset.read()) > 0, link
    for name, content_type in ASSETS.items():
        asset = await keyed.get(f"/docs/static/{name}")
        assert asset.status == 200 and asset.content_type == content_type, name


async def test_docs_with_a_slash_answers_the_same_page_with_links_that_resolve(
    keyed: TestClient,
) -> None:
    page = await keyed.get("/docs/")
    html = await page.text()
    assert page.status == 200 and page.content_type == "text/html"
    linked = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert linked and all(link.startswith("static/") for link in linked)
    spec = re.search(r'url: "([^"]+)"', html)
    assert spec is not None
    for link in [*linked, spec.group(1)]:  # as a browser resolves them against /docs/
        resolved = URL("/docs/").join(URL(link))
        assert (await keyed.get(str(resolved))).status == 200, link
    assert str(URL("/docs/").join(URL(spec.group(1)))) == "/openapi.json"


async def test_without_the_asset_package_the_page_is_503_and_the_rest_serves(
    keyed: TestClient, monkeypatch
) -> None:
    monkeypatch.setattr(docs_page, "ASSET_DIR", None)
    for path in ("/docs", "/docs/", "/docs/static/swagger-ui.css"):
        resp = await keyed.get(path)
        assert resp.status == 503 and "swagger-ui-bundle" in (await resp.json())["error"]["message"]
    assert (await keyed.get("/openapi.json")).status == 200


async def test_an_asset_outside_the_list_is_404(keyed: TestClient) -> None:
    for name in ("swagger-ui.js.map", "..%2F..%2Fapp.py", "index.html"):
        resp = await keyed.get(f"/docs/static/{name}")
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "not_found"


async def test_the_key_guards_exactly_the_operations_the_document_says(keyed: TestClient) -> None:
    doc = document(IngressConfig(brokers=["ipc://fake"], api_key=KEY))
    for path, item in doc["paths"].items():
        for method, op in item.items():
            url = EXAMPLE_PATHS.get(path, path)
            resp = await keyed.request(method, url, json={})
            guarded = op["security"] == [{"bearer": []}]
            assert (resp.status == 401) == guarded, (method, path, resp.status)
            assert ("401" in op["responses"]) == guarded, (method, path)


def inline_refs(doc: dict, node: object) -> object:
    """``node`` with every ``$ref`` replaced by what it points to in ``doc`` (KeyError when it
    points nowhere): plain JSON Schema, for validators and generators that do not follow
    OpenAPI's component references. The description has no recursive schema."""
    if isinstance(node, list):
        return [inline_refs(doc, item) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target: object = doc
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]  # type: ignore[index]
        return inline_refs(doc, target)
    return {key: inline_refs(doc, value) for key, value in node.items()}


def test_every_reference_points_somewhere() -> None:
    # The spec validator resolves references lazily and lets a dangling one pass.
    doc = document(IngressConfig(brokers=["ipc://fake"], api_key=KEY))
    inline_refs(doc, doc["paths"])


def bodies_of(schema: dict) -> SearchStrategy[object]:
    """Values valid under ``schema``, for the keywords the description uses."""
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return st.one_of([bodies_of(s) for s in schema[key]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema["type"]
    low, high = schema.get("minimum"), schema.get("maximum")
    if kind == "object":
        props = {name: bodies_of(s) for name, s in schema["properties"].items()}
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: v for k, v in props.items() if k in required},
            optional={k: v for k, v in props.items() if k not in required},
        )
    if kind == "array":
        size = min(schema.get("maxItems", 10), 10)
        return st.lists(bodies_of(schema["items"]), min_size=schema.get("minItems", 0),
                        max_size=size)  # fmt: skip
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=40)
    if kind == "integer":
        return st.integers(min_value=low, max_value=high)
    if kind == "number":
        return st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False)
    assert kind == "boolean", schema
    return st.booleans()


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.body], ids=lambda op: op.path)
def test_generated_bodies_are_valid_under_their_schema(op: Operation) -> None:
    """The fuzz's generator (tests/e2e/test_openapi_fuzz_e2e.py) covers every keyword the
    request schemas use and stays inside them."""
    doc = document(IngressConfig(brokers=["ipc://fake"], max_inputs=8))
    schema = inline_refs(doc, doc["components"]["schemas"][op.body])
    validator = OAS30Validator(schema)

    @settings(max_examples=25, deadline=None)
    @given(bodies_of(schema))
    def run(body: object) -> None:
        validator.validate(body)

    run()


# Each body's parsing, as its handler does it (bytes in; what the handler reads of the object).
PARSERS: dict[str, Callable[[bytes], object]] = {
    "EmbeddingsRequest": lambda b: parse_embeddings_request(b, 8),
    "ContextualizedRequest": lambda b: contextualized.parse_contextualized_request(b),
    "RerankRequest": lambda b: parse_v1_rerank_request(b, 8),
    "TeiEmbedRequest": lambda b: parse_embed_request(b, 8),
    "TeiEmbedAllRequest": lambda b: multivector.parse_request(b, 8, roles=False),
    "TeiEmbedMultivectorRequest": lambda b: multivector.parse_request(b, 8, roles=True),
    "TeiSparseRequest": lambda b: parse_sparse_request(b, 8),
    "TeiTokenizeRequest": lambda b: parse_tokenize_request(b, 8),
    "TeiDecodeRequest": lambda b: parse_decode_request(b, 8),
    "TeiRerankRequest": lambda b: parse_rerank_request(b, 8),
    "TeiPredictRequest": lambda b: parse_predict_request(b, 8),
    "CreateBatchRequest": lambda b: decode(CreateBatchRequest, b, 8),
}


def undescribed(name: str) -> set[str]:
    """The fields a body declares but leaves out of its schema: those a sibling route serves
    and this one refuses (/embed_all's and /embed_multivector's normalize and dimensions)."""
    return {key for key, rule in field_rules(REQUESTS[name]).items() if not rule.described}


def test_every_body_of_an_operation_has_a_declaration_and_a_parser() -> None:
    assert {op.body for op in OPERATIONS if op.body} == set(REQUESTS) == set(PARSERS)
    assert undescribed("TeiEmbedAllRequest") == {"normalize", "dimensions"}
    # What happens to a field a body does not declare is said where a client reads the body.
    schemas = document(IngressConfig(brokers=["ipc://fake"]))["components"]["schemas"]
    assert all(IGNORED in schemas[name]["description"] for name in REQUESTS)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_the_fields_a_parser_reads_are_the_fields_described(name: str) -> None:
    """The keys the decoder checks are the keys the schema describes (but those a route
    refuses, said in its description), and every body valid under the schema is read with
    the values it gave."""
    doc = document(IngressConfig(brokers=["ipc://fake"], max_inputs=8))
    schema = inline_refs(doc, doc["components"]["schemas"][name])
    assert set(plan_of(REQUESTS[name]).checks) - undescribed(name) == set(schema["properties"])

    @settings(max_examples=60, deadline=None)
    @given(bodies_of(schema))
    def run(body: dict) -> None:
        # The schema cannot say everything (a prompt with token ids, Perplexity's counts).
        with contextlib.suppress(ApiError, MeshError):
            PARSERS[name](json.dumps({**body, "an_unknown_field": [1]}).encode())

    run()


# A small valid body of each kind, to break one field of at a time.
VALID: dict[str, dict] = {
    "EmbeddingsRequest": {"model": "m", "input": "x"},
    "ContextualizedRequest": {"model": "m", "input": [["x"]]},
    "RerankRequest": {"model": "m", "query": "q", "documents": ["a"]},
    "TeiEmbedRequest": {"inputs": "x"},
    "TeiEmbedAllRequest": {"inputs": "x"},
    "TeiEmbedMultivectorRequest": {"inputs": "x"},
    "TeiSparseRequest": {"inputs": "x"},
    "TeiTokenizeRequest": {"inputs": "x"},
    "TeiDecodeRequest": {"ids": [1]},
    "TeiRerankRequest": {"query": "q", "texts": ["a"]},
    "TeiPredictRequest": {"inputs": "x"},
    "CreateBatchRequest": {"input_file_id": "file-1", "endpoint": "/v1/embeddings"},
}


def breaking(schema: dict) -> list[tuple[object, int]]:
    """Values outside ``schema``, each with the status its refusal has: a wrong JSON type, and
    one past each bound the schema states (its enum, minimum, maximum, lengths, item counts)."""
    wrong_type = "not an object" if schema.get("type") == "object" else {"not": "this"}
    out: list[tuple[object, int]] = [(wrong_type, 422)]
    if "maxProperties" in schema:
        out.append(({str(i): "v" for i in range(schema["maxProperties"] + 1)}, 422))
    if schema.get("type") in ("string", "boolean"):
        out.append((7, 422))
    if "enum" in schema:
        out.append(("none-of-these", 422))
    if schema.get("minLength"):
        out.append(("", 422))
    if "minimum" in schema:
        out.append((schema["minimum"] - 1, 422))
    if "maximum" in schema:
        out.append((schema["maximum"] + 1, 422))
    if schema.get("type") == "integer":
        out += [(1.5, 422), (True, 422)]
    if schema.get("type") == "array" and "maxItems" in schema:
        item = "a" if schema["items"].get("type") == "string" else ["a"]
        out.append(([item] * (schema["maxItems"] + 1), 413))
    return out


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_a_body_breaking_each_described_bound_is_refused_naming_the_field(name: str) -> None:
    """The schema comes from the declaration that checks: every bound it describes is one the
    parser enforces, with the field named and its status (422 a wrong value, 413 too many)."""
    schema = document(IngressConfig(brokers=["ipc://fake"], max_inputs=8))["components"]["schemas"][
        name
    ]
    PARSERS[name](orjson.dumps(VALID[name]))
    checked = 0
    for key, prop in schema["properties"].items():
        for value, status in breaking(prop):
            with pytest.raises((ApiError, MeshError)) as err:
                PARSERS[name](orjson.dumps({**VALID[name], key: value}))
            exc = err.value
            api = exc if isinstance(exc, ApiError) else ApiError.from_mesh(exc)
            assert (api.status, api.param) == (status, key), (key, value, api)
            checked += 1
    assert checked >= len(schema["properties"])
