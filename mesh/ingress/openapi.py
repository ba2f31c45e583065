"""The OpenAPI 3.0 description of every route the ingress serves, served at ``GET /openapi.json``
(``mesh.ingress.docs_page``): the operations here, their bodies in ``openapi_bodies``.

Written as data beside the parsers it describes (limits and enums are read from them); the
route list is checked against the app's router by ``tests/unit/ingress/test_openapi.py``, so a
route added without a description fails it, and ``tests/e2e/test_openapi_fuzz_e2e.py`` posts
bodies generated from it to a real mesh and checks every answer against it.

Why 3.0.3 and not 3.1: the offline page is the Swagger UI that the ``swagger-ui-bundle``
package ships (4.x), which renders 3.0 only.

Each operation carries its error family (``x-error-family``): OpenAI's ``{"error": {...}}`` or
TEI's ``{"error", "error_type"}`` (``http_errors.route_family``: routes named ``tei.*``), and
whether the API key guards it (``app._auth``: ``/v1/*``, ``/v2/*`` and TEI's routes).
``/health``, ``GET /``, ``/metrics``, ``/openapi.json`` and ``/docs`` stay open, so that probes
and a person reading the API need no key. With no ``--api-key`` no operation asks for one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mesh.ingress.bodies import IGNORED
from mesh.ingress.config import IngressConfig
from mesh.ingress.http_errors import OPENAI, TEI
from mesh.ingress.openapi_bodies import NUM, STR, TEXT, Schema, array, bodies, ref
from mesh.ingress.schema import PRIORITIES, PRIORITY_HEADER
from mesh.ingress.tei import MODEL_HEADER, VERSION

JSON = "application/json"

# The TEI timing headers every embedding, rerank and predict response carries (tei.timing_headers).
TIMING_HEADERS = {
    "x-compute-time": "handler start to response built, ms",
    "x-total-time": "the same as x-compute-time, ms",
    "x-tokenization-time": "model resolved, request validated and tokenized, ms",
    "x-queue-time": "the longest broker queue wait of the request's sequences, ms",
    "x-inference-time": "worker compute of the batches that carried the request, ms",
    "x-compute-tokens": "tokens embedded or scored",
    "x-compute-characters": "characters of the texts (or ids given as ids)",
}
# app.TIMINGS_HEADER, which cannot be imported here: app imports this module (via docs_page).
TIMINGS_HEADER = "X-Embedmesh-Timings"
STATUS_TEXT = {
    400: "The body cannot be read as a JSON object (TEI: an empty input is 400 `Empty`).",
    401: "No or wrong API key.",
    404: "Unknown model (or, under /docs/static, asset; on /v1/files and /v1/batches, file or "
    "batch).",
    409: "The file or batch is not in a state that allows it (cancel a finished batch, delete "
    "the input of a running one).",
    413: "Over a size limit: body bytes, --max-inputs, tokens the broker may queue.",
    422: "A value breaks the contract (wrong type or range, unknown enum, over the token limit, "
    "a model that does not serve this route).",
    424: "The mesh failed on the request (workers kept failing, a malformed reply).",
    429: "The broker's queue for the model is full; retry after `Retry-After` seconds.",
    502: "The mesh failed on the request (workers kept failing, a malformed reply).",
    503: "No broker answers, or the model has no worker now.",
    504: "The request's deadline (--request-timeout) passed.",
    507: "The server's batch storage is full (--max-state-bytes).",
}


@dataclass(frozen=True)
class Operation:
    """One route and method: its family (error shape, auth) and what it takes and answers."""

    method: str
    path: str
    op_id: str
    summary: str
    family: str = OPENAI
    body: str | None = None  # a schema name
    form: str | None = None  # a multipart/form-data body's schema name
    ok: Schema | None = None  # the 200 body's schema; None: no JSON body
    ok_type: str = JSON
    errors: tuple[int, ...] = ()
    headers: tuple[str, ...] = ()  # request header parameters (components.parameters)
    timed: bool = False  # sends TEI's timing headers
    guarded: bool = True  # needs the API key when one is set
    tags: tuple[str, ...] = field(default=("OpenAI",))


_WORK = (400, 413, 422, 429, 503, 504)  # a request that goes through the mesh
_OPENAI_WORK = (*_WORK, 404, 502)
_TEI_WORK = (*_WORK, 424)
_TEI_TOOLS = (400, 413, 422, 503)  # the ingress's own tokenizer: no mesh round trip
_TEI_HEADERS = (MODEL_HEADER, PRIORITY_HEADER)
_FILES = (400, 404, 503)  # the Files and Batches routes: a wrong value, an unknown id, no store
_OPEN = {"guarded": False, "tags": ("Service",)}
_TEI_TAGS = {"family": TEI, "tags": ("TEI",)}

OPERATIONS: tuple[Operation, ...] = (
    Operation("post", "/v1/embeddings", "createEmbeddings", "Embed texts or token ids (OpenAI)",
              body="EmbeddingsRequest", ok=ref("EmbeddingsResponse"), errors=_OPENAI_WORK,
              headers=(PRIORITY_HEADER, TIMINGS_HEADER), timed=True),
    Operation("get", "/v1/models", "listModels", "The models served now", ok=ref("ModelList"),
              errors=(503,)),
    Operation("get", "/v1/models/{model}", "getModel", "One model, by served name or alias",
              ok=ref("Model"), errors=(404, 503)),
    Operation("post", "/v1/rerank", "rerank", "Rerank documents (Cohere, Jina, vLLM shape)",
              body="RerankRequest", ok=ref("RerankResponse"), errors=_OPENAI_WORK,
              headers=(PRIORITY_HEADER,), timed=True, tags=("Rerank",)),
    Operation("post", "/v2/rerank", "rerankV2", "Rerank documents (Cohere v2's path)",
              body="RerankRequest", ok=ref("RerankResponse"), errors=_OPENAI_WORK,
              headers=(PRIORITY_HEADER,), timed=True, tags=("Rerank",)),
    Operation("post", "/v1/contextualizedembeddings", "createContextualizedEmbeddings",
              "One vector per chunk, each embedded inside its document (Perplexity)",
              body="ContextualizedRequest", ok=ref("ContextualizedResponse"),
              errors=_OPENAI_WORK, headers=(PRIORITY_HEADER,), timed=True),
    Operation("post", "/v1/files", "createFile", "Upload a batch input file (multipart, "
              "purpose=batch)", form="FileUpload",
              ok=ref("File"), errors=_FILES + (413, 507), tags=("Batch",)),
    Operation("get", "/v1/files", "listFiles", "Stored files, newest first (limit, after, "
              "purpose)", ok=ref("FileList"), errors=_FILES, tags=("Batch",)),
    Operation("get", "/v1/files/{file_id}", "getFile", "One file's object", ok=ref("File"),
              errors=_FILES, tags=("Batch",)),
    Operation("get", "/v1/files/{file_id}/content", "getFileContent", "A file's bytes "
              "(JSONL)", ok_type="application/octet-stream", errors=_FILES, tags=("Batch",)),
    Operation("delete", "/v1/files/{file_id}", "deleteFile", "Delete a file",
              ok=ref("FileDeleted"), errors=(*_FILES, 409), tags=("Batch",)),
    Operation("post", "/v1/batches", "createBatch", "Run a file of /v1/embeddings requests "
              "on the batch lane", body="CreateBatchRequest", ok=ref("Batch"),
              errors=(*_FILES, 409, 413), tags=("Batch",)),
    Operation("get", "/v1/batches", "listBatches", "Batches, newest first (limit, after)",
              ok=ref("BatchList"), errors=_FILES, tags=("Batch",)),
    Operation("get", "/v1/batches/{batch_id}", "getBatch", "One batch, with its progress",
              ok=ref("Batch"), errors=_FILES, tags=("Batch",)),
    Operation("post", "/v1/batches/{batch_id}/cancel", "cancelBatch", "Cancel a batch "
              "(cancelling, then cancelled)", ok=ref("Batch"), errors=(*_FILES, 409),
              tags=("Batch",)),
    Operation("get", "/health", "health", "200 when a broker answers and every model seen has "
              "a worker, else 503", ok=ref("Health"), errors=(503,), **_OPEN),
    Operation("get", "/", "teiHealth", "The same as /health (TEI's health route)",
              ok=ref("Health"), errors=(503,), **_OPEN),
    Operation("get", "/metrics", "metrics", "Prometheus metrics", ok_type="text/plain", **_OPEN),
    Operation("get", "/openapi.json", "openapi", "This description", ok={"type": "object"},
              **_OPEN),
    Operation("get", "/docs", "docs", "The API's page (Swagger UI, served offline)",
              ok_type="text/html", **_OPEN),
    Operation("get", "/docs/", "docsSlash", "The same page as /docs", ok_type="text/html",
              **_OPEN),
    Operation("get", "/docs/static/{name}", "docsAsset", "The page's scripts and styles",
              ok_type="application/octet-stream", errors=(404,), **_OPEN),
    Operation("post", "/", "teiRoot", "Embed (TEI's POST /, as InferenceClient sends it)",
              body="TeiEmbedRequest", ok=array(array(NUM)), errors=_TEI_WORK,
              headers=_TEI_HEADERS, timed=True, **_TEI_TAGS),
    Operation("post", "/embed", "teiEmbed", "Embed: a bare list of vectors (TEI)",
              body="TeiEmbedRequest", ok=array(array(NUM)), errors=_TEI_WORK,
              headers=_TEI_HEADERS, timed=True, **_TEI_TAGS),
    Operation("post", "/embed_sparse", "teiEmbedSparse", "A sparse model's non-zero vocabulary "
              "weights per input (TEI)", body="TeiSparseRequest", ok=ref("TeiSparseResponse"),
              errors=_TEI_WORK, headers=_TEI_HEADERS, timed=True, **_TEI_TAGS),
    Operation("post", "/embed_all", "teiEmbedAll", "Every token's final hidden state (TEI)",
              body="TeiEmbedAllRequest", ok=ref("TeiEmbedAllResponse"), errors=_TEI_WORK,
              headers=_TEI_HEADERS, timed=True, **_TEI_TAGS),
    Operation("post", "/embed_multivector", "teiEmbedMultivector", "A multi-vector model's "
              "normalized per-token vectors (ColBERT checkpoints as queries or documents, "
              "bge-m3's colbert vectors; ours, TEI-shaped)",
              body="TeiEmbedMultivectorRequest", ok=ref("TeiEmbedAllResponse"), errors=_TEI_WORK,
              headers=_TEI_HEADERS, timed=True, **_TEI_TAGS),
    Operation("post", "/tokenize", "teiTokenize", "Tokens with UTF-8 byte offsets (TEI)",
              body="TeiTokenizeRequest", ok=ref("TeiTokens"), errors=_TEI_TOOLS,
              headers=(MODEL_HEADER,), **_TEI_TAGS),
    Operation("post", "/decode", "teiDecode", "Token ids back to text (TEI)",
              body="TeiDecodeRequest", ok=array(STR), errors=_TEI_TOOLS,
              headers=(MODEL_HEADER,), **_TEI_TAGS),
    Operation("get", "/info", "teiInfo", "TEI's Info of the model", ok=ref("TeiInfo"),
              errors=(422, 503), headers=(MODEL_HEADER,), **_TEI_TAGS),
    Operation("post", "/rerank", "teiRerank", "Score texts against a query, sorted (TEI)",
              body="TeiRerankRequest", ok=ref("TeiRerankResponse"), errors=_TEI_WORK,
              headers=_TEI_HEADERS, timed=True, **_TEI_TAGS),
    Operation("post", "/predict", "teiPredict", "Label scores of texts or pairs (TEI)",
              body="TeiPredictRequest", ok=ref("TeiPredictResponse"), errors=_TEI_WORK,
              headers=_TEI_HEADERS, timed=True, **_TEI_TAGS),
)  # fmt: skip


def _parameters() -> dict[str, Schema]:
    def header(name: str, schema: Schema, description: str) -> Schema:
        return {"name": name, "in": "header", "required": False, "schema": schema,
                "description": description}  # fmt: skip

    return {
        MODEL_HEADER: header(MODEL_HEADER, TEXT, "The model of a TEI request (TEI's bodies "
                             "name none); else the server's --tei-model, else the only model "
                             "served."),  # fmt: skip
        PRIORITY_HEADER: header(PRIORITY_HEADER, {"type": "string", "enum": list(PRIORITIES)},
                                "The lane, for clients that cannot add a body field "
                                "(case-insensitive)."),  # fmt: skip
        TIMINGS_HEADER: header(TIMINGS_HEADER, {"type": "string", "enum": ["1", "true"]},
                               "Ask for the per-hop x-embedmesh-timings header."),
    }  # fmt: skip


def _responses(op: Operation, guarded: bool) -> dict[str, Schema]:
    error = {JSON: {"schema": ref("TeiError" if op.family == TEI else "OpenAIError")}}
    ok: Schema = {"description": "OK"}
    if op.ok is not None or op.ok_type != JSON:
        ok["content"] = {op.ok_type: {"schema": op.ok or {"type": "string"}}}
    headers: dict[str, Schema] = {}
    if op.timed:
        headers = {name: {"$ref": f"#/components/headers/{name}"} for name in TIMING_HEADERS}
    if TIMINGS_HEADER in op.headers:
        headers["x-embedmesh-timings"] = {"$ref": "#/components/headers/x-embedmesh-timings"}
    if headers:
        ok["headers"] = headers
    out = {"200": ok}
    statuses = sorted({*op.errors, *((401,) if guarded else ())})
    for status in statuses:
        response: Schema = {"description": STATUS_TEXT[status], "content": error}
        if status == 429:
            response["headers"] = {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}
        out[str(status)] = response
    out["default"] = {"description": "Any other error (405, 408, 500; /docs: 503 without its assets), same shape.",
                      "content": error}  # fmt: skip
    return out


def _operation(op: Operation, keyed: bool) -> Schema:
    guarded = keyed and op.guarded
    doc: Schema = {"operationId": op.op_id, "summary": op.summary, "tags": list(op.tags),
                   "x-error-family": op.family}  # fmt: skip
    params = [{"$ref": f"#/components/parameters/{name}"} for name in op.headers]
    if "{model}" in op.path:
        params.append({"name": "model", "in": "path", "required": True, "schema": TEXT,
                       "description": "A served name or an alias (may hold '/')."})  # fmt: skip
    if "{name}" in op.path:
        params.append({"name": "name", "in": "path", "required": True,
                       "schema": {"type": "string"}})  # fmt: skip
    for name in ("file_id", "batch_id"):
        if f"{{{name}}}" in op.path:
            params.append({"name": name, "in": "path", "required": True, "schema": TEXT})
    if params:
        doc["parameters"] = params
    if op.body is not None:
        doc["requestBody"] = {"required": True, "description": IGNORED,
                              "content": {JSON: {"schema": ref(op.body)}}}  # fmt: skip
    if op.form is not None:
        form = {"multipart/form-data": {"schema": ref(op.form)}}
        doc["requestBody"] = {"required": True, "content": form}
    doc["responses"] = _responses(op, guarded)
    doc["security"] = [{"bearer": []}] if guarded else []
    return doc


def document(cfg: IngressConfig) -> Schema:
    """The OpenAPI document of an ingress run with ``cfg`` (its limits, whether a key is set)."""
    paths: dict[str, dict[str, Schema]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op, bool(cfg.api_key))
    digits = {"type": "string", "pattern": "^[0-9]+$"}
    # Headers sent on every such response are required; x-embedmesh-timings only when asked.
    headers = {name: {"description": what, "required": True, "schema": digits}
               for name, what in TIMING_HEADERS.items()}  # fmt: skip
    headers["Retry-After"] = {"description": "Whole seconds, at least 1", "required": True,
                              "schema": digits}  # fmt: skip
    headers["x-embedmesh-timings"] = {"description": "name=ms,... per hop, when asked with "
                                      "X-Embedmesh-Timings: 1", "schema": {"type": "string"}}  # fmt: skip
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "embedmesh",
            "version": VERSION,
            "description": "Text embeddings, reranking and classification over a ZeroMQ mesh. "
            'OpenAI-shaped routes answer errors as {"error": {...}}, TEI\'s routes as '
            '{"error", "error_type"} (x-error-family). /health, GET /, /metrics, '
            "/openapi.json and /docs never need the API key.",
        },
        "tags": [{"name": name} for name in ("OpenAI", "Batch", "Rerank", "TEI", "Service")],
        "paths": paths,
        "components": {
            "schemas": bodies(cfg.max_inputs),
            "parameters": _parameters(),
            "headers": headers,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "--api-key"}
            },
        },
    }
