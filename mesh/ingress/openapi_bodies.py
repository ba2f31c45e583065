"""The request and response bodies of ``mesh.ingress.openapi``'s description, as JSON Schema
(OpenAPI 3.0's dialect: ``nullable``, no type lists).

Request bodies are not written here: each comes from its declaration (:data:`REQUESTS`, through
``mesh.ingress.bodies.schema_of``), the same one that decodes and checks it, with the server's
``--max-inputs``. The responses, which the ingress writes rather than reads, are described here.
A JSON null that a parser takes as absent is not advertised.
"""

from __future__ import annotations

from mesh.ingress import tei_schema
from mesh.ingress.batches import CreateBatchRequest
from mesh.ingress.bodies import schema_of
from mesh.ingress.contextualized import ContextualizedRequest
from mesh.ingress.http_errors import TEI_BY_CODE
from mesh.ingress.multivector import EmbedAllRequest, MultivectorRequest
from mesh.ingress.rerank import V1RerankRequest
from mesh.ingress.schema import EmbeddingsRequest

Schema = dict[str, object]

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
NULLABLE_STR: Schema = {"type": "string", "nullable": True}
TEXT: Schema = {"type": "string", "minLength": 1}
# A vector in the JSON of "float", or base64 for the other encoding formats.
VECTOR: Schema = {"oneOf": [{"type": "array", "items": NUM}, {"type": "string", "format": "byte"}]}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(props: dict[str, Schema], *required: str, **extra: object) -> Schema:
    schema: Schema = {"type": "object", "properties": props, **extra}
    if required:
        schema["required"] = list(required)
    return schema


def array(items: Schema, **limits: object) -> Schema:
    return {"type": "array", "items": items, **limits}


def const(value: str) -> Schema:
    return {"type": "string", "enum": [value]}


# Each request body's schema name → its declaration.
REQUESTS: dict[str, type] = {
    "EmbeddingsRequest": EmbeddingsRequest,
    "CreateBatchRequest": CreateBatchRequest,
    "ContextualizedRequest": ContextualizedRequest,
    "RerankRequest": V1RerankRequest,
    "TeiEmbedRequest": tei_schema.EmbedRequest,
    "TeiEmbedAllRequest": EmbedAllRequest,
    "TeiEmbedMultivectorRequest": MultivectorRequest,
    "TeiSparseRequest": tei_schema.SparseRequest,
    "TeiTokenizeRequest": tei_schema.TokenizeRequest,
    "TeiDecodeRequest": tei_schema.DecodeRequest,
    "TeiRerankRequest": tei_schema.RerankRequest,
    "TeiPredictRequest": tei_schema.PredictRequest,
}


def bodies(max_inputs: int) -> dict[str, Schema]:
    """Every named body; ``max_inputs`` is the server's --max-inputs."""
    return {
        **_errors(),
        **{name: schema_of(cls, max_inputs) for name, cls in REQUESTS.items()},
        **_openai(),
        **_service(),
        **_tei(),
        **_scores(),
        **_batches(),
    }


def _errors() -> dict[str, Schema]:
    fields = {"message": STR, "type": STR, "param": NULLABLE_STR, "code": NULLABLE_STR}
    tei_types = sorted({t for _, t in TEI_BY_CODE.values()} | {"Empty", "Validation"})
    return {
        "OpenAIError": obj({"error": obj(fields, *fields)}, "error"),
        "TeiError": obj(
            {"error": STR, "error_type": {**STR, "enum": tei_types}}, "error", "error_type"
        ),
    }


def _openai() -> dict[str, Schema]:
    embeddings_item = obj(
        {"object": const("embedding"), "index": INT, "embedding": VECTOR},
        "object",
        "index",
        "embedding",
    )
    return {
        "EmbeddingsResponse": obj(
            {
                "object": const("list"),
                "data": array(embeddings_item),
                "model": STR,
                "usage": ref("Usage"),
            },
            "object",
            "data",
            "model",
            "usage",
        ),
        "Usage": obj({"prompt_tokens": INT, "total_tokens": INT}, "prompt_tokens", "total_tokens"),
        "ContextualizedResponse": obj(
            {
                "object": const("list"),
                "data": array(
                    obj(
                        {"object": const("list"), "index": INT, "data": array(embeddings_item)},
                        "object",
                        "index",
                        "data",
                    )
                ),
                "model": STR,
                "usage": ref("Usage"),
            },
            "object",
            "data",
            "model",
            "usage",
        ),
    }


def _service() -> dict[str, Schema]:
    model = {
        "id": STR,
        "object": const("model"),
        "created": INT,
        "owned_by": STR,
        "aliases": array(STR),
        "dimensions": INT,
        "max_input_tokens": INT,
        "workers": INT,
        "prompts": {"type": "object", "additionalProperties": STR},
        "default_prompt_name": NULLABLE_STR,
        "task": {**STR, "enum": ["embed", "score", "sparse"]},
        "labels": array(STR),
    }
    health = {
        "status": {**STR, "enum": ["ok", "unavailable"]},
        "reason": STR,
        "brokers": array(obj({"endpoint": STR, "alive": BOOL})),
        "models": {"type": "object", "additionalProperties": INT},
        "pid": INT,
    }
    return {
        "Model": obj(model, "id", "object", "created", "owned_by"),
        "ModelList": obj({"object": const("list"), "data": array(ref("Model"))}, "object", "data"),
        "Health": obj(health, "status"),
    }


def _tei() -> dict[str, Schema]:
    token = obj(
        {
            "id": INT,
            "text": STR,
            "special": BOOL,
            "start": {**INT, "nullable": True},
            "stop": {**INT, "nullable": True},
        },
        "id",
        "text",
        "special",
        "start",
        "stop",
    )
    return {
        "TeiEmbedAllResponse": array(array(VECTOR)),
        "TeiSparseResponse": array(array(obj({"index": INT, "value": NUM}, "index", "value"))),
        "TeiTokens": array(array(token)),
        "TeiInfo": _tei_info(),
    }


def _tei_info() -> Schema:
    head = obj(
        {
            "id2label": {"type": "object", "additionalProperties": STR},
            "label2id": {"type": "object", "additionalProperties": INT},
        }
    )
    model_type = {
        "oneOf": [
            obj({"embedding": obj({"pooling": STR}, "pooling")}, "embedding"),
            obj({"reranker": head}, "reranker"),
            obj({"classifier": head}, "classifier"),
        ]
    }
    counts = (
        "max_concurrent_requests",
        "max_input_length",
        "max_batch_tokens",
        "max_batch_requests",
        "max_client_batch_size",
        "tokenization_workers",
    )
    props = {
        "model_id": STR,
        "model_sha": NULLABLE_STR,
        "model_dtype": STR,
        "served_model_name": STR,
        "model_type": model_type,
        **dict.fromkeys(counts, INT),
        "auto_truncate": BOOL,
        # Ours: the most numbers (tokens x width) one /embed_all answer holds (413 beyond).
        "max_embed_all_values": INT,
        # Ours: the most (index, value) pairs one /embed_sparse request may ask for.
        "max_embed_sparse_pairs": INT,
        # Ours: true for an embedder that /embed_sparse also takes (bge-m3's lexical weights).
        "embed_sparse": BOOL,
        # Ours: the width of /embed_multivector's per-token vectors (0: no multi-vector head).
        "multivector_dims": INT,
        # Ours: a ColBERT model's query and document lengths in tokens; null for other models.
        "late_interaction": {
            **obj({"query_length": INT, "document_length": INT}, "query_length", "document_length"),
            "nullable": True,
        },
        "version": STR,
        "sha": NULLABLE_STR,
        "docker_label": NULLABLE_STR,
    }
    return obj(
        props, "model_id", "model_type", "max_input_length", "max_client_batch_size", "version"
    )


def _scores() -> dict[str, Schema]:
    label_scores = array(obj({"score": NUM, "label": STR}, "score", "label"))
    result = obj(
        {"index": INT, "relevance_score": NUM, "document": obj({"text": STR}, "text")},
        "index",
        "relevance_score",
    )
    return {
        "TeiRerankResponse": array(
            obj({"index": INT, "score": NUM, "text": STR}, "index", "score")
        ),
        "TeiPredictResponse": {"oneOf": [label_scores, array(label_scores)]},
        "RerankResponse": obj(
            {
                "id": STR,
                "model": STR,
                "usage": obj({"total_tokens": INT}, "total_tokens"),
                "results": array(result),
            },
            "id",
            "model",
            "usage",
            "results",
        ),
    }


def _batches() -> dict[str, Schema]:
    """The Files and Batches API's objects (OpenAI's, plus our progress fields)."""
    nullable_int: Schema = {"type": "integer", "nullable": True}
    file = {
        "id": STR, "object": const("file"), "bytes": INT, "created_at": INT,
        "expires_at": nullable_int, "filename": STR,
        "purpose": {**STR, "enum": ["batch", "batch_output"]}, "status": STR,
    }  # fmt: skip
    error = obj({"code": STR, "message": STR, "param": NULLABLE_STR, "line": nullable_int})
    times = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
             "failed_at", "expired_at", "cancelling_at", "cancelled_at")  # fmt: skip
    states = ["validating", "in_progress", "finalizing", "completed", "failed", "cancelling",
              "cancelled", "expired"]  # fmt: skip
    batch: Schema = {
        "id": STR, "object": const("batch"), "endpoint": STR,
        "errors": {**obj({"object": const("list"), "data": array(error)}), "nullable": True},
        "input_file_id": STR, "completion_window": STR, "status": {**STR, "enum": states},
        "output_file_id": NULLABLE_STR, "error_file_id": NULLABLE_STR,
        **{name: nullable_int for name in times},
        "request_counts": obj({"total": INT, "completed": INT, "failed": INT}),
        "metadata": {"type": "object", "additionalProperties": STR, "nullable": True},
        "tokens_done": INT, "tokens_total": INT, "tokens_per_second": NUM,
        "eta_seconds": {"type": "number", "nullable": True},
    }  # fmt: skip
    page = {"object": const("list"), "first_id": NULLABLE_STR, "last_id": NULLABLE_STR,
            "has_more": BOOL}  # fmt: skip
    return {
        "File": obj(file, "id", "object", "bytes", "created_at", "filename", "purpose"),
        "FileList": obj({**page, "data": array(ref("File"))}, "object", "data", "has_more"),
        "FileDeleted": obj({"id": STR, "object": const("file"), "deleted": BOOL}, "id", "deleted"),
        "FileUpload": obj(
            {"file": {"type": "string", "format": "binary"}, "purpose": const("batch")},
            "file",
            "purpose",
        ),  # fmt: skip
        "Batch": obj(batch, "id", "object", "endpoint", "input_file_id", "status", "created_at"),
        "BatchList": obj({**page, "data": array(ref("Batch"))}, "object", "data", "has_more"),
    }
