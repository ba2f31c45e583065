"""Every family beyond BERT and Qwen3 on CUDA in bf16 against transformers in fp32 on the GPU
(random weights from transformers' own init, in shapes with head_dim 64 so the FlashInfer
families take FlashInfer), with the default kernels (fused where the family has them, which
the engine must report): cos >= 0.999 per sequence. The FlashInfer families run a batch
eagerly, then again through the graph captured after it; the families that need an
attention bias or window (MPNet, ModernBERT, Gemma 3) run this batch (sequences longer than
the windows) eagerly, no graph captured: MPNet on grouped SDPA, the windowed ones on
FlashInfer with the window as a mask. A windowed family's batch within its window takes the
graphs: test_windowed_gpu.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from test_gpu_engine import cosines, pack, random_seqs

from bench.shapes import _finish
from mesh.worker.engine.engine import Engine
from mesh.worker.engine.kernels import fused

transformers = pytest.importorskip("transformers")

VOCAB = 4000
LENGTHS = [1, 2, 7, 16, 33, 64, 130, 257, 3, 100, 8, 300]
SHAPE = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024)


def _xlm_roberta() -> torch.nn.Module:
    config = transformers.XLMRobertaConfig(
        vocab_size=VOCAB, max_position_embeddings=514, type_vocab_size=1, **SHAPE
    )
    return transformers.XLMRobertaModel(config)


def _mpnet() -> torch.nn.Module:
    return transformers.MPNetModel(
        transformers.MPNetConfig(vocab_size=VOCAB, max_position_embeddings=514, **SHAPE)
    )


def _modernbert() -> torch.nn.Module:
    config = transformers.ModernBertConfig(
        vocab_size=VOCAB,
        max_position_embeddings=1024,
        local_attention=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        **SHAPE,
    )
    return transformers.ModernBertModel(config)


def _nomic() -> torch.nn.Module:
    return transformers.NomicBertModel(
        transformers.NomicBertConfig(vocab_size=VOCAB, max_position_embeddings=1024, **SHAPE)
    )


def needs_gte_model() -> None:
    """Skip where transformers has no ``GteModel`` (the H200's 5.17 has none; it both writes
    the checkpoint and is the reference). The CPU tests check GTE against transformers 5.24,
    and GTE's fused path is the nomic one with the GELU ``glu`` kernel, both checked here."""
    if not hasattr(transformers, "GteModel"):
        pytest.skip(f"transformers {transformers.__version__} has no GteModel")


def _gte() -> torch.nn.Module:
    # The new GTE: the nomic family with GeGLU (erf GELU) and q/k/v/o and down biases.
    return transformers.GteModel(
        transformers.GteConfig(
            vocab_size=VOCAB, max_position_embeddings=1024, hidden_act="gelu", **SHAPE
        )
    )


def _decoder(kind: str, **kw) -> Callable[[], torch.nn.Module]:  # noqa: ANN003
    def build() -> torch.nn.Module:
        config = getattr(transformers, f"{kind}Config")(
            vocab_size=VOCAB, num_key_value_heads=2, max_position_embeddings=1024, **SHAPE, **kw
        )
        return getattr(transformers, f"{kind}Model")(config)

    return build


def _gemma3() -> torch.nn.Module:
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        num_key_value_heads=2,
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=128,
        use_bidirectional_attention=True,  # EmbeddingGemma
        max_position_embeddings=1024,
        pad_token_id=0,
        **(SHAPE | {"num_hidden_layers": 6}),  # five local layers, one global
    )
    return transformers.Gemma3TextModel(config)


# family -> (builder, pooling, whether LENGTHS' batch replays a graph)
FAMILIES: dict[str, tuple[Callable[[], torch.nn.Module], str, bool]] = {
    "xlm-roberta": (_xlm_roberta, "mean", True),
    "mpnet": (_mpnet, "mean", False),
    "modernbert": (_modernbert, "mean", False),
    "nomic": (_nomic, "mean", True),
    "gte": (_gte, "mean", True),
    "qwen2": (_decoder("Qwen2"), "last", True),
    "mistral": (_decoder("Mistral", sliding_window=512), "last", True),
    "gemma3": (_gemma3, "mean", False),
}


# Test name -> the card's family where they differ.
CARD_FAMILY = {"gte": "nomic"}
# Families with no fused path: they run eager torch whatever is asked, and say so.
EAGER_ONLY = {"modernbert", "gemma3"}


def family_dir(family: str, path: Path, device: str = "cuda") -> Path:
    build, pooling, _ = FAMILIES[family]
    return model_dir(build, pooling, path, device)


def model_dir(
    build: Callable[[], torch.nn.Module], pooling: str, path: Path, device: str = "cuda"
) -> Path:
    torch.manual_seed(0)
    with torch.device(device):
        model = build().eval()
    flag = {"mean": "mean_tokens", "last": "lasttoken"}[pooling]
    return _finish(model, path, flag, SHAPE["hidden_size"], {})


def reference(model_dir: Path, seqs: list[np.ndarray], pooling: str, device: str = "cuda"):  # noqa: ANN201
    """transformers in fp32, one sequence at a time (no padding to mask)."""
    model = transformers.AutoModel.from_pretrained(
        model_dir, torch_dtype=torch.float32, attn_implementation="eager"
    )
    model = model.to(device).eval()
    out = []
    with torch.inference_mode():
        for s in seqs:
            ids = torch.as_tensor(s, dtype=torch.long, device=device)[None]
            hidden = model(input_ids=ids).last_hidden_state[0].float()
            out.append(hidden[-1] if pooling == "last" else hidden.mean(0))
    return torch.stack(out)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_in_bf16_matches_transformers(family: str, tmp_path: Path) -> None:
    _, pooling, graphs = FAMILIES[family]
    if family == "gte":
        needs_gte_model()
    path = family_dir(family, tmp_path / family)
    engine = Engine.load(path, device="cuda")
    assert engine.card.family == CARD_FAMILY.get(family, family)
    assert engine.dtype == torch.bfloat16
    fused_ran = fused.available() and family not in EAGER_ONLY
    assert engine.kernels == ("fused" if fused_ran else "torch")  # the default on CUDA
    # A windowed family has graphs for the batches its windows do not cut, not this one.
    assert engine.runner.graphs_on == (graphs or engine.runner.mask_free_length is not None)
    # ids from 3: clear of the pad ids the position tables start after.
    seqs = random_seqs(LENGTHS, 3, VOCAB, seed=1)
    ids, offsets = pack(seqs)
    runs = {"eager": engine.embed(ids, offsets)}
    if graphs:
        bucket = engine.runner.bucket_for(int(offsets[-1]), len(seqs))
        assert bucket in engine.runner.graphs, f"capture failed: {engine.runner.failed}"
        runs["graph"] = engine.embed(ids, offsets)
    else:
        assert not engine.runner.graphs and engine.runner.masked_batches == 1
        # FlashInfer with the window as a mask; MPNet's bias stays on grouped SDPA.
        assert engine.runner.windowed_batches == (family in ("modernbert", "gemma3"))
    ref = reference(path, seqs, pooling)
    for name, ours in runs.items():
        cos = cosines(ours, ref)
        print(f"{family} ({engine.kernels}) {name}: min cosine {cos.min():.6f}")
        assert cos.min() >= 0.999, cos
