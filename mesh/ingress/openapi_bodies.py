"""The request and response bodies of ``mesh.ingress.openapi``'s description, as JSON Schema
(OpenAPI 3.0's dialect: ``nullable``, no type lists).

Enums, defaults and limits are read from the modules that enforce them (``ENCODINGS``,
``PRIORITIES``, ``DIRECTIONS``, ``MAX_TOKEN_ID``, the document and sparse limits, the server's
``--max-inputs``), so the description follows a parser when it changes. Bodies are described as
they are accepted; a JSON null that a parser takes as absent is not advertised.
"""

from __future__ import annotations

from mesh.client.spans import MAX_CHUNKS, MAX_DOCUMENTS
from mesh.config import SPARSE_TOP_K, SPARSE_TOP_K_MAX
from mesh.ingress.encodings import ENCODINGS
from mesh.ingress.http_errors import TEI_BY_CODE
from mesh.ingress.schema import PRIORITIES, PRIORITY_HEADER
from mesh.ingress.tei_schema import DIRECTIONS, MAX_TOKEN_ID

Schema = dict[str, object]

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
NULLABLE_STR: Schema = {"type": "string", "nullable": True}
TEXT: Schema = {"type": "string", "minLength": 1}
TOKEN_ID: Schema = {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID}
FLAG_TRUE: Schema = {"type": "boolean", "default": True}
FLAG_FALSE: Schema = {"type": "boolean", "default": False}
PRIORITY: Schema = {
    "type": "string",
    "enum": list(PRIORITIES),
    "description": f"The lane of every queue on the path; the {PRIORITY_HEADER} header does the "
    "same, the body wins. Without either, requests over 1024 tokens go to the batch lane.",
}
DIMENSIONS: Schema = {
    "type": "integer",
    "minimum": 1,
    "description": "Keep the first d components (Matryoshka), renormalized; at most the model's "
    "width (422 beyond).",
}
PROMPT_NAME: Schema = {
    **TEXT,
    "description": "One of the model's sentence-transformers prompts (GET /v1/models/{model} "
    "lists them), put before every input text; text input only. Absent: the model's default.",
}
TRUNCATE: Schema = {
    "type": "boolean",
    "description": "Cut inputs over the model's limit; absent: the server's --auto-truncate.",
}
DIRECTION: Schema = {"type": "string", "enum": list(DIRECTIONS), "default": "Right"}
ENCODING: Schema = {"type": "string", "enum": list(ENCODINGS), "default": "float"}
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


def bodies(max_inputs: int) -> dict[str, Schema]:
    """Every named body; ``max_inputs`` is the server's --max-inputs."""
    return {
        **_errors(),
        **_openai(max_inputs),
        **_service(),
        **_tei(max_inputs),
        **_scores(max_inputs),
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


def _openai(max_inputs: int) -> dict[str, Schema]:
    many = {"minItems": 1, "maxItems": max_inputs}
    ids = array({"type": "integer", "minimum": 0}, minItems=1)
    embeddings_item = obj(
        {"object": const("embedding"), "index": INT, "embedding": VECTOR},
        "object",
        "index",
        "embedding",
    )
    chunks = array(TEXT, minItems=1)
    return {
        "EmbeddingsRequest": obj(
            {
                "input": {
                    "oneOf": [TEXT, array(TEXT, **many), ids, array(ids, **many)],
                    "description": "A text, texts, a list of token ids or lists of token ids.",
                },
                "model": {**TEXT, "description": "A served name or an alias."},
                "encoding_format": ENCODING,
                "dimensions": DIMENSIONS,
                "user": {**STR, "description": "Accepted, ignored."},
                "prompt_name": PROMPT_NAME,
                "priority": PRIORITY,
            },
            "input",
            "model",
        ),
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
        "ContextualizedRequest": obj(
            {
                "input": array(
                    chunks,
                    minItems=1,
                    maxItems=MAX_DOCUMENTS,
                    description=(
                        f"Documents, each its chunks in order; at most {MAX_CHUNKS} chunks in all."
                    ),
                ),
                "model": TEXT,
                "dimensions": DIMENSIONS,
                "encoding_format": {**ENCODING, "default": "base64_int8"},
                "priority": PRIORITY,
            },
            "input",
            "model",
        ),
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


def _tei(max_inputs: int) -> dict[str, Schema]:
    many = {"minItems": 1, "maxItems": max_inputs}
    ids = array(TOKEN_ID, minItems=1)
    inputs = {
        "oneOf": [TEXT, ids, array(TEXT, **many), array(ids, **many)],
        "description": "A text, a list of token ids, or a list of either (one kind per request).",
    }
    common = {
        "inputs": inputs,
        "truncate": TRUNCATE,
        "truncation_direction": DIRECTION,
        "prompt_name": PROMPT_NAME,
    }
    embed = {**common, "normalize": FLAG_TRUE, "dimensions": DIMENSIONS}
    top_k = {**INT, "minimum": 1, "maximum": SPARSE_TOP_K_MAX, "default": SPARSE_TOP_K}
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
    token_format = {**STR, "enum": ["float", "base64"], "default": "float"}
    return {
        "TeiEmbedRequest": obj(embed, "inputs"),
        "TeiEmbedAllRequest": obj({**common, "encoding_format": token_format}, "inputs"),
        "TeiEmbedMultivectorRequest": obj(
            {
                **common,
                "encoding_format": token_format,
                # Ours: a ColBERT model lays out queries and documents its own way ([Q]/[D]
                # marker, [MASK] expansion, punctuation skiplist); bge-m3's are alike.
                "input_type": {**STR, "enum": ["query", "document"], "default": "document"},
            },
            "inputs",
        ),
        "TeiEmbedAllResponse": array(array(VECTOR)),
        "TeiSparseRequest": obj(
            {**common, "top_k": top_k, "threshold": {**NUM, "minimum": 0, "default": 0}}, "inputs"
        ),
        "TeiSparseResponse": array(array(obj({"index": INT, "value": NUM}, "index", "value"))),
        "TeiTokenizeRequest": obj(
            {
                "inputs": {"oneOf": [TEXT, array(TEXT, **many)]},
                "add_special_tokens": FLAG_TRUE,
                "prompt_name": PROMPT_NAME,
            },
            "inputs",
        ),
        "TeiTokens": array(array(token)),
        "TeiDecodeRequest": obj(
            {"ids": {"oneOf": [ids, array(ids, **many)]}, "skip_special_tokens": FLAG_TRUE}, "ids"
        ),
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


def _scores(max_inputs: int) -> dict[str, Schema]:
    many = {"minItems": 1, "maxItems": max_inputs}
    pair = array(STR, minItems=2, maxItems=2)
    label_scores = array(obj({"score": NUM, "label": STR}, "score", "label"))
    result = obj(
        {"index": INT, "relevance_score": NUM, "document": obj({"text": STR}, "text")},
        "index",
        "relevance_score",
    )
    return {
        "TeiRerankRequest": obj(
            {
                "query": STR,
                "texts": array(STR, **many),
                "raw_scores": FLAG_FALSE,
                "return_text": FLAG_FALSE,
                "truncate": TRUNCATE,
                "truncation_direction": DIRECTION,
            },
            "query",
            "texts",
        ),
        "TeiRerankResponse": array(
            obj({"index": INT, "score": NUM, "text": STR}, "index", "score")
        ),
        "TeiPredictRequest": obj(
            {
                # anyOf: ["a", "b"] is a pair and a list of two texts; TEI takes the pair first.
                "inputs": {
                    "anyOf": [TEXT, pair, array({"anyOf": [STR, pair]}, **many)],
                    "description": "A text, a pair [a, b] (a list of exactly two strings is "
                    "one pair, as in TEI), or a list of texts and pairs.",
                },
                "raw_scores": FLAG_FALSE,
                "truncate": TRUNCATE,
                "truncation_direction": DIRECTION,
            },
            "inputs",
        ),
        "TeiPredictResponse": {"oneOf": [label_scores, array(label_scores)]},
        "RerankRequest": obj(
            {
                "model": TEXT,
                "query": TEXT,
                "documents": array({"oneOf": [STR, obj({"text": STR}, "text")]}, **many),
                "top_n": {**INT, "minimum": 1},
                "return_documents": FLAG_TRUE,
                "truncate": {
                    **FLAG_TRUE,
                    "description": "Cut over-long documents, as Cohere and "
                    "Jina do; false: 422 instead.",
                },
                "priority": PRIORITY,
            },
            "model",
            "query",
            "documents",
        ),
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
