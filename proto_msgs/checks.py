"""The submit check, written once: a request against its model's card.

The codec checks what any message must be (shapes, dtypes, known kinds: ``messages``); this
module checks what a ``SubmitRequest`` must be for the model it names, so that a worker never
meets a batch it would fail on. Two callers, one set of rules and messages: the client, before
sending (``mesh.client.request``: the user gets the precise error early, as an HTTP 4xx naming
the field), and the broker on its socket (``mesh.broker.server``: any peer may send a submit,
and one that reached the queue is batched with other clients' work). The worker trusts its
broker and checks nothing again.

Every rule answers a ``Problem`` (what to fix, the request field at fault, the wire error code)
or None; nothing raises, so a check costs no exception on the hot path. Short arrays are
reduced in Python (``small_arrays``): a query pays no numpy call here.

Alias resolution lives here too (``find_model``): the client, its book of models seen and the
broker's registry resolve names with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from proto_msgs import limits
from proto_msgs.errors import ErrorCode
from proto_msgs.messages import ModelInfo, OutputOptions, SubmitRequest
from proto_msgs.small_arrays import least, most


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a request cannot be served by its model: said so that its sender can fix it."""

    message: str
    param: str = "input"  # the request field at fault, as an HTTP error names it
    code: ErrorCode = ErrorCode.INVALID_INPUT


def find_model(models: Iterable[ModelInfo], name: str) -> ModelInfo | None:
    """The model called ``name``, else the first whose aliases hold ``name``; None if none.
    A served name wins over another model's alias of it."""
    by_alias = None
    for model in models:
        if model.name == name:
            return model
        if by_alias is None and name in model.aliases:
            by_alias = model
    return by_alias


def over_limit_message(i: int, model: ModelInfo, tokens: int | None = None) -> str:
    """One wording for an over-long input, whether its exact length is known or not (texts are
    cut before tokenizing, so theirs is not: counting would mean tokenizing all of it)."""
    count = f"{tokens} tokens, more than" if tokens is not None else "more than"
    return (
        f"input[{i}] has {count} {model.max_input_tokens} tokens, the limit of model "
        f"{model.name!r}; shorten it or ask for truncation (the server's --auto-truncate, "
        f"or MeshClient's truncate=True)"
    )


# What span rows make, for the messages of a model that cannot make them.
_SPAN_OUTPUTS = {
    "spans": "span rows (per-token or chunk vectors)",
    "multivector": "multi-vector embeddings",
}


def span_model_problem(model: ModelInfo, what: str) -> Problem | None:
    """Span rows (``what``: the output they make) need an embedder that says its hidden width
    (a worker from before spans does not)."""
    if model.task != "embed":
        kind = "a cross-encoder" if model.task == "score" else "a sparse (SPLADE) model"
        return Problem(f"model {model.name!r} is {kind}; {what} needs an embedder", "model")
    if model.hidden_size <= 0:
        return Problem(
            f"the workers of model {model.name!r} do not serve {what} (upgrade them)", "model"
        )
    return None


def output_problem(model: ModelInfo, output: OutputOptions) -> Problem | None:
    """``output`` against the card: the rows the model can make, ``dims`` within their width
    (Matryoshka prefixes), the kind within its task, a prompt left out only where its pooling
    leaves it out. The codec already checked the options alone (``OutputOptions.check``)."""
    dims = output.dims
    if output.rows != "sequence":
        problem = _rows_problem(model, output)
        if problem is not None:
            return problem
    elif dims is not None and not 1 <= dims <= model.dims:
        return _dims_problem(model, dims, model.dims)
    # A lexical embedder (bge-m3) gives both; a SPLADE model only sparse weights.
    if (output.kind == "sparse") != (model.task == "sparse") and not model.lexical:
        does = "gives sparse weights only" if model.task == "sparse" else "has no sparse weights"
        return Problem(
            f"model {model.name!r} {does}; output kind {output.kind!r} does not fit it", "model"
        )
    if output.pool_skip and model.include_prompt:
        return Problem(
            "pool_skip is for models whose pooling leaves the prompt out; this one pools it"
        )
    return None


def _rows_problem(model: ModelInfo, output: OutputOptions) -> Problem | None:
    """Span rows: a model that makes them and, for a multi-vector head's, ``dims`` within the
    head's width (not the pooled one: past it the worker's batch would fail)."""
    problem = span_model_problem(model, _SPAN_OUTPUTS[output.rows])
    if problem is not None:
        return problem
    width, per = model.dims, ""
    if output.rows == "multivector":
        if model.multivector_dims <= 0:
            return Problem(
                f"model {model.name!r} has no multi-vector head (bge-m3's colbert_linear)",
                "model",
            )
        width, per = model.multivector_dims, " per token"
    dims = output.dims
    return None if dims is None or 1 <= dims <= width else _dims_problem(model, dims, width, per)


def _dims_problem(model: ModelInfo, dims: int, width: int, per: str = "") -> Problem:
    return Problem(
        f"'dimensions' must be between 1 and {width}{per} for model {model.name!r}; got {dims}",
        "dimensions",
    )


def ids_problem(model: ModelInfo, ids: np.ndarray, lowest: int, highest: int) -> Problem | None:
    """Token ids (any integer width: before a cast could wrap one into range) within the
    vocabulary, given their bounds; the first id outside it is named."""
    if lowest >= 0 and highest < model.vocab_size:
        return None
    bad = int(np.flatnonzero((ids < 0) | (ids >= model.vocab_size))[0])
    return Problem(
        f"token id {int(ids[bad])} is outside the vocabulary of {model.name!r} "
        f"(0..{model.vocab_size - 1})"
    )


def lengths_problem(
    model: ModelInfo, lengths: np.ndarray, shortest: int, longest: int
) -> Problem | None:
    """Sequence lengths, given their bounds: none empty, none over the model's limit."""
    if shortest < 1:
        return Problem(f"input[{int(np.argmin(lengths))}] is empty")
    limit = model.max_input_tokens
    if longest > limit:
        i = int(np.argmax(lengths > limit))
        return Problem(over_limit_message(i, model, int(lengths[i])))
    return None


def pool_skip_problem(model: ModelInfo, skip: int, lengths: np.ndarray) -> Problem | None:
    """A prompt's ``skip`` tokens left out of the pooling must leave each sequence a token."""
    if not skip or least(lengths) > skip:
        return None
    i = int(np.flatnonzero(lengths <= skip)[0])
    return Problem(
        f"input[{i}] keeps no token after the prompt's {skip} within the "
        f"{model.max_input_tokens}-token limit of model {model.name!r}"
    )


def size_problem(sequences: int, tokens: int) -> Problem | None:
    """No more sequences, nor tokens in all, than one message may carry."""
    if sequences > limits.MAX_SEQUENCES:
        return Problem(
            f"{sequences} inputs; at most {limits.MAX_SEQUENCES} a request",
            code=ErrorCode.TOO_LARGE,
        )
    if tokens > limits.MAX_TOKENS:
        return Problem(
            f"{tokens} tokens in all; at most {limits.MAX_TOKENS} a request",
            code=ErrorCode.TOO_LARGE,
        )
    return None


def submit_problem(model: ModelInfo, msg: SubmitRequest, lengths: np.ndarray) -> Problem | None:
    """Every rule above for a decoded ``msg`` (the codec checked its shapes: offsets rise from
    0 to len(token_ids), ids >= 0); ``lengths`` is ``offsets[1:] - offsets[:-1]``, computed once
    by the caller. Pairs (``segment_b_start``) are a cross-encoder's alone."""
    problem = output_problem(model, msg.output)
    if problem is not None:
        return problem
    if msg.segment_b_start is not None and model.task != "score":
        return Problem(
            f"model {model.name!r} embeds texts; pairs are for cross-encoders (rerank, predict)"
        )
    # The codec let through only rising offsets (no sequence is empty: one reduction) and no
    # more sequences or tokens than a message may carry (``size_problem``).
    problem = lengths_problem(model, lengths, 1, most(lengths))
    if problem is None and msg.output.pool_skip:
        problem = pool_skip_problem(model, msg.output.pool_skip, lengths)
    if problem is not None:
        return problem
    # One pass over the ids (len >= 1: every sequence holds a token); negatives are the codec's.
    return ids_problem(model, msg.token_ids, 0, most(msg.token_ids))
