"""Every message between ingress, broker and worker, declared once.

Direction is in the docstring of each class; the command byte is its identity on the wire.
Ingress ↔ broker commands are 0x01–0x0F, broker ↔ worker 0x10–0x1F.

Token ids travel as ``token_ids`` (int32, all sequences concatenated) plus ``offsets`` (int32,
n+1 entries, ``offsets[0] == 0``, ``offsets[-1] == len(token_ids)``); sequence ``i`` is
``token_ids[offsets[i]:offsets[i+1]]`` and holds at least one token.

Several rows per sequence (spans). A request whose ``OutputOptions.rows`` is ``"spans"`` gets
one row per *span* of a sequence instead of one pooled row per sequence: the mean, accumulated
in fp32, of the final hidden states of the span's tokens (before any Dense layer, the model's
pooling mode aside), then dims / normalization / number format as usual. Spans travel as
``spans`` (int32 ``[S, 2]``, ``(start, end)`` token positions relative to their own sequence,
``0 <= start < end <= length``, in order and disjoint inside a sequence) plus ``span_offsets``
(int32 ``[n + 1]``, rising from 0 to S): sequence ``i``'s spans are
``spans[span_offsets[i]:span_offsets[i+1]]``. Contextualized chunk embeddings (late chunking)
send one span per chunk; per-token vectors (TEI's ``/embed_all``) one span per token. Being
relative to their sequence, spans follow a sequence wherever the broker puts it (split across
batches, requeued, isolated) with a slice of ``span_offsets``; disjoint spans mean a batch never
returns more rows than it has tokens, so its token budget bounds its bytes too (tokens x width x
4, under ``limits.MAX_ARRAY_BYTES`` for any sane budget). Results map rows back with
``RequestResult.row_offsets``. Fields are optional with defaults: a peer from before spans
decodes and sends the one-row-per-sequence messages it always did.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar

import numpy as np

from proto_msgs import limits
from proto_msgs.codec import Message, register
from proto_msgs.errors import ErrorCode, ProtocolError
from proto_msgs.small_arrays import SMALL, bounds, least
from proto_msgs.stats import ModelStats, WorkerStats

# Output kinds a worker can produce; the dtype each travels as.
OUTPUT_KINDS: dict[str, str] = {
    "float32": "float32",
    "float16": "float16",
    "int8": "int8",  # symmetric per-vector absmax scaling to ±127
    "binary": "uint8",  # sign bits, np.packbits order (first dimension = most significant bit)
    # A sparse model's weights (ModelInfo.task "sparse"): per sequence a row of 2 * k float32,
    # k <= top_k the most pairs a row of its batch kept: its token ids (exact in float32: ids
    # < 2**24) then their weights, sorted by id, only weights > threshold, zero-padded (a pad's
    # weight is 0, never kept). A request's chunks may differ in k (the client pads them).
    "sparse": "float32",
}
# What a row of the result is (OutputOptions.rows): a sequence's pooled vector, or a span's mean;
# "multivector": a span row (one token's state) through the model's multi-vector head
# (ModelInfo.multivector_dims wide), e.g. bge-m3's colbert vectors. Both carry spans.
ROW_KINDS: tuple[str, ...] = ("sequence", "spans", "multivector")
SPAN_ROWS: tuple[str, ...] = ("spans", "multivector")


# What a model does (ModelInfo.task), and what turns a scorer's logits into scores
# (ModelInfo.activation): declared once here, where the wire is.
TASKS: tuple[str, ...] = ("embed", "score", "sparse")
ACTIVATIONS: tuple[str, ...] = ("sigmoid", "softmax", "identity", "tanh")


class Lane(IntEnum):
    """Priority lanes of every queue on the path (plain ints on the wire): live queries go
    INTERACTIVE, bulk work BATCH. Declared once; the broker queue and the ingress import it."""

    INTERACTIVE = 0
    BATCH = 1


@dataclass
class OutputOptions:
    """What the worker does after pooling: Matryoshka prefix, L2 normalization, quantization;
    and what it leaves out of the pooling."""

    dims: int | None = None  # None = the model's full width
    normalize: bool = True
    kind: str = "float32"  # one of OUTPUT_KINDS
    # Leading tokens of each sequence left out of the pooling: the prompt's, for a model whose
    # pooling excludes it (ModelInfo.include_prompt false); each sequence is longer.
    pool_skip: int = 0
    # Kind "sparse" only: the most (id, weight) pairs a row keeps, the largest weights first,
    # and the weight a pair must exceed; 0 and 0.0 for every other kind.
    top_k: int = 0
    threshold: float = 0.0
    # One of ROW_KINDS: "sequence", one pooled row per sequence; "spans", one row per span of
    # each sequence (the module docstring), its request carrying the spans.
    rows: str = "sequence"

    def check(self, where: str) -> None:
        if self.kind not in OUTPUT_KINDS:
            raise ProtocolError(f"{where}: unknown output kind {self.kind!r}")
        if self.rows not in ROW_KINDS:
            raise ProtocolError(f"{where}: unknown row kind {self.rows!r}")
        if self.rows in SPAN_ROWS and self.pool_skip:
            raise ProtocolError(f"{where}: spans say what is pooled; pool_skip must be 0")
        if self.dims is not None and not 1 <= self.dims <= limits.MAX_DIMS:
            raise ProtocolError(f"{where}: dims out of range")
        if not 0 <= self.pool_skip <= limits.MAX_TOKENS:
            raise ProtocolError(f"{where}: pool_skip out of range")
        sparse = self.kind == "sparse"
        if not (1 <= self.top_k <= limits.MAX_SPARSE_TOP_K if sparse else self.top_k == 0):
            raise ProtocolError(f"{where}: top_k is 1..{limits.MAX_SPARSE_TOP_K} for sparse only")
        if not (0.0 <= self.threshold < float("inf")) or (self.threshold and not sparse):
            raise ProtocolError(f"{where}: threshold must be finite, >= 0, for sparse only")


@dataclass
class LateInteraction:
    """A ColBERT model's token layout: what the ingress builds a query's or a document's ids
    from (``mesh.client.late_interaction``), as colbert-ai and PyLate tokenize them: the
    text's tokens cut at ``length - 1``, the role's marker put after the first token,
    a query padded with ``expansion`` to ``query_length``; a document's tokens in
    ``skiplist`` get no vector."""

    query_marker: int  # token id after a query's first token (colbert-ai [unused0], "[Q] ")
    document_marker: int  # the same for a document ([unused1], "[D] ")
    query_length: int  # a query's tokens, marker and expansion included
    document_length: int  # the most tokens of a document, marker included
    expansion: int = -1  # the id a query is padded with to query_length ([MASK]); -1: none
    skiplist: list[int] = field(default_factory=list)  # ids a document keeps no vector of

    def check(self, where: str, vocab_size: int, max_input_tokens: int) -> None:
        ids = [self.query_marker, self.document_marker, *self.skiplist]
        if self.expansion != -1:
            ids.append(self.expansion)
        if any(not 0 <= i < vocab_size for i in ids):
            raise ProtocolError(f"{where}: a late-interaction token id is outside the vocabulary")
        lengths = (self.query_length, self.document_length)
        if min(lengths) < 3 or max(lengths) > max_input_tokens:
            raise ProtocolError(f"{where}: late-interaction lengths out of range")


@dataclass
class ModelInfo:
    """A model as the catalog describes it: all an ingress needs to validate and tokenize."""

    name: str
    aliases: list[str]
    dims: int
    max_input_tokens: int
    vocab_size: int  # token ids given directly must be below this
    pooling: str  # a mode ("mean", "cls", "last", "max", ...) or several joined by "+"
    normalize: bool  # the model's own default (sentence-transformers Normalize module)
    tokenizer_digest: str  # sha256 hex of tokenizer.json; fetch it with TokenizerRequest
    workers: int = 0  # workers serving it now (filled in by the broker)
    # sentence-transformers prompts: name -> text the ingress puts before each input text
    # (config_sentence_transformers.json); a request picks one by name.
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None  # the prompt of a text request that names none
    # False: the pooling leaves a prompt's tokens out (sentence-transformers include_prompt),
    # so a request with a prompt says how many (OutputOptions.pool_skip).
    include_prompt: bool = True
    # "embed": a vector per text. "score": a cross-encoder (reranker, classifier): one logit per
    # label per text or (query, passage) pair, ``dims == len(labels)``, never normalized.
    # "sparse": a SPLADE-style model, one weight per vocabulary entry (``dims == vocab_size``),
    # served only as the output kind "sparse" (its top_k largest).
    task: str = "embed"
    # True: an embedder (task "embed") that also gives the output kind "sparse", bge-m3's
    # lexical weights (its vocab_size wide): /embed_sparse takes it as a SPLADE model.
    lexical: bool = False
    labels: list[str] = field(default_factory=list)  # a scorer's label names, by logit index
    # What turns a scorer's logits into its scores (the ingress applies it, unless raw):
    # "sigmoid", "softmax", "identity" or "tanh"; "" for an embedder.
    activation: str = ""
    # Width of the final hidden states, what a span row holds before ``dims`` cuts it (0 from
    # a worker from before spans: the ingress then refuses span requests for the model).
    hidden_size: int = 0
    # True when sentence-transformers Dense layers follow the pooling: span rows skip them
    # (they are means of hidden states), so they are not the model's embedding space.
    has_dense: bool = False
    # Width of a per-token vector of the model's multi-vector head (rows "multivector": bge-m3's
    # colbert vectors); 0 when it has none (and from a worker from before the head).
    multivector_dims: int = 0
    # Filled in by the broker in its catalog, like ``workers``: the largest batch budget
    # (tokens, requests) among the model's live workers; 0 when unknown (an older broker).
    # Not a promise of the card: workers of one model may be started with other budgets.
    max_batch_tokens: int = 0
    max_batch_requests: int = 0
    # A ColBERT model (colbert-ai, PyLate): how the ingress lays out its queries and documents
    # for /embed_multivector; None for every other model (bge-m3's colbert vectors included).
    late_interaction: LateInteraction | None = None
    # The dtype of the worker's weights ("float32", "bfloat16", "float16"; TEI's /info
    # model_dtype); "" from a worker from before the field. Not a card promise: workers of one
    # model may run other dtypes, and the first worker's stays in the catalog.
    dtype: str = ""

    def check(self, where: str) -> None:
        """What a peer's card must hold for the ingress to use it without failing later: a
        task it knows, a scorer's labels one per logit and an activation it can apply, a
        default prompt among the prompts (else every request would fail, blamed on the
        client)."""
        if self.task not in TASKS:
            raise ProtocolError(f"{where}: unknown task {self.task!r}")
        # A sparse model's width is its vocabulary (bge-m3: 250,002), past MAX_DIMS.
        wide = self.task == "sparse"
        if self.dims < 1 or (self.dims > limits.MAX_DIMS and not wide) or self.max_input_tokens < 1:
            raise ProtocolError(f"{where}: dims or max_input_tokens out of range")
        if self.task == "score" and (
            len(self.labels) != self.dims or self.activation not in ACTIVATIONS
        ):
            raise ProtocolError(f"{where}: a scorer needs a label per logit and an activation")
        if self.lexical and self.task != "embed":
            raise ProtocolError(f"{where}: lexical weights are an embedder's (task embed)")
        if not 0 <= self.multivector_dims <= limits.MAX_DIMS:
            raise ProtocolError(f"{where}: multivector_dims out of range")
        if self.max_batch_tokens < 0 or self.max_batch_requests < 0:
            raise ProtocolError(f"{where}: batch limits must be >= 0")
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ProtocolError(f"{where}: default_prompt_name is not one of its prompts")
        if self.late_interaction is not None:
            if self.multivector_dims <= 0:
                raise ProtocolError(f"{where}: a late-interaction model needs multivector_dims")
            self.late_interaction.check(where, self.vocab_size, self.max_input_tokens)


@dataclass
class BrokerStats:
    """Queue and pool state, carried on every Pong for health checks and metrics."""

    queued_tokens: dict[str, int] = field(default_factory=dict)
    queued_sequences: dict[str, int] = field(default_factory=dict)
    workers: dict[str, int] = field(default_factory=dict)
    inflight_batches: int = 0
    dropped_frames: int = 0
    # Per model, seconds of queued work a new [interactive, batch] request would wait behind at
    # its workers' rate, and that rate (both absent while it is unknown): an ingress refuses,
    # before tokenizing, a request that would end past its deadline (the broker would refuse it).
    backlog_s: dict[str, list[float]] = field(default_factory=dict)
    drain_rate: dict[str, float] = field(default_factory=dict)  # tokens/s of its workers
    # Per model: its lanes, batches and backlog in seconds (proto_msgs.stats); and each
    # worker, live or recently gone. For /metrics and /health.
    models: dict[str, ModelStats] = field(default_factory=dict)
    worker_list: list[WorkerStats] = field(default_factory=list)


def _rises(values: np.ndarray, last: int) -> bool:
    """Whether a non-empty 1-D integer array starts at 0, ends at ``last`` and rises strictly."""
    if len(values) <= SMALL:
        items = values.tolist()
        return items[0] == 0 and items[-1] == last and all(map(operator.lt, items, items[1:]))
    # A comparison, not np.diff: int32 differences wrap around and would let falling values
    # through, and comparing neighbours needs no int64 copy.
    return values[0] == 0 and values[-1] == last and not (values[1:] <= values[:-1]).any()


def _check_ragged(token_ids: np.ndarray, offsets: np.ndarray, where: str) -> None:
    if token_ids.ndim != 1 or token_ids.dtype != np.int32:
        raise ProtocolError(f"{where}: token_ids must be 1-D int32")
    if offsets.ndim != 1 or offsets.dtype != np.int32 or len(offsets) < 2:
        raise ProtocolError(f"{where}: offsets must be 1-D int32 with at least 2 entries")
    if len(offsets) - 1 > limits.MAX_SEQUENCES or len(token_ids) > limits.MAX_TOKENS:
        raise ProtocolError(f"{where}: too many sequences or tokens")
    if not _rises(offsets, len(token_ids)):
        raise ProtocolError(f"{where}: offsets must start at 0, end at len(token_ids), rise")
    if len(token_ids) and least(token_ids) < 0:
        raise ProtocolError(f"{where}: negative token id")


def _check_spans(
    spans: np.ndarray | None,
    span_offsets: np.ndarray | None,
    offsets: np.ndarray,
    where: str,
    empty_ok: bool,
) -> None:
    """Spans as the module docstring says; ``empty_ok``: a sequence may have none (a batch's
    sequences of requests without spans)."""
    if (spans is None) != (span_offsets is None):
        raise ProtocolError(f"{where}: spans and span_offsets come together")
    if spans is None or span_offsets is None:
        return
    n = len(offsets) - 1
    if spans.dtype != np.int32 or spans.ndim != 2 or spans.shape[1] != 2:
        raise ProtocolError(f"{where}: spans must be int32 [S, 2]")
    if span_offsets.dtype != np.int32 or span_offsets.shape != (n + 1,):
        raise ProtocolError(f"{where}: span_offsets must be int32 [n + 1]")
    counts = span_offsets[1:].astype(np.int64) - span_offsets[:-1]
    if span_offsets[0] != 0 or span_offsets[-1] != len(spans) or (counts < 0).any():
        raise ProtocolError(f"{where}: span_offsets must rise from 0 to len(spans)")
    if not empty_ok and (counts == 0).any():
        raise ProtocolError(f"{where}: every sequence needs at least one span")
    if len(spans) > limits.MAX_TOKENS:
        raise ProtocolError(f"{where}: too many spans")
    if not len(spans):
        return
    seq = np.repeat(np.arange(n), counts)
    starts, ends = spans[:, 0].astype(np.int64), spans[:, 1].astype(np.int64)
    lengths = (offsets[1:].astype(np.int64) - offsets[:-1])[seq]
    # Disjoint and in order inside a sequence: each start at or after the previous span's end.
    first = np.zeros(len(spans), dtype=bool)
    first[span_offsets[:-1][counts > 0]] = True
    previous_end = np.concatenate(([0], ends[:-1]))
    overlap = ~first & (starts < previous_end)
    if (starts < 0).any() or (ends <= starts).any() or (ends > lengths).any() or overlap.any():
        raise ProtocolError(f"{where}: spans must be non-empty, inside, in order and disjoint")


def _check_pairs(starts: np.ndarray | None, offsets: np.ndarray, where: str) -> None:
    """``segment_b_start``: int32 [n], 0 (a single text) or where a pair's second segment
    begins (token type 1 from there), inside its sequence and after its first token."""
    if starts is None:
        return
    n = len(offsets) - 1
    if starts.dtype != np.int32 or starts.shape != (n,):
        raise ProtocolError(f"{where}: segment_b_start must be int32 [n]")
    if n <= SMALL:
        ends = offsets.tolist()  # rising from 0 (checked before): no difference wraps
        per_seq = zip(starts.tolist(), ends[:-1], ends[1:], strict=True)
        outside = any(not 0 <= s < b - a for s, a, b in per_seq)
    else:
        outside = int(starts.min()) < 0 or (starts >= offsets[1:] - offsets[:-1]).any()
    if n and outside:
        raise ProtocolError(f"{where}: segment_b_start must lie inside its sequence")


# ---- ingress ↔ broker --------------------------------------------------------------------------


@register
@dataclass
class SubmitRequest(Message):
    """ingress → broker: embed ``n`` tokenized sequences; answered by RequestResult chunks
    (any order, covering every index once) or one RequestError."""

    COMMAND: ClassVar[int] = 0x01
    cid: int  # correlation id, unique per ingress connection
    model: str  # served name or alias
    lane: int  # Lane.INTERACTIVE or Lane.BATCH
    timeout_ms: int | None  # relative deadline; the broker turns it into its own clock
    output: OutputOptions
    token_ids: np.ndarray
    offsets: np.ndarray
    # Pairs for a cross-encoder: per sequence, the token index where its second text (token
    # type 1) begins, 0 for a single text; None when the request holds no pair.
    segment_b_start: np.ndarray | None = None
    # Spans (module docstring): present exactly when ``output.rows`` is one of SPAN_ROWS.
    spans: np.ndarray | None = None  # int32 [S, 2], relative to each sequence
    span_offsets: np.ndarray | None = None  # int32 [n + 1]

    def validate(self) -> None:
        _check_ragged(self.token_ids, self.offsets, "SubmitRequest")
        _check_pairs(self.segment_b_start, self.offsets, "SubmitRequest")
        _check_spans(self.spans, self.span_offsets, self.offsets, "SubmitRequest", False)
        if (self.spans is not None) != (self.output.rows in SPAN_ROWS):
            raise ProtocolError("SubmitRequest: spans come exactly with span rows")
        self.output.check("SubmitRequest")
        if self.lane not in (Lane.INTERACTIVE, Lane.BATCH):
            raise ProtocolError("SubmitRequest: unknown lane")
        if self.timeout_ms is not None and self.timeout_ms <= 0:
            raise ProtocolError("SubmitRequest: timeout_ms must be positive")

    @property
    def n(self) -> int:
        return len(self.offsets) - 1


@register
@dataclass
class CancelRequest(Message):
    """ingress → broker: drop what is still queued of ``cid``; no reply is sent."""

    COMMAND: ClassVar[int] = 0x02
    cid: int


@register
@dataclass
class RequestResult(Message):
    """broker → ingress: embeddings of some sequences of ``cid`` (rows follow ``indices``).
    Duplicates can happen after a requeue; the ingress keeps the first of each index.
    For a request with spans, ``row_offsets`` says which rows are whose: the rows of sequence
    ``indices[j]`` (one per span, in span order) are ``embeddings[row_offsets[j]:row_offsets[j+1]]``."""

    COMMAND: ClassVar[int] = 0x03
    cid: int
    prompt_tokens: int  # tokens of the sequences in this chunk
    indices: np.ndarray  # int32 [k], sequence indices within the request
    embeddings: np.ndarray  # [k, d] of the dtype of the request's output kind
    queue_ms: float = 0.0  # how long these sequences waited in the broker before dispatch
    compute_ms: float = 0.0  # the worker's compute time of the batch that carried them
    # Per-hop durations in ms of the batch that carried them, each measured inside one process
    # (so clocks of different hosts never meet): the worker's (see BatchResult.timings) plus
    # the broker's "broker_queue" (submit received → the batch carrying it sent),
    # "broker_worker" (batch sent → its result received: the worker plus both transits) and
    # "broker_out" (result received → this chunk sent). Unknown names are passed on as they are.
    timings: dict[str, float] = field(default_factory=dict)
    row_offsets: np.ndarray | None = None  # int32 [k + 1]; None: one row per index

    def validate(self) -> None:
        if self.indices.ndim != 1 or self.embeddings.ndim != 2:
            raise ProtocolError("RequestResult: bad shapes")
        # The ingress indexes its output with these: a float or negative index would crash it
        # or silently put a vector in the wrong place.
        if self.indices.dtype != np.int32 or (len(self.indices) and least(self.indices) < 0):
            raise ProtocolError("RequestResult: indices must be non-negative int32")
        rows = self.row_offsets
        if rows is None:
            if len(self.indices) != len(self.embeddings):
                raise ProtocolError("RequestResult: indices and rows disagree")
            return
        if rows.dtype != np.int32 or rows.shape != (len(self.indices) + 1,):
            raise ProtocolError("RequestResult: row_offsets must be int32 [k + 1]")
        if not _rises(rows, len(self.embeddings)):
            raise ProtocolError("RequestResult: row_offsets must rise from 0 to the rows")


@register
@dataclass
class RequestError(Message):
    """broker → ingress: ``cid`` ended with an error; nothing more will come for it."""

    COMMAND: ClassVar[int] = 0x04
    cid: int
    code: int  # ErrorCode
    message: str
    retry_after_ms: int | None = None

    def validate(self) -> None:
        if self.code not in ErrorCode._value2member_map_:
            raise ProtocolError("RequestError: unknown error code", self.cid)


@register
@dataclass
class CatalogRequest(Message):
    """ingress → broker: which models are served now?"""

    COMMAND: ClassVar[int] = 0x05
    cid: int


@register
@dataclass
class CatalogReply(Message):
    """broker → ingress: the models workers announced (only those with a live worker)."""

    COMMAND: ClassVar[int] = 0x06
    cid: int
    models: list[ModelInfo]


@register
@dataclass
class TokenizerRequest(Message):
    """ingress → broker: the tokenizer.json whose sha256 is ``digest``."""

    COMMAND: ClassVar[int] = 0x07
    cid: int
    digest: str


@register
@dataclass
class TokenizerReply(Message):
    """broker → ingress: the tokenizer content (empty and ``found`` False when unknown)."""

    COMMAND: ClassVar[int] = 0x08
    cid: int
    digest: str
    found: bool
    content: bytes


@register
@dataclass
class Ping(Message):
    """ingress → broker liveness probe; any reply proves the broker alive."""

    COMMAND: ClassVar[int] = 0x09
    cid: int


@register
@dataclass
class Pong(Message):
    """broker → ingress: answer to Ping with the broker's queue and pool state."""

    COMMAND: ClassVar[int] = 0x0A
    cid: int
    stats: BrokerStats
    instance: int = 0  # random per broker process: a change means the broker restarted


# ---- broker ↔ worker ---------------------------------------------------------------------------


@register
@dataclass
class WorkerReady(Message):
    """worker → broker: first message on every fresh connection; grants ``credits``."""

    COMMAND: ClassVar[int] = 0x10
    name: str  # human-readable worker name (host:gpu), for logs and metrics
    model: ModelInfo
    tokenizer_json: bytes  # so the broker can serve it to ingresses by digest
    max_batch_tokens: int
    max_batch_requests: int
    credits: int  # batches it accepts at once (2 = one running, one prefetched)
    heartbeat_ms: int  # its heartbeat interval: silent for this x the broker's liveness = dead
    device: str
    # Of ``credits``, how many are kept for its live lane: small batches (of at most
    # ``live_tokens``) it runs beside its bulk work, on a CUDA stream of their own, so that a
    # query does not wait behind the bulk batches it holds. The broker then never mixes the
    # lanes in one batch, cuts interactive batches at ``live_tokens`` on the lane's credit and
    # gives batch-lane work only the other credits. 0: no live lane (a CPU worker; one from
    # before the field).
    live_credits: int = 0
    live_tokens: int = 0
    # Tokens per second of compute it measured at start: the rate of the budget
    # ``--max-batch-tokens auto`` chose, else of a probe batch (``mesh.worker.probe``: smaller
    # than a serving batch, so at most its bulk rate). The broker's estimate of its speed, for
    # bulk caps and admission in time, until its batches teach it one. 0: not measured.
    tokens_per_s: float = 0.0

    def validate(self) -> None:
        if not 1 <= self.credits <= 64:
            raise ProtocolError("WorkerReady: credits out of 1..64")
        if not 0 <= self.live_credits < self.credits:
            raise ProtocolError("WorkerReady: live_credits must leave bulk at least one credit")
        if self.live_credits and not 1 <= self.live_tokens <= self.max_batch_tokens:
            raise ProtocolError("WorkerReady: live_tokens out of 1..max_batch_tokens")
        if self.max_batch_tokens < 1 or self.max_batch_requests < 1:
            raise ProtocolError("WorkerReady: budgets must be positive")
        if not 0.0 <= self.tokens_per_s < math.inf:  # NaN fails too
            raise ProtocolError("WorkerReady: tokens_per_s must be finite and not negative")
        # The broker declares the worker dead after heartbeat_ms x its liveness of silence: a
        # worker must not be able to make itself immortal.
        if not 1 <= self.heartbeat_ms <= 60_000:
            raise ProtocolError("WorkerReady: heartbeat_ms out of 1..60000")
        self.model.check("WorkerReady.model")


@register
@dataclass
class BatchAssign(Message):
    """broker → worker: one packed batch; uses one credit. Sequence ``i`` is post-processed
    with ``outputs[output_index[i]]``; results come back grouped in that order. With spans,
    ``span_offsets`` covers every sequence of the batch: those of a group whose rows are
    "spans" have at least one, the others none."""

    COMMAND: ClassVar[int] = 0x11
    batch_id: int
    model: str
    timeout_ms: int  # the worker may drop the batch once this has passed
    outputs: list[OutputOptions]
    output_index: np.ndarray  # int32 [n]
    token_ids: np.ndarray
    offsets: np.ndarray
    segment_b_start: np.ndarray | None = None  # int32 [n] as in SubmitRequest; None: no pair
    spans: np.ndarray | None = None  # int32 [S, 2] as in SubmitRequest; None: no span group
    span_offsets: np.ndarray | None = None  # int32 [n + 1]

    def validate(self) -> None:
        _check_ragged(self.token_ids, self.offsets, "BatchAssign")
        _check_pairs(self.segment_b_start, self.offsets, "BatchAssign")
        _check_spans(self.spans, self.span_offsets, self.offsets, "BatchAssign", True)
        if not 1 <= len(self.outputs) <= self.n:
            raise ProtocolError("BatchAssign: 1..n output groups")
        for opt in self.outputs:
            opt.check("BatchAssign")
        if self.output_index.dtype != np.int32 or self.output_index.shape != (self.n,):
            raise ProtocolError("BatchAssign: output_index must be int32 [n]")
        least, most = bounds(self.output_index)  # n >= 1: there is an output group
        if least < 0 or most >= len(self.outputs):
            raise ProtocolError("BatchAssign: output_index out of range")
        groups = [opt.rows in SPAN_ROWS for opt in self.outputs]
        if self.span_offsets is None and not any(groups):
            return  # no spans and no span group: what follows would find nothing
        spanned = np.array(groups)[self.output_index]
        if self.span_offsets is None:
            if spanned.any():
                raise ProtocolError("BatchAssign: a span group without spans")
        elif ((self.span_offsets[1:] > self.span_offsets[:-1]) != spanned).any():
            raise ProtocolError("BatchAssign: spans exactly on the sequences of span groups")

    @property
    def n(self) -> int:
        return len(self.offsets) - 1


@register
@dataclass
class BatchResult(Message):
    """worker → broker: ``embeddings[g]`` holds, in batch order, the rows of the sequences
    whose output_index is ``g`` (a span group's: each sequence's span rows, in span order);
    returns one credit."""

    COMMAND: ClassVar[int] = 0x12
    batch_id: int
    compute_ms: float
    embeddings: list[np.ndarray]
    # Worker-side durations in ms, each measured on the worker's clock: "worker_wait" (batch
    # received → launched), "worker_compute" (launch → results on the host), "worker_reply"
    # (results on the host → reply handed to the socket). Empty from workers that do not say.
    timings: dict[str, float] = field(default_factory=dict)

    def validate(self) -> None:
        if any(e.ndim != 2 for e in self.embeddings):
            raise ProtocolError("BatchResult: embeddings must be 2-D")


@register
@dataclass
class BatchError(Message):
    """worker → broker: the batch failed; returns one credit. ``retryable`` work is requeued
    (within the attempt cap); otherwise every request in it fails with ``code``."""

    COMMAND: ClassVar[int] = 0x13
    batch_id: int
    code: int
    message: str
    retryable: bool

    def validate(self) -> None:
        # The broker turns the code into an ErrorCode for the clients of the batch: an unknown
        # one must be dropped here, not raise inside the broker's loop.
        if self.code not in ErrorCode._value2member_map_:
            raise ProtocolError("BatchError: unknown error code")


@register
@dataclass
class Heartbeat(Message):
    """both ways: liveness. From a worker, ``progress`` counts finished batches so a live socket
    in front of a hung compute loop is caught; ``busy`` says a batch is running."""

    COMMAND: ClassVar[int] = 0x14
    progress: int
    busy: bool


@register
@dataclass
class Disconnect(Message):
    """both ways: the sender is leaving (or telling the peer to go and READY again)."""

    COMMAND: ClassVar[int] = 0x15
    reason: str
