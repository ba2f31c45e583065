"""The CPU runner, and process-level tuning for CPU inference.

:class:`CpuRunner` runs every batch eagerly on the engine's device: the CPU, and CUDA for a
model no graph serves (SPLADE: ``sparse.py`` says why), with that device's eager attention.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from dataclasses import dataclass

import numpy as np
import torch

from mesh.worker.engine.heads.pooling import positions
from mesh.worker.engine.kernels.attention import AttentionBackend
from mesh.worker.engine.models.base import PackedEncoder
from mesh.worker.engine.runner import (
    DeviceBatch,
    OutputHeads,
    RunnerInput,
    RunnerOutput,
    eager_forward,
)

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_KEEP_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Make glibc malloc keep freed memory for reuse instead of returning it to the OS.

    By default glibc serves every allocation over a few MiB with a fresh ``mmap`` and
    ``munmap``s it on free, so each activation tensor of every layer page-faults its pages
    in again. On 2 cores with all-MiniLM-L6-v2 and 8192-token batches this made elementwise
    ops 5 to 7 times slower than their arithmetic (GELU over [8192, 1536]: 65 ms instead of
    9.5 ms) and cost ~30 % of the whole forward. Raising the mmap and trim thresholds to
    1 GiB keeps those blocks in the heap; the price is that the process holds on to its peak
    activation memory, which is what a worker that runs the same batch sizes all day wants.

    Returns False (and changes nothing) where the C library is not glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES) == 1
    ok_trim = mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES) == 1
    return ok_mmap and ok_trim


@dataclass
class CpuRunner:
    """Eager forward of packed batches (see the module docstring)."""

    model: PackedEncoder
    attention: AttentionBackend
    output_heads: OutputHeads
    causal: bool
    device: torch.device

    def forward(self, batch: RunnerInput) -> RunnerOutput:
        ids = torch.from_numpy(np.ascontiguousarray(batch.ids, dtype=np.int64)).to(self.device)
        cu = torch.from_numpy(np.ascontiguousarray(batch.offsets, dtype=np.int32)).to(self.device)
        on_device = DeviceBatch(ids, positions(cu, ids.shape[0]), cu, cu)
        return eager_forward(
            self.model, self.attention, self.output_heads, self.causal, on_device, batch
        )
