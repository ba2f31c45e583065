"""The front door's one validation: a request becomes a ``ValidRequest`` once, and later layers
trust it (TEI's ``ValidEncoding``, vLLM's ``EngineCoreRequest``).

A ``ValidRequest`` carries the resolved model card and everything ready to send: int32 ids and
offsets, the per-sequence lengths (computed once, here), the output options and the lane.
``MeshClient.submit`` sends it without resolving or checking again; the broker applies the same
check against the card to what arrives on its socket (its own trust boundary).

Two ways in: ``valid_tokens`` for ids a caller gives (every check, once each), and
``valid_tokenized`` for ids our tokenizer produced (in the vocabulary and within the limit by
construction, so only the options are checked). The rules against the model's card are the
broker's own, written once in ``proto_msgs.checks``; here their problems become typed errors
(``refuse``) naming the field at fault.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from mesh.config import MAX_SPARSE_PAIRS
from mesh.errors import InvalidInput, TooLarge, error_from_code
from proto_msgs import OUTPUT_KINDS, Lane, ModelInfo, OutputOptions, limits
from proto_msgs.checks import (
    Problem,
    ids_problem,
    lengths_problem,
    output_problem,
    pool_skip_problem,
    size_problem,
)
from proto_msgs.small_arrays import bounds

# Requests of more tokens than this go to the broker's BATCH lane, smaller ones to INTERACTIVE,
# unless the caller chose. 1024 tokens is a handful of passages or dozens of queries: an eighth
# of a CPU batch budget (8192), so interactive work always fits beside other work in the next
# batch, while bulk indexing requests (thousands of tokens) queue behind it.
INTERACTIVE_MAX_TOKENS = 1024
# Before tokenizing, the lane of a text request is guessed from its characters (for the
# tokenizer's own priority): English averages about 4 characters per WordPiece/BPE token.
CHARS_PER_TOKEN_GUESS = 4


@dataclass(frozen=True)
class ValidRequest:
    """A request checked against its model, ready to be sent as one SubmitRequest."""

    model: ModelInfo
    token_ids: np.ndarray  # int32, all sequences concatenated
    offsets: np.ndarray  # int32, n + 1 entries
    lengths: np.ndarray  # int32, n entries, each in 1..model.max_input_tokens
    output: OutputOptions
    lane: Lane
    # A cross-encoder's request: per sequence where its second text begins (0: a single
    # text); None for every other request (SubmitRequest.segment_b_start).
    segment_b_start: np.ndarray | None = None
    # A request of several rows per sequence (output.rows "spans"): int32 [S, 2] token ranges
    # relative to each sequence and int32 [n + 1] offsets into them (SubmitRequest.spans).
    spans: np.ndarray | None = None
    span_offsets: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.lengths)

    @property
    def rows(self) -> int:
        """Rows of its answer: one per sequence, or one per span."""
        return self.n if self.span_offsets is None else int(self.span_offsets[-1])

    @property
    def tokens(self) -> int:
        return len(self.token_ids)


def lane_for(tokens: int, chosen: int | None) -> Lane:
    """The caller's lane when it chose one, else by size."""
    if chosen is not None:
        return _chosen_lane(chosen)
    return Lane.BATCH if tokens > INTERACTIVE_MAX_TOKENS else Lane.INTERACTIVE


def guess_lane(texts: list[str], chosen: int | None) -> Lane:
    """The lane a text request will likely get, before it is tokenized."""
    if chosen is not None:
        return _chosen_lane(chosen)
    return lane_for(sum(map(len, texts)) // CHARS_PER_TOKEN_GUESS, None)


def _chosen_lane(chosen: int) -> Lane:
    # A MeshError, as every failure of the client's calls is, not numpy's or enum's ValueError.
    try:
        return Lane(chosen)
    except ValueError:
        names = ", ".join(f"{lane.value} ({lane.name.lower()})" for lane in Lane)
        raise InvalidInput(f"lane must be one of {names}; got {chosen!r}", param="lane") from None


def output_options(
    model: ModelInfo,
    dims: int | None,
    normalize: bool,
    kind: str,
    top_k: int | None = None,
    threshold: float = 0.0,
    n: int = 1,
) -> OutputOptions:
    """The checked output options of a request of ``n`` inputs; for the kind "sparse",
    ``top_k`` and ``threshold`` (:func:`sparse_options`), and no ``dims`` or normalization."""
    if kind == "sparse":
        return sparse_options(model, dims, top_k, threshold, n)
    if kind not in OUTPUT_KINDS:
        raise InvalidInput(
            f"unknown output kind {kind!r}; use one of {sorted(OUTPUT_KINDS)}", param="kind"
        )
    output = OutputOptions(dims=dims, normalize=normalize, kind=kind)
    refuse(output_problem(model, output))
    return output


def sparse_options(
    model: ModelInfo, dims: int | None, top_k: int | None, threshold: float, n: int = 1
) -> OutputOptions:
    """``top_k``: the most (id, weight) pairs per input, the largest, from 1 to the model's
    vocabulary; None: every weight over ``threshold`` (>= 0), as TEI returns them. An input
    may answer up to ``top_k`` pairs (the whole vocabulary without it), so a request's answer
    is bounded by ``n * top_k``: over ``MAX_SPARSE_PAIRS``, TooLarge, saying to send fewer
    inputs or set ``top_k``."""
    if dims is not None:
        raise InvalidInput("sparse weights have no 'dimensions'", param="dimensions")
    most = min(model.vocab_size, limits.MAX_SPARSE_TOP_K)
    if top_k is not None and (type(top_k) is not int or not 1 <= top_k <= most):
        raise InvalidInput(
            f"'top_k' must be an integer from 1 to {most} (model {model.name!r}'s vocabulary"
            f"{'' if most == model.vocab_size else ', as far as the wire carries it'}); "
            f"got {top_k!r}",
            param="top_k",
        )
    if isinstance(threshold, bool) or not (0.0 <= threshold < float("inf")):
        raise InvalidInput(
            f"'threshold' must be a number >= 0; got {threshold!r}", param="threshold"
        )
    k = model.vocab_size if top_k is None else top_k
    if k > most:  # a vocabulary wider than a row may be: every weight cannot be sent
        raise InvalidInput(
            f"model {model.name!r} has {k} vocabulary entries, over the {most} pairs a row "
            f"carries: set 'top_k' (1 to {most})",
            param="top_k",
        )
    if n * k > MAX_SPARSE_PAIRS:
        raise TooLarge(_over_pairs(n, k, top_k is None), param="top_k" if top_k else "inputs")
    output = OutputOptions(normalize=False, kind="sparse", top_k=k, threshold=float(threshold))
    refuse(output_problem(model, output))
    return output


def _over_pairs(n: int, k: int, every: bool) -> str:
    each = f"every weight of its {k}-entry vocabulary" if every else f"top_k={k} pairs"
    fix = f"send at most {max(1, MAX_SPARSE_PAIRS // k)} inputs per request"
    return (
        f"{n} inputs, each answering up to {each}, could be {n * k} (index, value) pairs, "
        f"over the limit of {MAX_SPARSE_PAIRS} per request: {fix}, or set 'top_k' to at most "
        f"{max(1, MAX_SPARSE_PAIRS // n)}"
    )


def refuse(problem: Problem | None) -> None:
    """Raise ``problem`` (``proto_msgs.checks``) as the typed error of its code, naming its
    field; nothing when there is none."""
    if problem is not None:
        error = error_from_code(problem.code, problem.message)
        error.param = problem.param
        raise error


def check_task(model: ModelInfo, task: str) -> None:
    """InvalidInput naming what ``model`` does when it does not do ``task``: embeddings from a
    cross-encoder or a sparse model, scores from an embedding model, sparse weights from a
    model without them; anything but per-token vectors (``late_interaction``) from a ColBERT
    model."""
    if model.late_interaction is not None:
        raise InvalidInput(
            f"model {model.name!r} is a ColBERT model: its vectors are per token, at "
            "/embed_multivector (input_type query or document); it has no pooled embeddings, "
            "raw token states, sparse weights or scores",
            param="model",
        )
    if model.task == task or (task == "sparse" and model.lexical):
        return
    if model.task == "sparse":
        raise InvalidInput(
            f"model {model.name!r} is a sparse (SPLADE) model: it gives vocabulary weights "
            "(/embed_sparse) and has no dense embeddings or scores",
            param="model",
        )
    if task == "sparse":
        what = "a cross-encoder" if model.task == "score" else "a dense embedding model"
        raise InvalidInput(
            f"model {model.name!r} is {what}: it has no sparse weights; /embed_sparse needs a "
            "sparse (SPLADE) model or an embedder with lexical weights (bge-m3)",
            param="model",
        )
    if model.task == "score":
        raise InvalidInput(
            f"model {model.name!r} is a cross-encoder: it scores texts and (query, passage) "
            "pairs (/rerank, /predict, /v1/rerank) and has no embeddings",
            param="model",
        )
    raise InvalidInput(
        f"model {model.name!r} is an embedding model: it has no scores; rerank and predict "
        "need a cross-encoder (sequence-classification) model",
        param="model",
    )


def prompt_text(model: ModelInfo, prompt_name: str | None) -> str:
    """The text put before each input text: the named prompt (``prompt_name``), else the
    model's default prompt, else none. An unknown name is InvalidInput naming the prompts."""
    name = model.default_prompt_name if prompt_name is None else prompt_name
    if name is None:
        return ""
    text = model.prompts.get(name)
    if text is None:
        served = ", ".join(repr(p) for p in model.prompts) or "none"
        raise InvalidInput(
            f"unknown prompt_name {name!r} for model {model.name!r}; its prompts: {served}",
            param="prompt_name",
        )
    return text


def prompt_skip(
    model: ModelInfo, output: OutputOptions, skip: int, lengths: np.ndarray
) -> OutputOptions:
    """``output`` leaving the prompt's ``skip`` tokens out of the pooling (a model whose
    pooling excludes the prompt); InvalidInput when the limit left an input nothing else."""
    refuse(pool_skip_problem(model, skip, lengths))
    return dataclasses.replace(output, pool_skip=skip)


def valid_tokens(
    model: ModelInfo,
    token_ids: np.ndarray,
    offsets: np.ndarray,
    output: OutputOptions,
    lane: int | None,
    truncate: bool,
) -> ValidRequest:
    """Ids a caller gave: shape, vocabulary, lengths (cut at the limit when ``truncate``, else
    refused), each checked once."""
    raw = np.asarray(token_ids)
    offsets = np.asarray(offsets)
    if raw.ndim != 1 or offsets.ndim != 1 or len(offsets) < 2:
        raise InvalidInput("token input must hold at least one sequence", param="input")
    if not (np.issubdtype(raw.dtype, np.integer) or raw.size == 0):
        raise InvalidInput("token ids must be integers", param="input")
    if int(offsets[0]) != 0 or int(offsets[-1]) != len(raw):
        raise InvalidInput("offsets must start at 0 and end at the number of tokens", param="input")
    # In the caller's width, before the int32 cast could wrap 2**32 + 5 into the vocabulary.
    lowest, highest = bounds(raw) if raw.size else (0, 0)
    refuse(ids_problem(model, raw, lowest, highest))
    wide = offsets.astype(np.int64)
    lengths = wide[1:] - wide[:-1]  # np.diff's own overhead is 3x this subtraction's
    shortest, longest = bounds(lengths)
    ids = np.ascontiguousarray(raw, dtype=np.int32)
    offsets = np.ascontiguousarray(offsets, dtype=np.int32)
    if truncate and shortest >= 1 and longest > model.max_input_tokens:
        ids, offsets, lengths = truncate_tokens(ids, offsets, lengths, model.max_input_tokens)
        longest = model.max_input_tokens
    refuse(
        size_problem(len(lengths), len(ids)) or lengths_problem(model, lengths, shortest, longest)
    )
    lengths = lengths.astype(np.int32)
    return ValidRequest(model, ids, offsets, lengths, output, lane_for(len(ids), lane))


def valid_tokenized(
    model: ModelInfo,
    token_ids: np.ndarray,
    lengths: np.ndarray,
    output: OutputOptions,
    lane: int | None,
) -> ValidRequest:
    """Ids our tokenizer produced (int32, lengths in 1..limit by construction)."""
    refuse(size_problem(len(lengths), len(token_ids)))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return ValidRequest(model, token_ids, offsets, lengths, output, lane_for(len(token_ids), lane))


def truncate_tokens(
    ids: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, max_tokens: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keep the first ``max_tokens`` ids of each sequence."""
    starts = offsets[:-1]
    kept = np.minimum(lengths, max_tokens)
    new_offsets = np.zeros(len(offsets), dtype=np.int32)
    np.cumsum(kept, out=new_offsets[1:])
    # Index of every kept id: its sequence's start plus its position within the sequence.
    seq_of = np.repeat(np.arange(len(kept)), kept)
    pos = np.arange(int(new_offsets[-1])) - new_offsets[:-1][seq_of]
    return ids[starts[seq_of] + pos], new_offsets, kept
