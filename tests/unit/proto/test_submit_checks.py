"""The submit check against the model card, written once (proto_msgs.checks): every rule, the
field and code each names, and alias resolution. The client and the broker both call it, so
these are the refusals a worker never meets (it trusts its broker)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from proto_msgs import ErrorCode, Lane, ModelInfo, OutputOptions, SubmitRequest, checks, limits
from proto_msgs.checks import Problem, submit_problem
from proto_msgs.small_arrays import SMALL, bounds

CARD = ModelInfo(
    name="mini", aliases=["org/mini"], dims=384, max_input_tokens=256, vocab_size=30522,
    pooling="mean", normalize=True, tokenizer_digest="d", hidden_size=384,
)  # fmt: skip
SCORER = dataclasses.replace(
    CARD, name="ranker", aliases=[], dims=1, task="score", labels=["score"], activation="sigmoid"
)
SPLADE = dataclasses.replace(CARD, name="splade", aliases=[], task="sparse", dims=30522)
M3 = dataclasses.replace(CARD, name="m3", aliases=[], multivector_dims=128, lexical=True)
SPARSE = OutputOptions(normalize=False, kind="sparse", top_k=8)


def _submit(
    lengths: list[int], output: OutputOptions | None = None, token: int = 1000, **more: np.ndarray
) -> SubmitRequest:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return SubmitRequest(
        cid=1, model="mini", lane=Lane.INTERACTIVE, timeout_ms=None,
        output=output or OutputOptions(), token_ids=np.full(int(offsets[-1]), token, np.int32),
        offsets=offsets, **more,
    )  # fmt: skip


def _problem(msg: SubmitRequest, model: ModelInfo = CARD) -> Problem:
    found = submit_problem(model, msg, msg.offsets[1:] - msg.offsets[:-1])
    assert found is not None
    return found


# ---- alias resolution --------------------------------------------------------------------------


def test_a_model_is_found_by_its_name_or_by_an_alias():
    models = [SCORER, CARD]
    assert checks.find_model(models, "mini") is CARD
    assert checks.find_model(models, "org/mini") is CARD
    assert checks.find_model(models, "nothing") is None
    assert checks.find_model([], "mini") is None


def test_a_served_name_wins_over_another_models_alias_of_it():
    squatter = dataclasses.replace(SCORER, aliases=["mini"])
    assert checks.find_model([squatter, CARD], "mini") is CARD
    assert checks.find_model([squatter, CARD], "ranker") is squatter


# ---- the whole submit --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, SMALL, SMALL + 1])
def test_a_submit_within_the_card_passes(n):
    lengths = [256] + [1] * (n - 1)
    assert submit_problem(CARD, _submit(lengths, token=30521), np.array(lengths)) is None


@pytest.mark.parametrize("n", [1, SMALL, SMALL + 1])
def test_ids_outside_the_vocabulary_are_refused_naming_the_first(n):
    msg = _submit([2] * n, token=5)
    msg.token_ids[-1] = 30522
    msg.token_ids[0] = 40000  # the first outside is named, not the largest
    problem = _problem(msg)
    assert problem.code == ErrorCode.INVALID_INPUT and problem.param == "input"
    assert problem.message == "token id 40000 is outside the vocabulary of 'mini' (0..30521)"


@pytest.mark.parametrize("n", [1, SMALL, SMALL + 1])
def test_a_sequence_over_the_input_limit_is_refused_naming_it_and_the_fix(n):
    problem = _problem(_submit([3] * (n - 1) + [257]))
    assert f"input[{n - 1}] has 257 tokens, more than 256 tokens" in problem.message
    assert "truncat" in problem.message and problem.param == "input"


def test_dims_over_the_width_are_refused_naming_the_field():
    problem = _problem(_submit([3], OutputOptions(dims=385)))
    assert problem.param == "dimensions" and problem.code == ErrorCode.INVALID_INPUT
    assert problem.message == "'dimensions' must be between 1 and 384 for model 'mini'; got 385"
    assert submit_problem(CARD, _submit([3], OutputOptions(dims=384)), np.array([3])) is None


def test_pairs_are_for_cross_encoders_only():
    pairs = np.array([2], np.int32)
    assert "pairs are for cross-encoders" in _problem(_submit([5], segment_b_start=pairs)).message
    assert submit_problem(SCORER, _submit([5], segment_b_start=pairs), np.array([5])) is None


def test_a_prompt_left_out_must_leave_each_sequence_a_token():
    skipping = dataclasses.replace(CARD, include_prompt=False)
    msg = _submit([5, 3, 2], OutputOptions(pool_skip=3))
    assert "input[1] keeps no token after the prompt's 3" in _problem(msg, skipping).message
    assert "pools it" in _problem(msg, CARD).message  # its pooling keeps the prompt
    fits = _submit([5, 4], OutputOptions(pool_skip=3))
    assert submit_problem(skipping, fits, np.array([5, 4])) is None


# ---- the rules one by one, as the client calls them ----------------------------------------------


@pytest.mark.parametrize(
    ("model", "output", "param", "says"),
    [
        (CARD, OutputOptions(dims=0), "dimensions", "between 1 and 384"),
        (CARD, SPARSE, "model", "has no sparse weights"),
        (SPLADE, OutputOptions(), "model", "gives sparse weights only"),
        (SCORER, OutputOptions(rows="spans"), "model", "is a cross-encoder"),
        (SPLADE, OutputOptions(kind="sparse", top_k=8, rows="spans"), "model",
         "is a sparse (SPLADE) model; span rows"),
        (dataclasses.replace(CARD, hidden_size=0), OutputOptions(rows="spans"), "model",
         "do not serve"),
        (CARD, OutputOptions(rows="multivector"), "model", "no multi-vector head"),
        (M3, OutputOptions(dims=129, rows="multivector"), "dimensions", "128 per token"),
    ],
)  # fmt: skip
def test_output_options_the_model_cannot_give_are_refused(model, output, param, says):
    problem = checks.output_problem(model, output)
    assert problem is not None and problem.param == param and says in problem.message


@pytest.mark.parametrize(
    ("model", "output"),
    [
        (SPLADE, SPARSE),
        (M3, SPARSE),  # a lexical embedder gives both
        (M3, OutputOptions(dims=128, rows="multivector")),
        (CARD, OutputOptions(dims=64, kind="int8", rows="spans")),
        (CARD, OutputOptions(kind="binary")),
    ],
)
def test_output_options_within_the_card_pass(model, output):
    assert checks.output_problem(model, output) is None


@pytest.mark.parametrize("bad", [-1, 30522, 2**32 + 5, 2**40])
def test_ids_are_checked_in_the_callers_width_before_any_cast(bad):
    ids = np.array([1, 2, bad, 3], dtype=np.int64)
    problem = checks.ids_problem(CARD, ids, *bounds(ids))
    assert problem is not None and f"token id {bad} is outside" in problem.message
    assert checks.ids_problem(CARD, ids[:2], *bounds(ids[:2])) is None


def test_an_empty_sequence_is_refused_naming_it():
    lengths = np.array([2, 0, 3])
    problem = checks.lengths_problem(CARD, lengths, *bounds(lengths))
    assert problem is not None and problem.message == "input[1] is empty"


def test_a_prompt_skip_is_refused_only_where_it_leaves_nothing():
    assert checks.pool_skip_problem(CARD, 0, np.array([1])) is None
    assert checks.pool_skip_problem(CARD, 2, np.array([3, 4])) is None
    problem = checks.pool_skip_problem(CARD, 2, np.array([3, 2]))
    assert problem is not None and problem.message.startswith("input[1] keeps no token")


def test_more_than_a_message_may_carry_is_too_large():
    assert checks.size_problem(limits.MAX_SEQUENCES, limits.MAX_TOKENS) is None
    for sequences, tokens in [(limits.MAX_SEQUENCES + 1, 1), (1, limits.MAX_TOKENS + 1)]:
        problem = checks.size_problem(sequences, tokens)
        assert problem is not None and problem.code == ErrorCode.TOO_LARGE
