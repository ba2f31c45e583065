"""The engine serves the sentence-transformers pipeline as ``SentenceTransformer.encode`` does:
every pooling mode (and several concatenated), Dense layers after pooling (one or a stack,
Tanh or Identity, with or without bias), Normalize, and prompts prepended to the text. Tiny
random-weight models saved by sentence-transformers itself, fp32 on CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_helpers import cosines, pack
from tokenizers import Tokenizer

from mesh.client.tokenize import ModelTokenizer
from mesh.worker.engine.engine import Engine
from proto_msgs import ModelInfo
from tests.st_models import PROMPTS, DenseSpec, build_st_model, build_tiny_bert

pytest.importorskip("sentence_transformers")

TEXTS = [
    "a",
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods.",
    "東京は日本の首都です。",
    "packed batches need no padding " * 6,
]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def _ids(model_dir: Path, texts: list[str], limit: int) -> tuple[np.ndarray, np.ndarray]:
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(limit)
    return pack([e.ids for e in tok.encode_batch(texts)])


def _prompt_length(path: Path, card, prompt: str) -> int:
    """The prompt's tokens as the ingress counts them (the client's own code)."""
    info = ModelInfo(
        card.name, [], card.dims, card.max_input_tokens, 30522, card.pooling, card.normalize,
        card.tokenizer_digest,
    )  # fmt: skip
    return ModelTokenizer((path / "tokenizer.json").read_bytes(), info).prompt_length(prompt)


def _compare(path: Path, prompt_name: str | None = None, **encode) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(path), device="cpu")
    engine = Engine.load(path)
    card = engine.card
    name = prompt_name or card.default_prompt_name
    prefix = card.prompts[name] if name else ""
    ids, offsets = _ids(path, [prefix + t for t in TEXTS], card.max_input_tokens)
    skip = None
    if prefix and not card.include_prompt:
        skip = np.full(len(TEXTS), _prompt_length(path, card, prefix))
    ours = engine.embed_final(ids, offsets, skip=skip)
    ref = st.encode(TEXTS, prompt_name=prompt_name, convert_to_numpy=True, **encode)
    assert ours.shape == ref.shape == (len(TEXTS), card.dims)
    assert cosines(ours, ref).min() >= 0.99999
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "mode", ["mean", "cls", "lasttoken", "max", "mean_sqrt_len_tokens", "weightedmean"]
)
def test_every_pooling_mode_matches_sentence_transformers(bert_dir, tmp_path, mode) -> None:
    # Without Normalize: the raw pooled vectors must match, scale included.
    _compare(build_st_model(bert_dir, tmp_path / mode, pooling=mode, normalize=False))


def test_several_pooling_modes_are_concatenated_in_order(bert_dir, tmp_path) -> None:
    modes = ("cls", "max", "mean", "weightedmean")
    path = build_st_model(bert_dir, tmp_path / "multi", pooling=modes, normalize=False)
    assert Engine.load(path).card.pooling == "cls+max+mean+weightedmean"
    _compare(path)


@pytest.mark.parametrize(
    "dense",
    [
        [DenseSpec(16, "Tanh")],
        [DenseSpec(48, "Identity", bias=False), DenseSpec(24, "Identity", bias=False)],
        [DenseSpec(40, "GELU"), DenseSpec(8, "Tanh", bias=False)],
    ],
    ids=["tanh", "gemma-like-two-identity", "gelu-then-tanh"],
)
def test_dense_layers_after_pooling_match_sentence_transformers(bert_dir, tmp_path, dense) -> None:
    path = build_st_model(bert_dir, tmp_path / "dense", pooling="mean", dense=dense)
    assert Engine.load(path).card.dims == dense[-1].out_features
    _compare(path)


def test_dense_after_concatenated_pooling_without_normalize(bert_dir, tmp_path) -> None:
    path = build_st_model(
        bert_dir, tmp_path / "d", pooling=("mean", "max"), dense=[DenseSpec(20)], normalize=False
    )
    _compare(path)


def test_matryoshka_truncation_applies_after_the_dense_layers(bert_dir, tmp_path) -> None:
    path = build_st_model(bert_dir, tmp_path / "m", dense=[DenseSpec(24, "Identity")])
    from sentence_transformers import SentenceTransformer

    full = SentenceTransformer(str(path), device="cpu").encode(TEXTS, convert_to_numpy=True)
    engine = Engine.load(path)
    ours = engine.embed_final(*_ids(path, TEXTS, engine.card.max_input_tokens), dims=8)
    # Truncated then renormalized, as Matryoshka models are used.
    ref = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prompt_name", [None, "query", "instruct"])
def test_prompts_are_read_and_match_encode_with_a_prompt_name(
    bert_dir, tmp_path, prompt_name
) -> None:
    path = build_st_model(
        bert_dir, tmp_path / "p", pooling="mean", prompts=PROMPTS, default_prompt_name="passage"
    )
    card = Engine.load(path).card
    assert card.default_prompt_name == "passage"
    assert {k: card.prompts[k] for k in PROMPTS} == PROMPTS
    _compare(path, prompt_name)  # None: the default prompt applies, in both


@pytest.mark.parametrize(
    "mode", ["mean", "cls", "lasttoken", "max", "mean_sqrt_len_tokens", "weightedmean"]
)
@pytest.mark.parametrize("prompt_name", ["query", "instruct"])
def test_prompts_left_out_of_the_pooling_match_sentence_transformers(
    bert_dir, tmp_path, mode, prompt_name
) -> None:
    # include_prompt false (INSTRUCTOR-style): the prompt's tokens are attended to, not pooled.
    path = build_st_model(
        bert_dir, tmp_path / "ex", pooling=mode, prompts=PROMPTS, include_prompt=False,
        normalize=False,
    )  # fmt: skip
    assert Engine.load(path).card.include_prompt == (mode == "lasttoken")
    _compare(path, prompt_name)


def test_include_prompt_false_without_prompts_is_served(bert_dir, tmp_path) -> None:
    # The flag only matters when a prompt is prepended, and no request can name one here.
    path = build_st_model(bert_dir, tmp_path / "ip", pooling="mean", include_prompt=False)
    _compare(path)


def test_a_dense_saved_only_as_a_pickle_is_refused_at_load(bert_dir, tmp_path) -> None:
    import torch
    from safetensors.torch import load_file

    path = build_st_model(bert_dir, tmp_path / "bin", dense=[DenseSpec(16)])
    weights = path / "2_Dense" / "model.safetensors"
    torch.save(load_file(str(weights)), path / "2_Dense" / "pytorch_model.bin")
    weights.unlink()
    with pytest.raises(ValueError, match="only pytorch_model.bin"):
        Engine.load(path)
