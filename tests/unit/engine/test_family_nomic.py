"""Our NomicBERT / new GTE encoder (compared with NomicBertModel and GteModel in
``test_families.py``) loads the Hub's remote-code weight layouts (which save_pretrained
writes and transformers converts back on load: nomic-embed-text's Wqkv/fc11/fc12, gte-v1.5's
NewModel), transformers' own (a state dict saved as is) and the Hub's config names (n_embd,
..., model_type "new") to the same vectors; refusals by name. And the fused CUDA path
(Triton kernels in the interpreter) equal to the eager one."""

from __future__ import annotations

import json
from pathlib import Path

import family_table
import pytest
import torch
from engine_helpers import (
    assert_matches_reference,
    cosines,
    pack,
    random_seqs,
    reference_pooled,
    save_model_dir,
)
from safetensors.torch import load_file, save_file

from mesh.worker.engine.card import read_card
from mesh.worker.engine.engine import Engine

transformers = pytest.importorskip("transformers")

VOCAB = 300
LENGTHS = [1, 5, 2, 77, 16, 120, 9]


def _model(kind: str, seed: int, **kw) -> torch.nn.Module:  # noqa: ANN003
    small = family_table.Model(f"{kind}Model", f"{kind}Config", family_table.NOMIC_SMALL, seed)
    return family_table.build(small, **kw)


@pytest.fixture
def nomic() -> torch.nn.Module:
    return family_table.build(family_table.NOMIC)


@pytest.fixture
def gte() -> torch.nn.Module:
    return family_table.build(family_table.GTE)


def test_the_transformers_layout_of_nomic_loads_the_same(nomic, tmp_path: Path) -> None:
    # NomicBert's save_pretrained writes the Hub's remote-code names (transformers converts
    # them back on load); a state dict saved as is has transformers' own.
    path = save_model_dir(nomic, tmp_path / "own", VOCAB, "mean")
    state = {k: v.contiguous() for k, v in nomic.state_dict().items()}
    save_file(state, str(path / "model.safetensors"))
    assert "layers.0.self_attn.q_proj.weight" in load_file(str(path / "model.safetensors"))
    seqs = random_seqs(VOCAB, LENGTHS, seed=86)
    ref = reference_pooled(nomic, seqs, "mean")
    assert_matches_reference(Engine.load(path).embed(*pack(seqs)), ref)


def _edit_config(path: Path, changes: dict, drop: tuple[str, ...] = ()) -> None:
    config = json.loads((path / "config.json").read_text())
    for key in drop:
        config.pop(key, None)
    (path / "config.json").write_text(json.dumps(config | changes))


def test_the_hub_nomic_config_names_read_the_same(nomic, tmp_path: Path) -> None:
    path = save_model_dir(nomic, tmp_path / "hub", VOCAB, "mean")
    assert "encoder.layers.0.attn.Wqkv.weight" in load_file(str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    names = {"n_embd": "hidden_size", "n_head": "num_attention_heads"}
    names |= {"n_layer": "num_hidden_layers", "n_positions": "max_position_embeddings"}
    hub = {theirs: config[ours] for theirs, ours in names.items()}
    hub |= {"rotary_emb_base": 1000.0, "activation_function": "swiglu", "prenorm": False}
    hub |= {"rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False}
    hub |= {"layer_norm_epsilon": 1e-12, "rotary_scaling_factor": None}
    drop = (*names.values(), "rope_parameters", "hidden_act", "layer_norm_eps", "intermediate_size")
    _edit_config(path, hub, drop)
    card = read_card(path)
    assert (card.dims, card.max_input_tokens) == (64, 256)
    seqs = random_seqs(VOCAB, LENGTHS, seed=84)
    ref = reference_pooled(nomic, seqs, "mean")
    assert_matches_reference(Engine.load(path).embed(*pack(seqs)), ref)


def test_the_hub_gte_new_model_layout_loads_the_same(gte, tmp_path: Path) -> None:
    # GteModel's save_pretrained writes the Hub's NewModel names (qkv_proj, up_gate_proj:
    # up then gate); a NewForMaskedLM puts them under "new.".
    path = save_model_dir(gte, tmp_path / "new", VOCAB, "cls")
    weights = load_file(str(path / "model.safetensors"))
    assert "encoder.layer.0.mlp.up_gate_proj.weight" in weights
    save_file({f"new.{k}": v for k, v in weights.items()}, str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    changes = {"model_type": "new", "rope_theta": config["rope_parameters"]["rope_theta"]}
    changes |= {"position_embedding_type": "rope", "layer_norm_type": "layer_norm"}
    _edit_config(path, changes, ("rope_parameters",))
    seqs = random_seqs(VOCAB, LENGTHS, seed=85)
    ref = reference_pooled(gte, seqs, "cls")
    assert_matches_reference(Engine.load(path).embed(*pack(seqs)), ref)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"prenorm": True}, "prenorm: True"),
        ({"scale_attn_weights": False}, "scale_attn_weights: False"),
        ({"causal": True}, "causal: True"),
        ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction 0.5"),
        ({"rotary_emb_interleaved": True}, "rotary_emb_interleaved"),
        ({"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu'"),
        ({"rope_parameters": {"rope_type": "ntk", "rope_theta": 1e4, "factor": 2.0}}, "'ntk'"),
        ({"moe_every_n_layers": 2}, "mixture-of-experts"),
    ],
)
def test_options_we_do_not_run_are_refused_by_name(nomic, tmp_path, changes, named) -> None:
    path = save_model_dir(nomic, tmp_path / "x", VOCAB, "mean", changes)
    with pytest.raises(NotImplementedError, match=named):
        Engine.load(path)


def test_an_ungated_hub_mlp_is_refused_by_name(nomic, tmp_path: Path) -> None:
    changes = {"activation_function": "gelu"}  # the Hub config's name: an ungated MLP
    path = save_model_dir(nomic, tmp_path / "u", VOCAB, "mean")
    _edit_config(path, changes, ("hidden_act",))
    with pytest.raises(NotImplementedError, match="ungated MLP"):
        Engine.load(path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("kind", "act"), [("nomic", "silu"), ("gte", "gelu"), ("gte", "gelu_pytorch_tanh")]
)
def test_the_fused_path_matches_the_eager_one(
    kernels, monkeypatch, tmp_path: Path, kind: str, act: str, dtype: torch.dtype
) -> None:
    # SwiGLU (Nomic) and GeGLU with either GELU (GTE) through the Triton kernels, run by
    # Triton's interpreter on CPU, against the eager path (which equals transformers above).
    model = _model("NomicBert" if kind == "nomic" else "Gte", seed=87, hidden_act=act)
    path = save_model_dir(model, tmp_path / kind, VOCAB, "mean")
    seqs = random_seqs(VOCAB, LENGTHS, seed=88)
    plain = Engine.load(path, dtype=dtype).embed(*pack(seqs))
    engine = Engine.load(path, dtype=dtype)
    assert engine.kernels == "torch"
    assert engine.model.use_kernels("fused") == "fused"  # Engine.load refuses it on CPU
    calls = {name: 0 for name in ("rope_", "add_layer_norm", "glu")}
    for name in calls:
        monkeypatch.setattr(kernels, name, _counted(calls, name, getattr(kernels, name)))
    ours = engine.embed(*pack(seqs))
    layers = len(engine.model.layers)
    typed = engine.model.type0 is not None  # the embedding LayerNorm takes type 0 fused
    assert calls == {"rope_": layers, "add_layer_norm": 2 * layers + typed, "glu": layers}
    if dtype == torch.float32:
        torch.testing.assert_close(ours, plain, rtol=1e-4, atol=1e-4)
    assert cosines(ours, plain).min() >= (0.9999 if dtype == torch.float32 else 0.999)


def _counted(calls: dict[str, int], name: str, real):  # noqa: ANN001, ANN202
    def counted(*args):  # noqa: ANN002, ANN202
        calls[name] += 1
        return real(*args)

    return counted


def test_a_glu_activation_without_a_kernel_runs_in_torch_on_the_fused_path(
    kernels, tmp_path: Path
) -> None:
    model = _model("Gte", seed=89, hidden_act="relu")
    path = save_model_dir(model, tmp_path / "relu", VOCAB, "mean")
    seqs = random_seqs(VOCAB, LENGTHS, seed=90)
    plain = Engine.load(path).embed(*pack(seqs))
    engine = Engine.load(path)
    engine.model.use_kernels("fused")
    assert engine.model.layers[0].glu is None
    torch.testing.assert_close(engine.embed(*pack(seqs)), plain, rtol=1e-4, atol=1e-4)


def test_kernels_answer_fused_only_when_asked_and_torch_for_compile(nomic, tmp_path) -> None:
    path = save_model_dir(nomic, tmp_path / "k", VOCAB, "mean")
    engine = Engine.load(path)
    assert engine.kernels == "torch"  # CPU
    model = engine.model
    assert [model.use_kernels(k) for k in ("fused", "compile", "torch")] == [
        "fused",
        "torch",  # no compiled path: eager, and reported so
        "torch",
    ]
    with pytest.raises(ValueError, match="unknown kernels"):
        model.use_kernels("triton")
