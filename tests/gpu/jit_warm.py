"""Compile (JIT) and check FlashInfer's fa2 ragged prefill for one head_dim, bf16.

Run one process per head_dim in parallel before the tests: ``python3 jit_warm.py 32``.
Prints the relative error against a float64 reference, causal and not, GQA for 128.
"""

from __future__ import annotations

import sys
import time

import torch

from mesh.worker.engine.kernels.flashinfer_attention import cuda_backend


def reference(q, k, v, cu, causal):  # noqa: ANN001, ANN201
    out = torch.empty_like(q, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for i in range(len(cu) - 1):
        s, e = cu[i], cu[i + 1]
        qs = q[s:e].double().transpose(0, 1)
        ks = k[s:e].double().repeat_interleave(group, 1).transpose(0, 1)
        vs = v[s:e].double().repeat_interleave(group, 1).transpose(0, 1)
        att = qs @ ks.transpose(1, 2) * q.shape[-1] ** -0.5
        if causal:
            att = att.masked_fill(torch.ones(e - s, e - s, device=q.device).triu(1).bool(), -1e30)
        out[s:e] = (att.softmax(-1) @ vs).transpose(0, 1)
    return out


def main() -> None:
    d = int(sys.argv[1])
    hq, hkv = (16, 8) if d == 128 else (12, 12)
    t = time.perf_counter()
    attn = cuda_backend((hq, hkv, d), torch.bfloat16, torch.device("cuda"), max_len=512)
    lens = [1, 7, 64, 300, 512, 33]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    total = cu[-1]
    q = torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, hkv, d, device="cuda", dtype=torch.bfloat16)
    for causal in (False, True):
        attn.plan(torch.tensor(cu, dtype=torch.int32), causal)
        out = attn.run(q, k, v).double()
        ref = reference(q, k, v, cu, causal)
        err = ((out - ref).norm() / ref.norm()).item()
        print(
            f"{type(attn).__name__} head_dim {d} causal={causal}: rel err {err:.2e}, {time.perf_counter() - t:.1f} s"
        )
        assert err < 1e-2 and torch.isfinite(out).all()


if __name__ == "__main__":
    main()
