"""The worker's model engine: packed token ids in, every output kind out.

``Engine.run`` is the one entry: an :class:`~.runner.EngineBatch` (what the wire carries:
``int32`` ids of all sequences back to back, ``int32`` offsets, and the batch's skips, pairs,
spans) in, :class:`~.runner.EngineOutputs` (pooled rows, span rows, lexical weights) out, on
the engine's device, from one forward. A runner supplies what differs by device
(:class:`~.cpu.CpuRunner`, :class:`~.gpu.GpuRunner`); the plan -> model -> heads sequence
is :func:`~.runner.eager_forward`. ``finalize`` (or ``embed_final``) turns pooled rows into
the requested dims and number format; ``embed`` and its siblings are ``run`` for scripts.

Throughput on CPU, all-MiniLM-L6-v2 fp32, torch threads 2, 500 corpus texts (every 5th line
of /work/shared/data/corpus.jsonl: 59,187 tokens with [CLS]/[SEP], cut at 256), one process,
passes alternating between the two after a warm-up, best of 3:

- this engine, FCFS batches of at most 8192 tokens (8 batches): 6,100 tokens/s;
- sentence-transformers ``encode(batch_size=32)``, as shipped: 4,100 tokens/s.

Measured on a shared 2-core host (load average 2.3 to 2.7 from other work), so both are
low in absolute terms (the data README saw 4,600 for sentence-transformers on a quiet
host); the ratios held across two such runs. Of the 1.5x, the allocator setting
(:func:`mesh.worker.engine.cpu.keep_freed_memory`, on by default for CPU) is about half:
with it applied to both, sentence-transformers does 5,000 and we 6,100; with it applied to
neither, 4,100 and 5,300. The rest is no padding (sentence-transformers pads each batch of
32 to its longest text after sorting by length) and one fused QKV GEMM instead of three.
The forward is compute-bound: GEMMs are ~70 % of it, attention ~16 %.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mesh.config import MAX_BATCH_TOKENS_CPU, MAX_BATCH_TOKENS_GPU
from mesh.worker.engine.card import ModelCard, read_card, read_config
from mesh.worker.engine.cpu import CpuRunner, keep_freed_memory
from mesh.worker.engine.heads.colbert import load_multivector
from mesh.worker.engine.heads.dense import load_classifier, load_dense
from mesh.worker.engine.heads.late_interaction import key_lengths
from mesh.worker.engine.heads.lexical import LexicalHead, load_lexical_head
from mesh.worker.engine.heads.sparse import load_sparse_head
from mesh.worker.engine.kernels import fused
from mesh.worker.engine.kernels.attention import AttentionBackend, cpu_backend
from mesh.worker.engine.loader import load_model
from mesh.worker.engine.models.base import PackedEncoder
from mesh.worker.engine.models.registry import spec_for_config
from mesh.worker.engine.outputs import finalize
from mesh.worker.engine.runner import (
    EngineBatch,
    EngineOutputs,
    OutputHeads,
    RunnerInput,
    check_spans,
    checked_skip,
    pair_types,
)

if TYPE_CHECKING:
    from mesh.worker.engine.gpu import GpuRunner

# CUDA graphs are captured per token bucket up to this many tokens (gpu.bucket_sizes).
GRAPH_MAX_TOKENS = MAX_BATCH_TOKENS_GPU
# Token budget per batch that a worker advertises in READY. On CPU, past a few thousand
# tokens throughput is flat and only latency grows; on GPU a larger batch fills the device,
# but one over the largest graph bucket runs eagerly (slower on the H200: docs/performance.md), so
# the GPU default is that bucket, and default_max_batch_tokens caps it by the buckets in use.
DEFAULT_MAX_BATCH_TOKENS = {"cpu": MAX_BATCH_TOKENS_CPU, "cuda": GRAPH_MAX_TOKENS}
# How the non-GEMM parts of the forward run; see Engine.load.
KERNELS = ("torch", "compile", "fused")


def default_max_batch_tokens(device_type: str, graph_max_tokens: int = GRAPH_MAX_TOKENS) -> int:
    """The batch budget a worker advertises when not told one: on CUDA never more than the
    largest graph bucket, so that a full batch replays a graph instead of running eagerly."""
    budget = DEFAULT_MAX_BATCH_TOKENS.get(device_type, MAX_BATCH_TOKENS_CPU)
    if device_type != "cuda":
        return budget
    from mesh.worker.engine.gpu import bucket_sizes  # CUDA-only module: imported on demand

    buckets = bucket_sizes(graph_max_tokens)
    return min(budget, buckets[-1]) if buckets else budget


@dataclass
class Engine:
    """A loaded model, ready to run packed batches (:meth:`run`). Not thread-safe: one caller
    at a time (the worker's GPU loop)."""

    card: ModelCard
    model: PackedEncoder
    device: torch.device
    max_batch_tokens: int
    runner: CpuRunner | GpuRunner
    kernels: str = "torch"
    # A cross-encoder's token type 1 as an id shift (BertEncoder.fold_pair_types); 0: none.
    pair_shift: int = 0
    # bge-m3's sparse head (lexical.py): run() gives its weights beside the pooled rows.
    lexical: LexicalHead | None = None
    # Width of the final hidden states: what a span row holds.
    hidden_size: int = 0
    # A multi-vector head (colbert.py): the linear that span rows "multivector" go through.
    multivector: torch.nn.Module | None = None

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        served_name: str | None = None,
        max_batch_tokens: int | None = None,
        threads: int | None = None,
        attention: AttentionBackend | None = None,
        tune_allocator: bool = True,
        graphs: bool = True,
        compile_elementwise: bool | None = None,
        graph_max_tokens: int = GRAPH_MAX_TOKENS,
        kernels: str | None = None,
        exact_gelu: bool = False,
    ) -> Engine:
        """Load ``model_dir`` (Hugging Face layout) onto ``device``.

        ``dtype`` None: fp32 on CPU, bf16 on GPU (``loader.default_dtype``). ``threads``
        sets torch's intra-op threads for the process when given; the default (one per
        core) is right for a worker that owns its host, a smaller value for one that shares
        it. ``attention`` None: the CPU SDPA backend (the FlashInfer backend is passed in by
        the GPU worker). ``tune_allocator``: on CPU, keep freed memory in the heap
        (:func:`mesh.worker.engine.cpu.keep_freed_memory`, process-wide); worth ~30 %.

        On CUDA (see :mod:`mesh.worker.engine.gpu`): FlashInfer fa2 attention, ``graphs``
        (CUDA graphs per token bucket up to ``graph_max_tokens``, captured lazily), and
        ``kernels``, how the per-layer norm/activation/residual parts run:

        - "torch": eager torch, as on CPU (CPU always runs this);
        - "compile": ``torch.compile`` of them (dynamic shapes). Measured on the H200:
          Qwen3-0.6B 0.20 -> 0.39 M tok/s with it, but BERT-base 2.01 -> 1.72 and MiniLM
          6.1 -> 5.0 M tok/s, because inductor's dynamic-shape GELU and LayerNorm kernels
          ran slower than eager's;
        - "fused": Triton kernels (:mod:`mesh.worker.engine.kernels.fused`: residual + norm, q/k
          norm + RoPE, SiLU * up) and, for BERT, bias + GELU in the up projection's
          cuBLASLt epilogue, which is GELU's tanh approximation (within 4.7e-4 of HF's erf
          GELU; ``exact_gelu`` keeps erf, as TEI's tanh GELU is what it replaces). On the
          H200 (docs/performance.md): MiniLM 8.15, BERT-base 2.42, Qwen3-0.6B 0.519 M tok/s alone,
          the best of the three choices for every model; min cosine per sequence against
          fp32 transformers 0.9998-0.9999.
        - None: "fused" when triton imports, else "compile" for Qwen3 and "torch" for BERT.

        BERT, XLM-RoBERTa and MPNet take all three (the BERT layers), the decoders (Qwen3,
        Qwen2, Mistral) too; NomicBERT/GTE takes "torch" and "fused" ("compile" runs eager
        torch); ModernBERT and Gemma 3 run eager torch whatever is asked. ``Engine.kernels``
        says what runs (docs/architecture.md has the table).

        ``compile_elementwise`` is the older spelling: True means "compile", False "torch"
        (launch's ``--no-compile``); it must agree with ``kernels`` when both are given.
        Asking for "fused" on CPU, or without triton, raises ValueError.
        """
        if threads is not None:
            torch.set_num_threads(threads)
        device = torch.device(device)
        if tune_allocator and device.type == "cpu":
            keep_freed_memory()
        card = read_card(model_dir, served_name=served_name)
        kernels = choose_kernels(kernels, compile_elementwise, card.family, device)
        model = load_model(model_dir, card, dtype=dtype, device=device)
        # Every family takes both; one without a compiled or fused path runs eager torch and
        # says so.
        kernels = model.use_kernels(kernels, exact_gelu=exact_gelu)
        output_heads = _load_output_heads(model_dir, card, model, device)
        # A cross-encoder: fold its token type 1 into the word table (after its head loaded).
        pair_shift = model.fold_pair_types() if card.task == "score" else 0
        lexical = None
        if card.lexical:
            lexical = load_lexical_head(model_dir, model.vocab_size, model.hidden, device)
        runner: CpuRunner | GpuRunner
        # A sparse model runs eagerly on CUDA too: sparse.py says why.
        if device.type == "cuda" and attention is None and card.task != "sparse":
            from mesh.worker.engine.gpu import GpuRunner

            runner = GpuRunner(model, card, device, graph_max_tokens, graphs, output_heads)
        else:
            backend = attention or _eager_backend(model, card, device)
            runner = CpuRunner(model, backend, output_heads, card.causal, device)
        return cls(
            card,
            model,
            device,
            max_batch_tokens or default_max_batch_tokens(device.type, graph_max_tokens),
            runner,
            kernels,
            pair_shift,
            lexical,
            model.hidden,
            load_multivector(model_dir, card.multivector, device),
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def has_lexical(self) -> bool:
        return self.lexical is not None

    def warmup(self, buckets: list[int], spans: bool = False) -> None:
        """CUDA: capture the graphs of these token buckets now, with ``spans`` the graphs of
        batches holding spans too (no-op on CPU)."""
        if self.gpu_runner is not None:
            with torch.inference_mode():
                self.gpu_runner.warmup(buckets, spans=spans)

    @property
    def gpu_runner(self) -> GpuRunner | None:
        """The CUDA runner (graphs, staging, its counters); None where batches run on the
        CPU runner (the CPU, or CUDA for a model run eagerly)."""
        return None if isinstance(self.runner, CpuRunner) else self.runner

    def graph_summary(self) -> str | None:
        """The CUDA runner's graph use so far, for the worker's log; None without one."""
        return None if self.gpu_runner is None else self.gpu_runner.summary()

    def live_lane(self, max_tokens: int) -> Engine:
        """A sibling for the worker's live lane (:mod:`mesh.worker.live_lane`): the same
        weights and heads, with per-batch state of its own, so that it can run a small batch
        on another thread (and, on CUDA, another stream) while this engine runs bulk. That
        state is the attention plan and, on CUDA, a whole runner: pinned staging, a FlashInfer
        workspace and graphs of buckets up to ``max_tokens`` in a memory pool of their own
        (captured by :meth:`warmup`, never lazily: a capture would stall its thread), on a
        capture stream of its own, so that its graphs' cuBLAS workspace is not the bulk's:
        with one, the two streams' GEMMs deadlocked the H200 (``GpuRunner.capture_stream``)."""
        if isinstance(self.runner, CpuRunner):
            attention = _eager_backend(self.model, self.card, self.device)
            return replace(self, runner=replace(self.runner, attention=attention))
        from mesh.worker.engine.gpu import GpuRunner

        bulk = self.runner
        runner = GpuRunner(
            self.model, self.card, self.device, max_tokens, bulk.graphs_on, bulk.output_heads
        )
        runner.lazy_capture = False
        # torch hands streams out of a pool of 32 in turn: should the lane's capture stream
        # come round to the bulk runner's, their graphs would share one cuBLAS workspace.
        for _ in range(32):
            if runner.capture_stream is None or runner.capture_stream != bulk.capture_stream:
                break
            runner.capture_stream = torch.cuda.Stream(self.device)
        return replace(self, runner=runner)

    def run(self, batch: EngineBatch) -> EngineOutputs:
        """The forward of one packed batch: every output kind the model has, from one pass
        (see :class:`EngineBatch` and :class:`EngineOutputs`).

        The batch comes validated by the broker (ids inside the vocabulary, sequences
        non-empty and within ``card.max_input_tokens``, offsets rising from 0 to the ids'
        length): the worker trusts it. What only this model can judge is checked here, with
        ValueError: ``skip`` must leave a token of each sequence, ``pairs`` only for a
        cross-encoder (``card.task == "score"``), with each split inside its sequence (type 1
        then travels as the ids shifted by ``pair_shift``, so pairs run the same forward and
        replay the same graphs), spans non-empty and inside one sequence each, ``lexical``
        only for a model that has the weights. A batch over ``max_batch_tokens`` is accepted
        (the budget is what we advertise, not a hard cap).
        """
        ids, offsets = batch.ids, batch.offsets
        assert offsets[0] == 0 and offsets[-1] == ids.shape[0], "a batch the broker let by"
        lengths = np.diff(offsets.astype(np.int64))
        skip = checked_skip(batch.skip, lengths)
        types = None
        if batch.pairs is not None:
            if self.card.task != "score":
                raise ValueError(f"model {self.card.name!r} embeds texts; it takes no pairs")
            types = pair_types(batch.pairs, offsets, lengths)
        if types is not None and self.pair_shift:
            ids = ids.astype(np.int64) + self.pair_shift * types
        if batch.spans is not None:
            check_spans(batch.spans, offsets, lengths)
        if batch.lexical and self.lexical is None:
            raise ValueError(f"model {self.card.name!r} has no lexical weights")
        if lengths.shape[0] == 0:
            return self._empty(batch)
        colbert = self.card.colbert
        keys = None  # a ColBERT query's expansion: tokens no one attends to
        if colbert is not None and colbert.mask_expansion:
            keys = key_lengths(ids, offsets, colbert.tokens)
        job = RunnerInput(ids, offsets, skip, batch.spans, keys, keep_hidden=batch.lexical)
        with torch.inference_mode():
            out = self.runner.forward(job)
            weights = None
            if batch.lexical:
                assert self.lexical is not None and out.hidden is not None
                ids_t = torch.from_numpy(np.ascontiguousarray(batch.ids, dtype=np.int64))
                cu = torch.from_numpy(np.ascontiguousarray(offsets, dtype=np.int32))
                weights = self.lexical(out.hidden, ids_t.to(self.device), cu.to(self.device))
        return EngineOutputs(out.pooled, out.span_rows, weights)

    def _empty(self, batch: EngineBatch) -> EngineOutputs:
        def zeros(width: int) -> torch.Tensor:
            return torch.zeros(0, width, dtype=torch.float32, device=self.device)

        return EngineOutputs(
            zeros(self.card.dims),
            None if batch.spans is None else zeros(self.hidden_size),
            None if not batch.lexical or self.lexical is None else zeros(self.lexical.vocab),
        )

    def embed(
        self,
        ids: np.ndarray,
        offsets: np.ndarray,
        skip: np.ndarray | None = None,
        pairs: np.ndarray | None = None,
    ) -> torch.Tensor:
        """:meth:`run`'s pooled rows alone, ``float32 [n, D]`` (for scripts and tests)."""
        return self.run(EngineBatch(ids, offsets, skip, pairs)).pooled

    def embed_with_spans(
        self,
        ids: np.ndarray,
        offsets: np.ndarray,
        spans: np.ndarray,
        skip: np.ndarray | None = None,
        pairs: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`run`'s pooled rows and span rows ``float32 [S, H]``."""
        out = self.run(EngineBatch(ids, offsets, skip, pairs, spans))
        assert out.span_rows is not None
        return out.pooled, out.span_rows

    def embed_lexical(
        self, ids: np.ndarray, offsets: np.ndarray, skip: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`run`'s pooled rows and bge-m3's lexical weights ``float32 [n, vocab]``
        (ValueError for a model without them). On CUDA such a batch runs eagerly: the graphs
        keep no hidden states."""
        out = self.run(EngineBatch(ids, offsets, skip, lexical=True))
        assert out.lexical is not None
        return out.pooled, out.lexical

    def project_multivector(self, rows: torch.Tensor) -> torch.Tensor:
        """``float32 [S, H]`` span rows (one token's final hidden state each) through the
        model's multi-vector head, in fp32 on the device: ``float32 [S, multivector dims]``,
        not normalized (the output's ``normalize`` does it). ValueError without a head."""
        if self.multivector is None:
            raise ValueError(f"model {self.card.name!r} has no multi-vector head")
        with torch.inference_mode():
            return self.multivector(rows.float())

    def embed_final(
        self,
        ids: np.ndarray,
        offsets: np.ndarray,
        dims: int | None = None,
        normalize: bool | None = None,
        kind: str = "float32",
        skip: np.ndarray | None = None,
        top_k: int = 0,
        threshold: float = 0.0,
    ) -> np.ndarray:
        """``embed`` then ``finalize``; ``normalize`` None follows the card; ``top_k`` and
        ``threshold`` for the kind "sparse" of a sparse model."""
        pooled = self.embed(ids, offsets, skip)
        normalize = self.card.normalize if normalize is None else normalize
        with torch.inference_mode():
            return finalize(pooled, dims, normalize, kind, top_k, threshold)


def _load_output_heads(
    model_dir: str | Path, card: ModelCard, model: PackedEncoder, device: torch.device
) -> OutputHeads:
    """What leaves the model: its pooling, its Dense layers (a cross-encoder's classifier,
    from the checkpoint itself) or its SPLADE head."""
    if card.task == "sparse":
        return OutputHeads(card.pooling, sparse=load_sparse_head(model_dir, card, model, device))
    if card.task == "score":
        prefixes = spec_for_config(read_config(model_dir)).prefixes
        return OutputHeads(card.pooling, load_classifier(model_dir, card.dense, prefixes, device))
    return OutputHeads(card.pooling, load_dense(model_dir, card.dense, device))


def _eager_backend(model: PackedEncoder, card: ModelCard, device: torch.device) -> AttentionBackend:
    """The attention of a model run eagerly: SDPA on CPU, FlashInfer (or varlen) on CUDA."""
    if device.type != "cuda":
        return cpu_backend()
    from mesh.worker.engine.kernels.flashinfer_attention import cuda_backend

    return cuda_backend(model.heads, model.dtype, device, card.max_input_tokens)


def choose_kernels(
    kernels: str | None, compile_elementwise: bool | None, family: str, device: torch.device
) -> str:
    """Resolve ``Engine.load``'s ``kernels`` and ``compile_elementwise`` (see there)."""
    if compile_elementwise is not None:
        alias = "compile" if compile_elementwise else "torch"
        if kernels is not None and kernels != alias:
            raise ValueError(f"kernels={kernels!r} contradicts {compile_elementwise=}")
        kernels = alias
    if kernels is not None and kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}, not {kernels!r}")
    if device.type != "cuda":
        if kernels == "fused":
            raise ValueError("kernels='fused' needs CUDA (Triton kernels, cuBLASLt GELU)")
        return "torch"
    if kernels is None:
        if fused.available():
            return "fused"
        return "compile" if family == "qwen3" else "torch"
    if kernels == "fused" and not fused.available():
        raise ValueError("kernels='fused' needs triton (pip install 'embedmesh[triton]')")
    return kernels
