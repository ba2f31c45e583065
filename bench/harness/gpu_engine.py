"""``mesh-bench gpu-engine``: the engine on one GPU; one run measures, for each model,

1. sentence-transformers ``encode`` (bf16) at its best batch size: the baseline;
2. our engine alone on pre-tokenized FCFS batches of at most 16384 tokens (arrival order);
3. the same texts through a broker and a worker process, driven by ``MeshClient``;

plus the bf16 peak (an 8192^3 matmul), the share of it each path reaches, batch-1 latency of a
16-token query through a captured graph, and a kernel profile of one 16k-token batch.

Workload: 20,000 texts, 40 % of lengths uniform in 8..32 tokens and 60 % in 64..512
(special tokens included), shuffled, numpy seed ``SEED``. Texts are words of the MiniLM
vocabulary that tokenize to one token each, so every path sees the same token ids. The
random-weight shapes (BERT-base, Qwen3-0.6B) are transformers models built from a config
(``bench/shapes.py``) with MiniLM's tokenizer files beside them, so that
sentence-transformers can load each directory as it would a downloaded model.

    mesh-bench gpu-engine --out OUT [--minilm DIR] [--models minilm,bert-base,qwen3-0.6b]
    mesh-bench gpu-engine --out OUT --quick      # a smoke run: 1,000 texts, MiniLM

``--minilm``: the all-MiniLM-L6-v2 directory (default: the embedded model); set its
``sentence_bert_config.json`` ``max_seq_length`` to 512, as the workload goes to 512 tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mesh.worker.engine.card import default_model_path
from mesh.worker.engine.engine import Engine

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261202
MINILM_DIR = default_model_path()  # --minilm replaces it
BUDGET = 16384
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def workload(n: int, seed: int = SEED) -> np.ndarray:
    """Lengths (tokens incl. [CLS]/[SEP]) of ``n`` texts in arrival order."""
    rng = np.random.default_rng(seed)
    short = rng.integers(8, 33, size=int(n * 0.4))
    long = rng.integers(64, 513, size=n - short.size)
    lengths = np.concatenate([short, long])
    rng.shuffle(lengths)
    return lengths


def one_token_words() -> list[tuple[str, int]]:
    vocab = (MINILM_DIR / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return [(w, i) for i, w in enumerate(vocab) if i >= 2000 and w.isalpha() and w.isascii()]


def make_texts(lengths: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    words = one_token_words()
    rng = np.random.default_rng(SEED + 1)
    texts, ids = [], []
    for n in lengths:
        pick = rng.integers(0, len(words), size=int(n) - 2)
        texts.append(" ".join(words[j][0] for j in pick))
        ids.append(np.array([101, *(words[j][1] for j in pick), 102], dtype=np.int32))
    return texts, ids


def fcfs_batches(ids: list[np.ndarray], budget: int) -> list[tuple[np.ndarray, np.ndarray]]:
    batches, cur = [], []
    for seq in ids:
        if cur and sum(len(s) for s in cur) + len(seq) > budget:
            batches.append(_pack(cur))
            cur = []
        cur.append(seq)
    if cur:
        batches.append(_pack(cur))
    return batches


def _pack(seqs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    return np.concatenate(seqs), offsets


def time_cuda(fn, reps: int) -> float:
    """Median seconds of ``fn`` with CUDA events."""
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000)
    return float(np.median(times))


def peak_tflops() -> float:
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        x @ y
    return 2 * 8192**3 / time_cuda(lambda: x @ y, 30) / 1e12


def model_flops(config: dict, lengths: np.ndarray, causal: bool) -> float:
    """Forward FLOPs: 2 per weight per token for the projections, 4*L^2*Hq*d per layer for
    attention (halved when causal); embeddings, norms and pooling not counted."""
    h = config["hidden_size"]
    heads = config["num_attention_heads"]
    d = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads") or heads
    ffn = config["intermediate_size"]
    gated = config.get("model_type") == "qwen3"
    per_layer = h * (heads + 2 * kv) * d + heads * d * h + ffn * h * (3 if gated else 2)
    tokens = float(lengths.sum())
    attn = 4.0 * float((lengths.astype(np.float64) ** 2).sum()) * heads * d
    if causal:
        attn /= 2
    return config["num_hidden_layers"] * (2 * per_layer * tokens + attn)


def prepare_dirs(work: Path, models: list[str]) -> dict[str, Path]:
    from bench.shapes import bert_base_dir, qwen3_dir

    dirs = {}
    for name in models:
        if name == "minilm":
            dirs[name] = MINILM_DIR
            continue
        path = work / name
        if name == "bert-base":
            bert_base_dir(path)
        else:
            qwen3_dir(path, causal=True)
        # MiniLM's tokenizer and sentence-transformers files, so the directory loads in
        # sentence-transformers as a downloaded model would; pooling stays the model's own.
        for f in (*TOKENIZER_FILES, "modules.json", "sentence_bert_config.json"):
            shutil.copy(MINILM_DIR / f, path / f)
        (path / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": 512, "do_lower_case": False})
        )
        dirs[name] = path
    return dirs


def bench_st(path: Path, texts: list[str], tokens: int, sizes: list[int]) -> dict:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cuda")
    model.max_seq_length = 512
    model.to(torch.bfloat16)
    model.encode(texts[:2048], batch_size=512)  # warm every kernel shape class
    best = {}
    for bs in sizes:
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.encode(texts, batch_size=bs)
        torch.cuda.synchronize()
        rate = tokens / (time.perf_counter() - t)
        best = max(best, {"batch_size": bs, "tok_s": rate}, key=lambda r: r.get("tok_s", 0))
        print(f"  st bs={bs}: {rate / 1e6:.3f} M tok/s")
    del model
    torch.cuda.empty_cache()
    return best


def bench_engine(
    path: Path, batches, tokens: int, out: Path, name: str, kernels: str | None
) -> tuple[dict, Engine]:
    t = time.perf_counter()
    engine = Engine.load(path, device="cuda", max_batch_tokens=BUDGET, kernels=kernels)
    engine.warmup([16])
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    for b in batches:  # warm pass: compiles shape classes, captures the small buckets
        engine.embed(*b)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t
    rates = []
    for _ in range(2):
        t = time.perf_counter()
        outs = [engine.embed(*b) for b in batches]
        torch.cuda.synchronize()
        rates.append(tokens / (time.perf_counter() - t))
        del outs
    query = (np.array([101, *range(2000, 2014), 102], dtype=np.int32), np.array([0, 16], np.int32))
    lat = []
    for i in range(250):
        t = time.perf_counter()
        engine.embed(*query).cpu()
        if i >= 50:
            lat.append(time.perf_counter() - t)
    with (out / "profile.txt").open("a") as f:
        f.write(
            f"==== {name}: one {int(batches[0][1][-1])}-token batch\n{profile(engine, batches[0])}\n"
        )
    return {
        "tok_s": max(rates),
        "passes_tok_s": rates,
        "load_s": load_s,
        "warm_pass_s": warm_s,
        "graphs": sorted(engine.runner.graphs),
        "latency_graphed": 16 in engine.runner.graphs,
        "attention": type(engine.runner.eager_attn).__name__,
        "kernels": engine.kernels,
        "capture_s": engine.runner.capture_seconds,
        "latency16_ms": 1000 * float(np.median(lat)),
    }, engine


def profile(engine: Engine, batch) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    engine.embed(*batch)
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        engine.embed(*batch)
        torch.cuda.synchronize()
    return p.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70)


def bench_mesh(
    path: Path,
    ids: list[np.ndarray],
    tokens: int,
    out: Path,
    sizes: list[int],
    kernels: str,
    credits: int | None = None,
    profile_worker: bool = False,
) -> dict:
    """Broker + worker subprocesses, ``MeshClient.embed_tokens`` requests of ``sizes[0]``
    texts (then each other size) with up to 128 requests in flight; one warm pass, then the
    timed pass; the share of a core each process used in it; then the latency of single
    16-token requests through the whole mesh."""
    port = 17000 + os.getpid() % 1000 * 2
    front, back = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"
    env = dict(os.environ)
    log = (out / "mesh.log").open("a")
    launch = [sys.executable, "-m", "launch.cli"]
    procs = [
        subprocess.Popen(
            [
                *launch,
                "--role",
                "broker",
                "--frontend",
                front,
                "--backend",
                back,
                "--batch-timeout",
                "600",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        ),
        subprocess.Popen(
            [
                *launch,
                "--role",
                "worker",
                "--gpu",
                "0",
                "--model",
                str(path),
                "--served-name",
                "bench",
                "--broker",
                back,
                "--max-batch-tokens",
                str(BUDGET),
                "--warmup-buckets",
                "16,64,256",
                *([] if kernels == "default" else ["--kernels", kernels]),
                *([] if credits is None else ["--credits", str(credits)]),
                *(
                    ["--profile-out", str(out / f"worker-{path.name}.prof")]
                    if profile_worker
                    else []
                ),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        ),
    ]
    try:
        pids = {"client": os.getpid(), "broker": procs[0].pid, "worker": procs[1].pid}
        return asyncio.run(drive_mesh(front, ids, tokens, sizes, pids))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive_mesh(
    front: str,
    ids: list[np.ndarray],
    tokens: int,
    sizes: list[int],
    pids: dict[str, int],
    model: str = "bench",
    in_flight: int = 128,
) -> dict:
    """Through a running mesh: for each request size, a warm pass then a timed pass of
    ``embed_tokens`` requests over ``ids`` (at most ``in_flight`` outstanding) with the
    core share of each process in ``pids``; then the latency of single 16-token requests."""
    from mesh.client import MeshClient

    t = time.perf_counter()
    client = MeshClient(front, default_timeout_s=600)
    await client.start()
    await client.wait_ready(300, model=model)
    ready_s = time.perf_counter() - t
    gate = asyncio.Semaphore(in_flight)

    async def one(batch) -> None:
        async with gate:
            await client.embed_tokens(*batch, model=model)

    result: dict = {"worker_ready_s": ready_s, "by_request_size": {}}
    for size in sizes:
        requests = [_pack(ids[i : i + size]) for i in range(0, len(ids), size)]
        rates = []
        for _ in range(2):  # the first pass warms the worker (compile, captures)
            before = {k: cpu_seconds(p) for k, p in pids.items()}
            t = time.perf_counter()
            await asyncio.gather(*(one(r) for r in requests))
            wall = time.perf_counter() - t
            rates.append(tokens / wall)
        # A process near 1.0 of a core is what limits the mesh.
        busy = {k: round((cpu_seconds(p) - before[k]) / wall, 2) for k, p in pids.items()}
        result["by_request_size"][size] = {
            "tok_s": rates[-1],
            "warm_pass_tok_s": rates[0],
            "core_share": busy,
        }
    result.update(result["by_request_size"][sizes[0]], texts_per_request=sizes[0])
    query = _pack([np.array([101, *range(2000, 2014), 102], dtype=np.int32)])
    lat = []
    for i in range(250):
        t = time.perf_counter()
        await client.embed_tokens(*query, model=model)
        if i >= 50:
            lat.append(time.perf_counter() - t)
    result["latency16_ms"] = 1000 * float(np.median(lat))
    result["latency16_p99_ms"] = 1000 * float(np.percentile(lat, 99))
    await client.close()
    return result


def main(argv: list[str] | None = None) -> None:
    global MINILM_DIR
    ap = argparse.ArgumentParser(prog="mesh-bench gpu-engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument("--minilm", type=Path, help="all-MiniLM-L6-v2 directory (default: embedded)")
    ap.add_argument("--models", default="minilm,bert-base,qwen3-0.6b")
    ap.add_argument("--texts", type=int, default=20000)
    ap.add_argument("--st-texts", type=int, default=5000)
    ap.add_argument("--st-sizes", default="256,512")
    ap.add_argument("--no-st", action="store_true")
    ap.add_argument("--no-mesh", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="engine without torch.compile")
    ap.add_argument(
        "--kernels",
        default="default",
        help="engine kernels: default (the engine's choice), torch, compile, fused",
    )
    ap.add_argument(
        "--credits",
        type=int,
        help="the mesh worker's credits (default: the worker's own, 3 with its live lane)",
    )
    ap.add_argument("--profile-worker", action="store_true", help="cProfile the mesh worker")
    ap.add_argument(
        "--per-request", default="16,64", help="texts per mesh request; the first is reported"
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 1000 texts, minilm")
    args = ap.parse_args(argv)
    MINILM_DIR = args.minilm or MINILM_DIR
    if args.quick:
        args.texts, args.st_texts, args.models = 1000, 500, "minilm"
    args.out.mkdir(parents=True, exist_ok=True)
    if args.no_compile:
        args.kernels = "torch"
    kernels = None if args.kernels == "default" else args.kernels
    lengths = workload(args.texts)
    texts, ids = make_texts(lengths)
    tokens = int(lengths.sum())
    batches = fcfs_batches(ids, BUDGET)
    peak = peak_tflops()
    results = {
        "seed": SEED,
        "texts": len(ids),
        "tokens": tokens,
        "batches": len(batches),
        "peak_tflops": peak,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "models": {},
    }
    print(f"{len(ids)} texts, {tokens} tokens, {len(batches)} batches; peak {peak:.0f} TFLOP/s")
    work = Path(tempfile.mkdtemp(prefix="gpubench-"))
    for name, path in prepare_dirs(work, args.models.split(",")).items():
        print(f"== {name}")
        config = json.loads((path / "config.json").read_text())
        r: dict = {}
        n_st = min(args.st_texts, len(texts))
        if not args.no_st:
            st_tokens = int(lengths[:n_st].sum())
            sizes = [int(s) for s in args.st_sizes.split(",")]
            r["st"] = bench_st(path, texts[:n_st], st_tokens, sizes)
        r["engine"], engine = bench_engine(path, batches, tokens, args.out, name, kernels)
        causal = engine.card.causal
        del engine
        torch.cuda.empty_cache()
        print(
            f"  engine: {r['engine']['tok_s'] / 1e6:.3f} M tok/s, "
            f"16-token latency {r['engine']['latency16_ms']:.3f} ms"
        )
        if not args.no_mesh:
            sizes = [int(x) for x in args.per_request.split(",")]
            r["mesh"] = bench_mesh(
                path,
                ids,
                tokens,
                args.out,
                sizes,
                args.kernels,
                args.credits,
                profile_worker=args.profile_worker,
            )
            r["mesh"]["credits"] = args.credits
            print(f"  mesh: {r['mesh']['tok_s'] / 1e6:.3f} M tok/s")
        flops_per_token = model_flops(config, lengths, causal) / tokens
        for part in ("st", "engine", "mesh"):
            if part in r:
                r[part]["peak_share"] = r[part]["tok_s"] * flops_per_token / (peak * 1e12)
        results["models"][name] = r
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print_table(results)


def print_table(results: dict) -> None:
    print(
        f"\nseed {results['seed']}, {results['tokens']} tokens, peak {results['peak_tflops']:.0f}"
    )
    print("| model | st best | engine | mesh | engine/st | mesh/engine | 16-tok latency |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results["models"].items():
        e = r["engine"]["tok_s"]
        ratio = f"{e / r['st']['tok_s']:.1f}x" if "st" in r else "-"
        mesh = f"{r['mesh']['tok_s'] / e:.2f}" if "mesh" in r else "-"
        print(
            f"| {name} | {_cell(r, 'st')} | {_cell(r, 'engine')} | {_cell(r, 'mesh')} | {ratio} | {mesh} "
            f"| {r['engine']['latency16_ms']:.3f} ms |"
        )


def _cell(r: dict, part: str) -> str:
    if part not in r:
        return "-"
    return f"{r[part]['tok_s'] / 1e6:.3f} M ({100 * r[part]['peak_share']:.0f} %)"


if __name__ == "__main__":
    main()
