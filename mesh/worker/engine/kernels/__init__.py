"""Attention over packed batches and the fused non-GEMM kernels: the backend seam and its
CPU backends (:mod:`.attention`, :mod:`.attention_grouped`), FlashInfer on CUDA
(:mod:`.flashinfer_attention`, :mod:`.flashinfer_windowed`), Triton kernels (:mod:`.fused`).
Nothing here imports flashinfer or triton until a CUDA backend or kernel is built."""
