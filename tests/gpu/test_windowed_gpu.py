"""The windowed families on CUDA (ModernBERT, Gemma 3 both ways, Gemma 3 with EmbeddingGemma's
head_dim 256, which takes torch varlen): a batch whose every sequence is within the local
layers' window (``mask_free_length``, the bound itself included) runs the mask-free backend
eagerly, then replays the graph captured after it, the window dropped; a batch of the same
bucket holding one sequence a token longer runs with the window as a mask, eagerly, graph or
not: on FlashInfer (FlashInferWindowed), head_dim 256 included since its probe passed on the
H200 (2026-12-03); and batches
far past the window match on FlashInfer what grouped SDPA (``EMBEDMESH_WINDOW_MASK=sdpa``)
gives. All in bf16 against transformers in fp32 (test_families_gpu.py's shapes and
reference): cos >= 0.999 per sequence."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_families_gpu import SHAPE, VOCAB, _gemma3, _modernbert, model_dir, reference
from test_gpu_engine import cosines, pack, random_seqs

from mesh.worker.engine.engine import Engine
from mesh.worker.engine.kernels.attention_grouped import SdpaGrouped
from mesh.worker.engine.kernels.flashinfer_windowed import WINDOW_MASK_ENV, FlashInferWindowed

transformers = pytest.importorskip("transformers")


def _gemma3_config(**kw) -> transformers.Gemma3TextConfig:  # noqa: ANN003
    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=0,
        **(SHAPE | {"num_hidden_layers": 6}),  # five local layers, one global
        **kw,
    )


def _gemma3_causal() -> torch.nn.Module:
    config = _gemma3_config(
        head_dim=64, query_pre_attn_scalar=64, sliding_window=64, use_bidirectional_attention=False
    )
    return transformers.Gemma3TextModel(config)


def _gemma3_head_dim_256() -> torch.nn.Module:
    config = _gemma3_config(
        head_dim=256,
        query_pre_attn_scalar=256,
        sliding_window=128,
        use_bidirectional_attention=True,
    )
    return transformers.Gemma3TextModel(config)


# name -> (builder, pooling, mask_free_length: the longest sequence the windows do not cut,
# whether a batch the window cuts runs on FlashInfer with the window as a mask)
WINDOWED: dict[str, tuple[Callable[[], torch.nn.Module], str, int, bool]] = {
    "modernbert": (_modernbert, "mean", 33, True),  # local_attention 64: 32 either side
    "gemma3": (_gemma3, "mean", 65, True),  # sliding_window 128, bidirectional: 64 either side
    "gemma3-causal": (_gemma3_causal, "last", 64, True),  # the 64 most recent keys
    "gemma3-hd256": (_gemma3_head_dim_256, "mean", 65, True),  # FlashInfer too (probe passed)
}


@pytest.fixture(scope="module", params=list(WINDOWED))
def windowed(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int, bool]:  # noqa: ANN001
    build, pooling, longest, flashinfer = WINDOWED[request.param]
    path = model_dir(build, pooling, tmp_path_factory.mktemp(request.param))
    return path, pooling, longest, flashinfer


def _lengths(longest: int) -> list[int]:
    """A batch the windows do not cut, two sequences at the bound (one token more stays in
    its bucket: asserted where it matters)."""
    return [1, 2, 7, 16, longest, longest - 1, 3, 8, longest // 2, longest]


def _check(ours: torch.Tensor, ref: torch.Tensor, name: str) -> None:
    cos = cosines(ours, ref)
    print(f"{name}: min cosine {cos.min():.6f}")
    assert cos.min() >= 0.999, cos


def test_windowed_batch_within_the_window_replays_a_graph(windowed) -> None:  # noqa: ANN001
    path, pooling, longest, _ = windowed
    engine = Engine.load(path, device="cuda")
    runner = engine.runner
    assert runner.masked and runner.graphs_on and runner.mask_free_length == longest
    assert not isinstance(runner.eager_attn, SdpaGrouped)
    # ids from 3: clear of the pad ids.
    seqs = random_seqs(_lengths(longest), 3, VOCAB, seed=2)
    ids, offsets = pack(seqs)
    runs = {"eager": engine.embed(ids, offsets)}  # the mask-free backend; captures after it
    bucket = runner.bucket_for(int(offsets[-1]), len(seqs))
    assert bucket in runner.graphs, f"capture failed: {runner.failed}"
    runs["graph"] = engine.embed(ids, offsets)
    assert (runner.eager_batches, runner.masked_batches, runner.graph_batches) == (1, 0, 1)
    ref = reference(path, seqs, pooling)
    for name, ours in runs.items():
        _check(ours, ref, f"{path.name} {name}")


def test_windowed_batch_past_the_window_runs_masked_beside_a_graph(windowed) -> None:  # noqa: ANN001
    path, pooling, longest, flashinfer = windowed
    engine = Engine.load(path, device="cuda")
    runner = engine.runner
    covered = random_seqs(_lengths(longest), 3, VOCAB, seed=3)
    ids, offsets = pack(covered)
    engine.embed(ids, offsets)
    bucket = runner.bucket_for(int(offsets[-1]), len(covered))
    assert bucket in runner.graphs, f"capture failed: {runner.failed}"
    # One token past the bound in one sequence: the same bucket, but the window binds.
    lengths = _lengths(longest)
    lengths[4] += 1
    seqs = random_seqs(lengths, 3, VOCAB, seed=4)
    ids, offsets = pack(seqs)
    assert runner.bucket_for(int(offsets[-1]), len(seqs)) == bucket
    runs = {f"masked {i}": engine.embed(ids, offsets) for i in range(2)}
    assert (runner.eager_batches, runner.masked_batches, runner.graph_batches) == (3, 2, 0)
    assert runner.windowed_batches == (2 if flashinfer else 0)
    assert list(runner.graphs) == [bucket]
    ref = reference(path, seqs, pooling)
    for name, ours in runs.items():
        _check(ours, ref, f"{path.name} {name}")


def test_windowed_batches_far_past_the_window_run_flashinfer_as_grouped_sdpa_would(
    windowed,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, pooling, longest, flashinfer = windowed
    engine = Engine.load(path, device="cuda")
    runner = engine.runner
    if not flashinfer:
        assert runner.windowed_attn is None  # a head_dim FlashInferWindowed does not serve
        pytest.skip("this head_dim keeps grouped SDPA")
    assert isinstance(runner.windowed_attn, FlashInferWindowed)
    monkeypatch.setenv(WINDOW_MASK_ENV, "sdpa")
    sdpa = Engine.load(path, device="cuda")
    assert sdpa.runner.windowed_attn is None
    # Two batches (a re-plan), each past the window several times over, with short ones.
    batches = [
        [1, 5, longest - 1, longest, longest + 1, 2 * longest + 3, 4 * longest + 7, 2, 300],
        [3 * longest, 9, longest + 2, 130],
    ]
    for i, lengths in enumerate(batches):
        seqs = random_seqs(lengths, 3, VOCAB, seed=10 + i)
        ids, offsets = pack(seqs)
        ours, grouped = engine.embed(ids, offsets), sdpa.embed(ids, offsets)
        _check(ours, reference(path, seqs, pooling), f"{path.name} FlashInfer windowed {i}")
        _check(ours, grouped, f"{path.name} FlashInfer vs grouped SDPA {i}")
    assert (runner.eager_batches, runner.masked_batches, runner.windowed_batches) == (2, 2, 2)
    assert (sdpa.runner.masked_batches, sdpa.runner.windowed_batches) == (2, 0)
