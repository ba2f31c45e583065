"""CUDA attention backend: FlashInfer's ragged prefill (backend fa2) over packed batches.

One ``BatchPrefillWithRaggedKVCacheWrapper`` per shape of work: an eager one that takes any
number of sequences, and one per CUDA-graph bucket made with ``use_cuda_graph=True`` (a fixed
sequence count, the batch padded with empty sequences) so that its kernels can be captured
once and re-planned with new lengths between replays. ``plan`` takes ``cu_seqlens`` on the
host: FlashInfer needs the offsets on the CPU to build its work list, and a host tensor
spares it a device-to-host sync.

fa2, not fa3: on the H200 fa3 was slower on these shapes (109 vs 129-137 TFLOP/s) and its
``plan`` 6-7x costlier (measured on the H200). This module imports flashinfer lazily,
so the CPU path never needs it.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from mesh.env_knobs import switch_from_env
from mesh.worker.engine.kernels.attention import AttentionBackend

# FlashInfer's recommended float workspace (split-k partial results); one per wrapper.
WORKSPACE_BYTES = 128 * 1024 * 1024
# Head dims FlashInfer 0.7.2 fa2 ragged prefill was checked on (H200, bf16, rel. error ~2e-3
# vs float64). head_dim 32 (all-MiniLM-L6-v2) compiles but every run fails with "Invalid
# configuration: NUM_MMA_D_QK=2 ..." (its fa2 tiling has no head_dim-32 config), so those
# models take torch's packed varlen flash attention, the next best path measured.
FLASHINFER_HEAD_DIMS = (64, 128)


def pdl_from_env() -> bool | None:
    """``EMBEDMESH_FLASHINFER_PDL``: 0 launches FlashInfer's kernels without programmatic
    dependent launch (PDL, on by default on sm90), 1 with it; unset: FlashInfer's default.
    A diagnostic: it was the first suspect of the live lane's stall, and turning it off did
    not stop the stall (CHANGELOG.md: the live lane's stall, one cuBLAS workspace)."""
    return switch_from_env("EMBEDMESH_FLASHINFER_PDL")


def cuda_backend(
    heads: tuple[int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    max_len: int,
    capacity: tuple[int, int] | None = None,
    workspace: torch.Tensor | None = None,
) -> FlashInferRagged | TorchVarlen:
    """The attention backend for a model's head shape on CUDA; see FLASHINFER_HEAD_DIMS."""
    if heads[2] in FLASHINFER_HEAD_DIMS:
        return FlashInferRagged(heads, dtype, device, capacity, workspace)
    return TorchVarlen(heads, device, max_len, capacity)


def kept_keys(
    cu: torch.Tensor, keys: np.ndarray, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``plan(..., keys=)`` (eager only): the keys' own ``cu_seqlens`` (int32, host;
    pinned for CUDA, as ``plan`` copies it to the device) and
    the packed rows they are (int64, on ``device``), gathered from k and v in each layer:
    both kernels read a sequence's keys as one contiguous range, so the left-out trailing
    tokens are dropped from the key rows rather than skipped in place."""
    starts = cu[:-1].numpy().astype(np.int64)
    keys = np.asarray(keys, dtype=np.int64)
    kv_cu = np.zeros(len(keys) + 1, dtype=np.int32)
    np.cumsum(keys, out=kv_cu[1:])
    rows = np.repeat(starts - kv_cu[:-1], keys) + np.arange(int(kv_cu[-1]))
    offsets = torch.from_numpy(kv_cu)
    if device.type == "cuda":
        offsets = offsets.pin_memory()
    return offsets, to_device(torch.from_numpy(rows), device)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device`` without stalling the stream: on CUDA through pinned memory
    (torch's caching host allocator, which keeps the block until the copy ran), because a
    copy from pageable memory first waits for everything queued on the stream, the batch
    before this one included, and so breaks the worker's two-deep pipeline."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class FlashInferRagged(AttentionBackend):
    """``AttentionBackend`` over FlashInfer fa2 ragged prefill.

    ``heads``: (query heads, key/value heads, head_dim) of the model. ``capacity``: None for
    an eager wrapper; for a CUDA-graph wrapper, ``(sequences, rows)``: every batch is padded
    to exactly ``rows`` tokens (the padding tokens form one extra sequence, because FlashInfer
    wants ``q.shape[0] == cu_seqlens[-1]``) and to ``sequences + 1`` sequences with empty
    ones, which add no work to the kernel.
    """

    def __init__(
        self,
        heads: tuple[int, int, int],
        dtype: torch.dtype,
        device: torch.device,
        capacity: tuple[int, int] | None = None,
        workspace: torch.Tensor | None = None,
    ) -> None:
        import flashinfer

        self.num_heads, self.num_kv_heads, self.head_dim = heads
        self.dtype = dtype
        self.capacity = capacity
        self.workspace = (
            workspace
            if workspace is not None
            else torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        )
        kwargs = {}
        if capacity is not None:
            slots = capacity[0] + 2
            kwargs = dict(
                use_cuda_graph=True,
                qo_indptr_buf=torch.empty(slots, dtype=torch.int32, device=device),
                kv_indptr_buf=torch.empty(slots, dtype=torch.int32, device=device),
            )
        self.wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2", **kwargs
        )
        self._cu_host = torch.empty(
            (capacity[0] + 2) if capacity else 0, dtype=torch.int32, pin_memory=True
        )
        # plan() stages its work list in one pinned host buffer and copies it without a
        # sync: the next plan must wait until the device has taken the last one.
        self._planned: torch.cuda.Event | None = None
        self._key_rows: torch.Tensor | None = None  # plan(keys=): the rows that are keys
        self._pdl = pdl_from_env()  # None: FlashInfer's default (on for sm90)

    takes_keys = True
    takes_bias = False
    # A window only where gpu.GpuRunner sets windows_covered: it plans a windowed model's
    # backends only with batches no window cuts, so run() drops the window (attention.py).
    takes_window = False

    def plan(
        self,
        cu_seqlens: torch.Tensor,
        causal: bool,
        scale: float | None = None,
        *,
        keys: np.ndarray | None = None,
    ) -> None:
        cu = cu_seqlens.to("cpu", torch.int32)
        if self._planned is not None:
            self._planned.synchronize()
        kv_cu, self._key_rows = cu, None
        if keys is not None:
            if self.capacity is not None:
                raise ValueError("keys= is for the eager wrapper (a graph's keys are its rows)")
            kv_cu, self._key_rows = kept_keys(cu, keys, self.workspace.device)
        if self.capacity is not None:
            sequences, rows = self.capacity
            n = cu.numel() - 1
            if n > sequences or int(cu[-1]) > rows:
                raise ValueError(f"batch over this wrapper's capacity {self.capacity}")
            # Padded into a pinned buffer (free again: the event above): plan() copies it
            # to the graph's device buffer, and a copy from pageable memory may wait for
            # the stream to drain, which would stall the worker's two-deep pipeline.
            self._cu_host[: n + 1] = cu
            self._cu_host[n + 1 :] = rows
            cu = kv_cu = self._cu_host
        self.wrapper.plan(
            cu,
            kv_cu,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            causal=causal,
            sm_scale=scale,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            # Graph wrappers must keep their work partition fixed across re-plans.
            disable_split_kv=self.capacity is not None,
        )
        self._planned = torch.cuda.Event()
        self._planned.record()

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        if bias is not None or window is not None:
            self.masks(bias, window)  # a covered window is dropped; the rest refused
        if self._key_rows is not None:
            k, v = k.index_select(0, self._key_rows), v.index_select(0, self._key_rows)
        if self._pdl is None:  # FlashInfer's default; run() takes enable_pdl from 0.2.7 on
            return self.wrapper.run(q, k, v)
        return self.wrapper.run(q, k, v, enable_pdl=self._pdl)


class TorchVarlen(AttentionBackend):
    """``AttentionBackend`` over ``torch.nn.attention.varlen.varlen_attn`` (packed flash
    attention), for head dims FlashInfer does not take.

    ``capacity`` as for :class:`FlashInferRagged`, but the batch is padded with empty
    sequences only (varlen does not need ``cu_seqlens[-1]`` to cover every row) and the
    longest length is fixed at ``max_len``, because a captured kernel keeps its grid.
    """

    def __init__(
        self,
        heads: tuple[int, int, int],
        device: torch.device,
        max_len: int,
        capacity: tuple[int, int] | None = None,
    ) -> None:
        from torch.nn.attention.varlen import varlen_attn

        self.num_heads, self.num_kv_heads, self.head_dim = heads
        self.device = device
        self.capacity = capacity
        self.max_len = max_len
        self._attn = varlen_attn
        self._params = set(inspect.signature(varlen_attn).parameters)
        self._cu = (
            torch.zeros(capacity[0] + 1, dtype=torch.int32, device=device) if capacity else None
        )
        self._max = max_len
        self._kw: dict = {}
        self._cu_host = torch.empty(
            (capacity[0] + 1) if capacity else 0, dtype=torch.int32, pin_memory=True
        )
        self._copied = torch.cuda.Event()
        self._copied.record()
        self._cu_k: torch.Tensor | None = None  # plan(keys=): the keys' own offsets
        self._max_k = max_len
        self._key_rows: torch.Tensor | None = None

    takes_keys = True
    takes_bias = False
    takes_window = False  # as FlashInferRagged's

    def plan(
        self,
        cu_seqlens: torch.Tensor,
        causal: bool,
        scale: float | None = None,
        *,
        keys: np.ndarray | None = None,
    ) -> None:
        cu = cu_seqlens.to("cpu", torch.int32)
        n = cu.numel() - 1
        self._cu_k, self._key_rows = None, None
        if keys is not None:
            if self.capacity is not None:
                raise ValueError("keys= is for the eager backend (a graph's keys are its rows)")
            kv_cu, self._key_rows = kept_keys(cu, keys, self.device)
            self._cu_k = to_device(kv_cu, self.device)
            self._max_k = int(np.max(keys)) if n else 1
        if self.capacity is not None:
            sequences, rows = self.capacity
            if n > sequences or int(cu[-1]) > rows:
                raise ValueError(f"batch over this backend's capacity {self.capacity}")
            # Through a pinned buffer, free once the last copy out of it ran (the event):
            # a copy from pageable memory may wait for the stream to drain.
            self._copied.synchronize()
            self._cu_host[: n + 1] = cu
            self._cu_host[n + 1 :] = cu[-1]
            assert self._cu is not None  # allocated with the capacity
            self._cu.copy_(self._cu_host, non_blocking=True)
            self._copied.record()
        else:
            self._cu = cu.to(self.device, non_blocking=True)  # cu is pinned staging (gpu.py)
            self._max = int((cu[1:] - cu[:-1]).max()) if n else 1
        self._kw = {"scale": scale}
        if causal:
            # torch 2.10 spells it is_causal; later versions take a window.
            if "is_causal" in self._params:
                self._kw["is_causal"] = True
            else:
                self._kw["window_size"] = (-1, 0)

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        if bias is not None or window is not None:
            self.masks(bias, window)  # a covered window is dropped; the rest refused
        if k.shape[1] != q.shape[1]:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        if self._key_rows is not None:
            k, v = k.index_select(0, self._key_rows), v.index_select(0, self._key_rows)
            return self._attn(q, k, v, self._cu, self._cu_k, self._max, self._max_k, **self._kw)
        return self._attn(q, k, v, self._cu, self._cu, self._max, self._max, **self._kw)
