"""``mesh-bench families``: for each model family and output, in one run, tokens/s of the
engine alone, through HTTP and of sentence-transformers on the same corpus texts, and the
engine's tokens/s per FLOP relative to BERT-base (encoders) or Qwen3-0.6B (decoders).

    mesh-bench families --out OUT [--families bert,qwen3] [--budget-s 450]
    mesh-bench families --out OUT --quick       # two-layer shapes: every step, on a CPU

Per family (``bench/harness/family_models.py``: shapes, builders, FLOPs), in this order:

1. build a random-weight directory in the real shape (transformers, on the GPU, bf16) with the
   embedded MiniLM's tokenizer;
2. the engine alone (``Engine.load(dir, device)``) on the first ``--texts`` corpus texts,
   tokenized and truncated at 512, in FCFS batches of at most 16,384 tokens in file order: one
   warm pass, then passes for ``--seconds``; each output the family is measured on (dense
   vectors; SPLADE weights; bge-m3's lexical weights and colbert vectors);
3. sentence-transformers on the same texts (bf16 on CUDA; batch 32 and 128, the best counts):
   ``SentenceTransformer.encode``, ``SparseEncoder.encode`` for SPLADE; for bge-m3, which it has
   no heads for, ``encode`` of the same backbone (lexical) and its token embeddings (colbert);
4. through HTTP: ``mesh-bench`` closed loop on ``/v1/embeddings`` for dense models, our closed
   loop on ``/embed_sparse`` and ``/embed_multivector`` for the others
   (``bench/harness/family_http.py``), against ``mesh-launch --role all`` on the GPU.

Each family runs in a ``try``: a failure is recorded in its JSON and the next one starts. A
family whose estimated time would take the run past ``--budget-s`` is skipped and recorded.
Written as it goes: ``OUT/family-NAME.json``, ``OUT/summary.json``, ``OUT/summary.md``.
``--quick``: two-layer shapes, short windows, CPU-capable (a smoke test of every step).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from bench.corpus import DEFAULT_CORPUS, load_texts
from bench.harness.family_http import drive_outputs, mesh_bench
from bench.harness.family_models import (
    FAMILIES,
    MAX_TOKENS,
    FamilySpec,
    build,
    forward_flops,
    shape_of,
)
from bench.harness.family_summary import write_summary
from bench.harness.gpu_engine import fcfs_batches
from mesh.worker.engine.engine import Engine

BUDGET = 16384
GPU_SPAWN = "--device cuda --warmup-buckets 16,32,64,128,256"
CPU_SPAWN = "--ingress-procs 1 --threads 1"


def tokenize(texts: list[str]) -> list[np.ndarray]:
    """The ids every model gets: MiniLM's WordPiece, special tokens, truncated at 512."""
    from tokenizers import Tokenizer

    from mesh.worker.engine.card import default_model_path

    tok = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=MAX_TOKENS)
    return [np.array(e.ids, dtype=np.int32) for e in tok.encode_batch(texts)]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _call(engine: Engine, output: str, batch: tuple) -> torch.Tensor:
    """One batch of ``output`` as the worker computes it (no finalize, results on device)."""
    ids, offsets, spans = batch
    if output == "lexical":
        return engine.embed_lexical(ids, offsets)
    if output == "multivector":
        return engine.project_multivector(engine.embed_with_spans(ids, offsets, spans)[1])
    return engine.embed(ids, offsets)


def time_engine(engine: Engine, batches: list, output: str, seconds: float, device: str) -> dict:
    """A warm pass (at most ``seconds``), then passes over the batches until ``seconds``."""
    runner = engine.gpu_runner

    def counts() -> tuple[int, int, int, int]:
        if runner is None:
            return (0, 0, 0, 0)
        # masked_batches: a windowed model's batches past its window (or MPNet's all), a
        # subset of eager_batches; windowed_batches: of those, the ones FlashInfer ran with
        # the window as a mask (the rest grouped SDPA)
        return (
            runner.graph_batches,
            runner.eager_batches,
            runner.masked_batches,
            runner.windowed_batches,
        )

    t = time.perf_counter()
    for b in batches:
        _call(engine, output, b)
        if time.perf_counter() - t > seconds:
            break
    sync(device)
    warm_s = time.perf_counter() - t
    before, tokens = counts(), 0
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        for b in batches:
            _call(engine, output, b)
            tokens += int(b[1][-1])
            if time.perf_counter() - t > seconds:
                break
    sync(device)
    elapsed = time.perf_counter() - t
    graph, eager, masked, windowed = (a - b for a, b in zip(counts(), before, strict=True))
    return {"tok_s": tokens / elapsed, "tokens": tokens, "seconds": elapsed, "warm_pass_s": warm_s,
            "graph_batches": graph, "eager_batches": eager, "masked_batches": masked,
            "windowed_batches": windowed}  # fmt: skip


def with_spans(ids: list[np.ndarray]) -> list[tuple]:
    """FCFS batches, each with a span per token after the first of its sequence (the colbert
    rows: every token after ``<s>``)."""
    out = []
    for flat, offsets in fcfs_batches(ids, BUDGET):
        keep = np.ones(int(offsets[-1]), dtype=bool)
        keep[offsets[:-1]] = False
        starts = np.flatnonzero(keep)
        out.append((flat, offsets, np.stack([starts, starts + 1], axis=1)))
    return out


def bench_engine(
    path: Path, spec: FamilySpec, batches: list, args: argparse.Namespace, device: str
) -> tuple[dict, bool]:
    t = time.perf_counter()
    engine = Engine.load(path, device=device, max_batch_tokens=BUDGET)
    engine.warmup([16])
    result: dict = {"load_s": time.perf_counter() - t, "kernels": engine.kernels}
    runner = engine.gpu_runner
    if runner is not None:
        result |= {"graphs_on": runner.graphs_on, "masked": runner.masked,
                   "attention": type(runner.eager_attn).__name__}  # fmt: skip
    for output in spec.outputs:
        result[output] = time_engine(engine, batches, output, args.engine_seconds, device)
        print(f"  engine {output}: {result[output]['tok_s'] / 1e6:.3f} M tok/s", flush=True)
    if runner is not None:
        result["graphs"] = sorted(runner.graphs)
    causal = engine.card.causal
    del engine, runner
    _free()
    return result, causal


def bench_st(path: Path, output: str, texts: list[str], tokens: int, device: str) -> dict:
    """sentence-transformers on ``texts``: the best of batch 32 and 128 after a warm-up."""
    from sentence_transformers import SentenceTransformer

    if output == "sparse":
        from sentence_transformers import SparseEncoder

        model = SparseEncoder(str(path), device=device)
    else:
        model = SentenceTransformer(str(path), device=device)
    if device == "cuda":
        model.to(torch.bfloat16)
    model.max_seq_length = MAX_TOKENS
    # No heads for bge-m3's outputs: its backbone's token states (colbert) or pooled vector.
    kw = {"output_value": "token_embeddings"} if output == "multivector" else {}
    what = {
        "multivector": "token_embeddings of the backbone",
        "lexical": "dense encode of the backbone",
    }
    model.encode(texts[:256], batch_size=128, **kw)
    best: dict = {"what": what.get(output, "encode")}
    for bs in (32, 128):
        sync(device)
        t = time.perf_counter()
        model.encode(texts, batch_size=bs, **kw)
        sync(device)
        rate = tokens / (time.perf_counter() - t)
        best[f"bs{bs}_tok_s"] = rate
        if rate > best.get("tok_s", 0):
            best |= {"tok_s": rate, "batch_size": bs}
    del model
    _free()
    return best


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_family(
    name: str, args: argparse.Namespace, work: Path, corpus: dict, device: str, r: dict
) -> None:
    """Fills ``r`` as it goes, so that what was measured before a failure is kept."""
    spec = FAMILIES[name]
    path = work / name  # the directory's name is the served model name
    r |= {"shape": spec.shape + (" (quick: tiny)" if args.quick else ""),
          "outputs": list(spec.outputs), "reference": spec.reference}  # fmt: skip
    t = time.perf_counter()
    r["params"] = build(spec, path, args.quick, device)
    r["build_s"] = time.perf_counter() - t
    config = json.loads((path / "config.json").read_text())
    batches = corpus["span_batches"] if {"multivector"} & set(spec.outputs) else corpus["batches"]
    r["engine"], causal = bench_engine(path, spec, batches, args, device)
    lengths = corpus["lengths"]
    r["flops_per_token"] = {
        o: forward_flops(shape_of(config, name, causal, o), lengths) / lengths.sum()
        for o in spec.outputs
    }
    r["causal"] = causal
    r["st"] = {}
    for output in spec.outputs if args.st else ():
        try:
            n = corpus["st_texts"]
            r["st"][output] = bench_st(
                path, output, corpus["texts"][:n], corpus["st_tokens"], device
            )
        except Exception as exc:  # recorded: the HTTP part still runs
            r["st"][output] = {"error": f"{type(exc).__name__}: {exc}"}
    load = {
        k: getattr(args, k)
        for k in ("concurrency", "texts_per_request", "procs", "seconds", "warmup")
    }
    if not args.http:
        return
    if spec.outputs == ("dense",):
        timeout = 240 + args.warmup + args.seconds
        r["http"] = {"dense": mesh_bench(path, name, args.spawn, load, args.out, timeout)}
    else:
        r["http"] = drive_outputs(path, list(spec.outputs), args.spawn, load)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="mesh-bench families", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-families"))
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help=f"comma list, run in this order; of {', '.join(FAMILIES)}")  # fmt: skip
    ap.add_argument("--seconds", type=float, default=5.0, help="each HTTP measured window")
    ap.add_argument("--engine-seconds", type=float, default=3.0, help="the engine's window")
    ap.add_argument("--warmup", type=float, default=3.0, help="HTTP warm-up before the window")
    ap.add_argument("--texts", type=int, default=2500, help="corpus texts of the engine's passes")
    ap.add_argument("--st-texts", type=int, default=1000, help="of those, sentence-transformers'")
    ap.add_argument("--budget-s", type=float, default=450.0, help="skip families past this")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--texts-per-request", type=int, default=64)
    ap.add_argument("--procs", type=int, default=4, help="HTTP load processes")
    ap.add_argument("--spawn", default=None, help=f"mesh-launch flags (GPU: {GPU_SPAWN!r})")
    ap.add_argument("--no-st", dest="st", action="store_false", help="no sentence-transformers")
    ap.add_argument("--no-http", dest="http", action="store_false", help="no mesh, no HTTP")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, short windows (CPU)")
    ap.add_argument("--keep-models", action="store_true", help="keep the built directories")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        args.seconds, args.engine_seconds, args.warmup = 1.5, 1.0, 1.0
        args.texts, args.st_texts = 200, 64
        args.concurrency, args.texts_per_request, args.procs = 4, 8, 1
    if args.spawn is None:
        args.spawn = GPU_SPAWN if device == "cuda" else CPU_SPAWN
    args.out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.families.split(",") if n]
    unknown = set(names) - set(FAMILIES)
    if unknown:
        ap.error(f"unknown families {sorted(unknown)}; known: {', '.join(FAMILIES)}")
    run(args, names, device)


def run(args: argparse.Namespace, names: list[str], device: str) -> None:
    started = time.monotonic()
    texts = load_texts(DEFAULT_CORPUS)[: args.texts]
    ids = tokenize(texts)
    corpus = {
        "texts": texts, "lengths": np.array([len(x) for x in ids], dtype=np.int64),
        "batches": [(f, o, None) for f, o in fcfs_batches(ids, BUDGET)],
        "span_batches": with_spans(ids), "st_texts": min(args.st_texts, len(texts)),
        "st_tokens": int(sum(len(x) for x in ids[: args.st_texts])),
    }  # fmt: skip
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch": torch.__version__, "texts": len(texts), "tokens": int(corpus["lengths"].sum()),
            "batches": len(corpus["batches"]), "args": {k: str(v) for k, v in vars(args).items()}}  # fmt: skip
    if device == "cuda":
        from bench.harness.gpu_engine import peak_tflops

        meta["peak_tflops"] = peak_tflops()
    print(f"{meta['texts']} texts, {meta['tokens']} tokens, {meta['batches']} batches", flush=True)
    work = Path(tempfile.mkdtemp(prefix="families-"))
    results: dict[str, dict] = {}
    for name in names:
        elapsed = time.monotonic() - started
        est = FAMILIES[name].est_s
        if not args.quick and elapsed + est > args.budget_s:
            results[name] = {
                "family": name,
                "skipped": f"{elapsed:.0f} s + ~{est} s > budget {args.budget_s:.0f} s",
            }
        else:
            print(f"== {name} ({elapsed:.0f} s in)", flush=True)
            t = time.monotonic()
            results[name] = {"family": name}
            try:
                run_family(name, args, work, corpus, device, results[name])
            except Exception as exc:  # one family's failure must not stop the rest
                traceback.print_exc()
                results[name] |= {"family": name, "error": f"{type(exc).__name__}: {exc}",
                                 "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
            results[name]["wall_s"] = time.monotonic() - t
            if not args.keep_models:
                shutil.rmtree(work / name, ignore_errors=True)
            _free()
        (args.out / f"family-{name}.json").write_text(json.dumps(results[name], indent=1))
        write_summary(args.out, meta, results)
    print((args.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
