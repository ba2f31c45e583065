"""bench/harness/family_summary: tokens/s per FLOP against the reference of the same run, and
the rows of failed, skipped and partly measured families."""

from __future__ import annotations

from pathlib import Path

from bench.harness.family_summary import write_summary

META = {"device": "gpu", "torch": "2", "texts": 10, "tokens": 1000, "batches": 1,
        "peak_tflops": 1000.0}  # fmt: skip


def _family(tok_s: float, flops: float, reference: str, **extra: object) -> dict:
    return {
        "shape": "s", "params": 1e8, "outputs": ["dense"], "reference": reference,
        "engine": {"dense": {"tok_s": tok_s, "graph_batches": 3, "eager_batches": 1},
                   "graphs_on": True, "masked": False, "attention": "FlashInfer"},
        "flops_per_token": {"dense": flops},
        "st": {"dense": {"tok_s": tok_s / 4, "batch_size": 128}},
        "http": {"dense": {"tok_s": tok_s / 2}},
    } | extra  # fmt: skip


def test_flops_per_second_are_compared_with_the_reference_of_the_same_run(tmp_path: Path):
    results = {
        "bert": _family(2e6, 2e8, "bert"),
        # twice the FLOPs per token at 0.4 of the tokens/s: 0.8 of BERT's FLOP/s
        "mpnet": _family(0.8e6, 4e8, "bert"),
        "qwen2": _family(1e6, 1e9, "qwen3"),
    }
    write_summary(tmp_path, META, results)
    rows = {r.split("|")[1].strip(): r for r in (tmp_path / "summary.md").read_text().splitlines()
            if r.startswith("| ") and "---" not in r}  # fmt: skip
    assert "| 1.00 of bert |" in rows["bert"] and "| 0.80 of bert |" in rows["mpnet"]
    assert "no qwen3" in rows["qwen2"]
    assert "| 2.00 | 4.00 |" in rows["bert"]  # HTTP/ST, engine/ST
    assert "40 %" in rows["bert"]  # 2e6 tok/s x 2e8 FLOP/tok of 1000 TFLOP/s
    assert "3/4 batches in graphs" in rows["bert"]


def test_skipped_and_failed_families_keep_a_row_and_partial_results_show(tmp_path: Path):
    results = {
        "bert": _family(2e6, 2e8, "bert", error="RuntimeError: mesh-bench exited 1\n..."),
        "mistral": {"family": "mistral", "skipped": "400 s + ~75 s > budget 450 s"},
        "gemma3": {"family": "gemma3", "error": "ValueError: no | such\nmore"},
    }
    write_summary(tmp_path, META, results)
    text = (tmp_path / "summary.md").read_text()
    assert "| bert | - | failed after the engine: RuntimeError: mesh-bench exited 1 |" in text
    assert "| bert | dense |" in text
    assert "| mistral | - | skipped: 400 s + ~75 s > budget 450 s |" in text
    assert "| gemma3 | - | failed: ValueError: no / such |" in text


def test_a_windowed_family_says_which_backend_ran_its_masked_batches(tmp_path: Path):
    family = _family(1e6, 2e8, "bert")
    family["engine"]["dense"] |= {"masked_batches": 3, "windowed_batches": 2}
    write_summary(tmp_path, META, {"bert": _family(2e6, 2e8, "bert"), "modernbert": family})
    text = (tmp_path / "summary.md").read_text()
    assert "3 masked (2 FlashInfer + window mask, 1 grouped SDPA, eager)" in text
