"""bench/harness/family_models' FLOP count against hand computations on known shapes."""

from __future__ import annotations

import numpy as np
import pytest

from bench.harness.family_models import FAMILIES, attended_pairs, forward_flops, shape_of

BERT_BASE = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    vocab_size=30522,
)  # fmt: skip


def test_bert_base_flops_per_token_match_a_hand_computation() -> None:
    # per layer: q, k, v, o (4 x 768^2) and the FFN (2 x 768 x 3072) = 7,077,888 weights
    per_token = 2 * 7_077_888 * 12
    attention = 12 * 4 * 128**2 * 12 * 64  # 12 layers of QK^T + PV over 128 x 128 pairs
    shape = shape_of(BERT_BASE, "bert", causal=False)
    assert forward_flops(shape, np.array([128])) == per_token * 128 + attention
    assert per_token == 169_869_312


def test_qwen3_counts_gqa_and_the_gated_mlp_and_halves_causal_attention() -> None:
    config = dict(FAMILIES["qwen3"].config)
    shape = shape_of(config, "qwen3", causal=True)
    # q 1024x2048, k and v 1024x1024 each (8 kv heads of 128), o 2048x1024, 3 x 1024x3072
    assert shape.linear_weights == 1024 * 2048 * 2 + 2 * 1024 * 1024 + 3 * 1024 * 3072
    length = np.array([100])
    causal_pairs = 100 * 101 / 2
    expected = 28 * (2 * shape.linear_weights * 100 + 4 * causal_pairs * 16 * 128)
    assert forward_flops(shape, length) == pytest.approx(expected)


def test_window_pairs_count_keys_at_most_r_away() -> None:
    lengths = np.arange(1, 40)
    for r in (0, 1, 3, 8, 100):
        for causal in (False, True):
            brute = [
                sum(1 for i in range(n) for j in range(n)
                    if abs(i - j) <= r and (not causal or j <= i))
                for n in lengths
            ]  # fmt: skip
            assert attended_pairs(lengths, r, causal).tolist() == brute
    assert attended_pairs(lengths, None, False).tolist() == (lengths**2).tolist()


def test_modernbert_local_layers_attend_their_window_only() -> None:
    config = dict(FAMILIES["modernbert"].config)
    shape = shape_of(config, "modernbert", causal=False)
    # layers 0, 3, 6, ... global; the rest see 64 tokens either side
    assert shape.windows.count(None) == 8 and set(shape.windows) == {None, 64}
    assert shape.linear_weights == 4 * 768 * 768 + 3 * 768 * 1152  # GeGLU: Wi is 768 -> 2304
    long = forward_flops(shape, np.array([512]))
    full = forward_flops(shape_of(config | {"local_attention": 4096}, "modernbert", False),
                         np.array([512]))  # fmt: skip
    saved = 14 * 4 * 12 * 64 * (512**2 - attended_pairs(np.array([512]), 64, False)[0])
    assert full - long == pytest.approx(saved)


def test_splade_counts_the_mlm_head_over_the_vocabulary() -> None:
    dense = shape_of(BERT_BASE, "bert", causal=False)
    sparse = shape_of(BERT_BASE, "bert", causal=False, output="sparse")
    extra = forward_flops(sparse, np.array([10])) - forward_flops(dense, np.array([10]))
    assert extra == 2 * 10 * (768 * 768 + 768 * 30522)
