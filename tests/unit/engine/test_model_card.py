"""read_card: names, limits, pooling and attention mode from a model directory."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from mesh.worker.engine.card import read_card


@pytest.fixture
def minilm_copy(minilm_dir: Path, tmp_path: Path) -> Path:
    # Only the small files: the card never reads weights.
    target = tmp_path / "my-minilm"
    target.mkdir()
    for name in ("config.json", "tokenizer.json", "modules.json", "sentence_bert_config.json"):
        shutil.copy(minilm_dir / name, target / name)
    shutil.copytree(minilm_dir / "1_Pooling", target / "1_Pooling")
    return target


def _edit(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_the_embedded_default_has_its_hub_name_as_alias(minilm_dir: Path) -> None:
    card = read_card(minilm_dir)
    assert card.name == "all-MiniLM-L6-v2"
    assert card.aliases == ["sentence-transformers/all-MiniLM-L6-v2"]
    assert card.tokenizer_json == (minilm_dir / "tokenizer.json").read_bytes()
    assert card.tokenizer_digest == hashlib.sha256(card.tokenizer_json).hexdigest()


def test_a_served_name_renames_the_default_and_keeps_the_known_names(minilm_dir) -> None:
    card = read_card(minilm_dir, served_name="mini")
    assert card.name == "mini"
    assert card.aliases == ["all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"]


def test_another_directory_is_named_after_itself(minilm_copy: Path) -> None:
    card = read_card(minilm_copy)
    assert (card.name, card.aliases) == ("my-minilm", [])
    assert read_card(minilm_copy, served_name="x").name == "x"


def test_bert_max_input_is_the_smaller_of_both_limits(minilm_copy: Path) -> None:
    assert read_card(minilm_copy).max_input_tokens == 256
    _edit(minilm_copy / "sentence_bert_config.json", max_seq_length=4096)
    assert read_card(minilm_copy).max_input_tokens == 512
    (minilm_copy / "sentence_bert_config.json").unlink()
    assert read_card(minilm_copy).max_input_tokens == 512


def test_normalize_follows_the_normalize_module(minilm_copy: Path) -> None:
    assert read_card(minilm_copy).normalize
    modules = json.loads((minilm_copy / "modules.json").read_text())
    (minilm_copy / "modules.json").write_text(json.dumps(modules[:2]))
    assert not read_card(minilm_copy).normalize


def test_cls_pooling_is_read_from_the_pooling_config(minilm_copy: Path) -> None:
    pooling = minilm_copy / "1_Pooling" / "config.json"
    _edit(pooling, pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    assert read_card(minilm_copy).pooling == "cls"


def test_bert_without_a_pooling_config_is_mean_pooled(minilm_copy: Path) -> None:
    shutil.rmtree(minilm_copy / "1_Pooling")
    (minilm_copy / "modules.json").unlink()
    card = read_card(minilm_copy)
    assert (card.pooling, card.normalize) == ("mean", False)


@pytest.mark.parametrize(
    ("flags", "pooling"),
    [
        ({"pooling_mode_max_tokens": True}, "max"),
        ({"pooling_mode_mean_sqrt_len_tokens": True}, "mean_sqrt_len"),
        ({"pooling_mode_weightedmean_tokens": True}, "weightedmean"),
        # Several flags concatenate in sentence-transformers' fixed order, whatever the file's.
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, "cls+mean"),
        ({"pooling_mode": ["max", "cls"]}, "max+cls"),  # newer saves: names, in their order
        ({"pooling_mode": "lasttoken"}, "last"),
    ],
)
def test_every_pooling_layout_is_read(minilm_copy: Path, flags: dict, pooling: str) -> None:
    _edit(minilm_copy / "1_Pooling" / "config.json", **{"pooling_mode_mean_tokens": False, **flags})
    card = read_card(minilm_copy)
    assert (card.pooling, card.dims) == (pooling, 384 * len(pooling.split("+")))


def test_an_unknown_pooling_mode_is_refused(minilm_copy: Path) -> None:
    _edit(minilm_copy / "1_Pooling" / "config.json", pooling_mode="attention")
    with pytest.raises(ValueError, match="attention"):
        read_card(minilm_copy)


def _with_prompts(model_dir: Path, prompts: dict, default: str | None = None) -> None:
    doc = {"prompts": prompts, "default_prompt_name": default}
    (model_dir / "config_sentence_transformers.json").write_text(json.dumps(doc))


def test_prompts_and_their_default_are_read(minilm_copy: Path) -> None:
    _with_prompts(minilm_copy, {"query": "query: ", "passage": "passage: "}, "query")
    card = read_card(minilm_copy)
    assert card.prompts == {"query": "query: ", "passage": "passage: "}
    assert card.default_prompt_name == "query"


def test_a_default_prompt_that_is_not_a_prompt_is_refused(minilm_copy: Path) -> None:
    _with_prompts(minilm_copy, {"query": "query: "}, "passage")
    with pytest.raises(ValueError, match="passage"):
        read_card(minilm_copy)


def test_pooling_that_leaves_out_the_prompt_is_read(minilm_copy: Path) -> None:
    _edit(minilm_copy / "1_Pooling" / "config.json", include_prompt=False)
    _with_prompts(minilm_copy, {"query": "query: ", "document": ""})
    assert not read_card(minilm_copy).include_prompt
    # Last-token pooling never reads the prompt: nothing to leave out.
    _edit(minilm_copy / "1_Pooling" / "config.json", pooling_mode="lasttoken")
    assert read_card(minilm_copy).include_prompt


def _add_dense(model_dir: Path, config: dict | None, at: int = 2) -> None:
    modules = json.loads((model_dir / "modules.json").read_text())
    entry = {
        "idx": at,
        "name": str(at),
        "path": "2_Dense",
        "type": "sentence_transformers.models.Dense",
    }
    modules.insert(at, entry)
    (model_dir / "modules.json").write_text(json.dumps(modules))
    if config is not None:
        (model_dir / "2_Dense").mkdir()
        (model_dir / "2_Dense" / "config.json").write_text(json.dumps(config))


def test_a_dense_module_sets_the_dims(minilm_copy: Path) -> None:
    _add_dense(minilm_copy, {"in_features": 384, "out_features": 128, "bias": True})
    card = read_card(minilm_copy)
    assert card.dims == 128
    assert (card.dense[0].activation, card.dense[0].path) == ("Tanh", "2_Dense")  # ST's default


@pytest.mark.parametrize(
    ("config", "at", "match"),
    [
        (None, 2, "no config.json"),
        ({"in_features": 256, "out_features": 128}, 2, "takes 256 features"),
        (
            {"in_features": 384, "out_features": 8, "activation_function": "my.pkg.Swish"},
            2,
            "my.pkg.Swish",
        ),
        (
            {"in_features": 384, "out_features": 8, "module_input_name": "token_embeddings"},
            2,
            "token_embeddings",
        ),
        ({"in_features": 384, "out_features": 8}, 3, "after Normalize"),
        ({"in_features": 384, "out_features": 8}, 1, "before Pooling"),
    ],
)
def test_a_dense_module_we_cannot_serve_exactly_is_refused(minilm_copy, config, at, match) -> None:
    _add_dense(minilm_copy, config, at)
    with pytest.raises(ValueError, match=match):
        read_card(minilm_copy)


def test_an_unknown_module_is_refused_by_name(minilm_copy: Path) -> None:
    modules = json.loads((minilm_copy / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_X", "type": "my.pkg.LayerNorm"})
    (minilm_copy / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="LayerNorm"):
        read_card(minilm_copy)


def test_an_unknown_architecture_is_refused(minilm_copy: Path) -> None:
    _edit(minilm_copy / "config.json", model_type="t5")
    with pytest.raises(ValueError, match="t5"):
        read_card(minilm_copy)


def _qwen3_dir(tmp_path: Path, config: dict, pooling: dict | None = None) -> Path:
    path = tmp_path / "qwen3"
    path.mkdir()
    base = {"model_type": "qwen3", "hidden_size": 1024, "max_position_embeddings": 32768}
    (path / "config.json").write_text(json.dumps(base | config))
    (path / "tokenizer.json").write_text("{}")
    if pooling is not None:
        (path / "1_Pooling").mkdir()
        (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return path


def test_qwen3_embedding_is_causal_with_last_token_pooling(tmp_path: Path) -> None:
    card = read_card(_qwen3_dir(tmp_path, {}, {"pooling_mode_lasttoken": True}))
    assert (card.family, card.causal, card.pooling, card.dims) == ("qwen3", True, "last", 1024)
    assert card.max_input_tokens == 32768


def test_qwen3_without_any_pooling_config_is_causal_last(tmp_path: Path) -> None:
    card = read_card(_qwen3_dir(tmp_path, {}))
    assert (card.causal, card.pooling) == (True, "last")


@pytest.mark.parametrize("flag", [{"is_causal": False}, {"use_bidirectional_attention": True}])
def test_a_config_flag_makes_qwen3_bidirectional_and_mean_pooled(tmp_path, flag) -> None:
    card = read_card(_qwen3_dir(tmp_path, flag))
    assert (card.causal, card.pooling) == (False, "mean")


def test_an_explicit_causal_flag_wins_over_mean_pooling(tmp_path: Path) -> None:
    card = read_card(_qwen3_dir(tmp_path, {"is_causal": True}, {"pooling_mode_mean_tokens": True}))
    assert (card.causal, card.pooling) == (True, "mean")
