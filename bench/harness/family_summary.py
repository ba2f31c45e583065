"""``mesh-bench families``' summary: ``summary.json`` (every family's record) and ``summary.md``,
one row per family and output.

"FLOP/s vs ref" is tokens/s per FLOP: the engine's tokens/s times the forward's FLOPs per
token on the same texts (``family_models.forward_flops``), divided by the same product of the
reference (BERT-base for encoders, Qwen3-0.6B for decoders) in the same run; a family on the
FlashInfer/graph path should reach at least 0.8.
"""

from __future__ import annotations

import json
from pathlib import Path

HEADER = (
    "| family | output | shape | params | engine M tok/s | HTTP M tok/s | ST M tok/s (bs) "
    "| HTTP/ST | engine/ST | FLOP/s vs ref | peak share | path |"
)


def write_summary(out: Path, meta: dict, results: dict[str, dict]) -> None:
    (out / "summary.json").write_text(json.dumps({"meta": meta, "families": results}, indent=1))
    lines = [
        f"{meta['device']}, torch {meta['torch']}: {meta['texts']} corpus texts, "
        f"{meta['tokens']} tokens, {meta['batches']} FCFS batches of <= 16,384 tokens"
        + (
            f"; bf16 matmul peak {meta['peak_tflops']:.0f} TFLOP/s" if "peak_tflops" in meta else ""
        ),
        "",
        HEADER,
        "|" + " --- |" * (HEADER.count("|") - 1),
    ]
    for name, r in results.items():
        lines.extend(_rows(name, r, results, meta.get("peak_tflops")))
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def _rows(name: str, r: dict, results: dict, peak: float | None) -> list[str]:
    error = r.get("error", "").splitlines()[0][:200].replace("|", "/") if "error" in r else ""
    if "skipped" in r or not all(o in r.get("engine", {}) for o in r.get("outputs", [None])):
        why = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {error}"
        return [f"| {name} | - | {why} |" + " |" * 9]
    rows = [f"| {name} | - | failed after the engine: {error} |" + " |" * 9] if error else []
    for output in r["outputs"]:
        engine = r["engine"][output]["tok_s"]
        http = _get(r, "http", output)
        st = _get(r, "st", output)
        st_cell = "-" if st is None else f"{st / 1e6:.3f} ({r['st'][output]['batch_size']})"
        if st is None and "error" in r.get("st", {}).get(output, {}):
            st_cell = "failed: " + r["st"][output]["error"][:80].replace("|", "/")
        flops = engine * r["flops_per_token"][output]
        rows.append(
            f"| {name} | {output} | {r['shape']} | {r['params'] / 1e6:.0f} M | {engine / 1e6:.3f} "
            f"| {_m(http)} | {st_cell} | {_ratio(http, st)} | {_ratio(engine, st)} "
            f"| {_vs_ref(flops, r['reference'], results)} "
            f"| {'-' if not peak else f'{100 * flops / (peak * 1e12):.0f} %'} "
            f"| {_path(r['engine'], output)} |"
        )
    return rows


def _get(r: dict, part: str, output: str) -> float | None:
    value = r.get(part, {}).get(output, {}).get("tok_s")
    return float(value) if value else None


def _m(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.3f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def _vs_ref(flops: float, reference: str, results: dict) -> str:
    ref = results.get(reference, {})
    if "engine" not in ref:
        return f"- (no {reference})"
    ref_flops = ref["engine"]["dense"]["tok_s"] * ref["flops_per_token"]["dense"]
    return f"{flops / ref_flops:.2f} of {reference}"


def _path(engine: dict, output: str) -> str:
    if "graphs_on" not in engine:
        return "cpu"
    run = engine[output]
    graphs = (
        f"{run['graph_batches']}/{run['graph_batches'] + run['eager_batches']} batches in graphs"
    )
    masked = run.get("masked_batches", 0)
    windowed = run.get("windowed_batches", 0)  # absent in results from before it existed
    if masked:  # a windowed model's batches past its window, or MPNet's (bias) all
        kinds = f"{windowed} FlashInfer + window mask, {masked - windowed} grouped SDPA"
        graphs += f", {masked} masked ({kinds}, eager)"
    return f"{engine['attention']}{' + graphs' if engine['graphs_on'] else ''} ({graphs})"
