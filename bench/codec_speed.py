"""Warm encode and decode cost of the messages on a query's path, this checkout's ``proto_msgs``
against a git revision's, measured in the same process (alternating, best of the repeats).

    python bench/codec_speed.py --against HEAD~1 --repeats 7

The whole package at the revision is loaded (under another name), not only its codec: much of
a decode is the messages' own ``validate``, which lives in ``messages.py``. The messages are an
idle 16-token query's four (MiniLM width) and a 64-text bulk request of 8,192 tokens in the
same four shapes. Best of the repeats, not the median: on a shared host the noise only ever
adds time.
"""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import proto_msgs  # noqa: E402


def _ragged(n: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.arange(100, 100 + n * tokens, dtype=np.int32)
    return ids, np.arange(0, n * tokens + 1, tokens, dtype=np.int32)


def messages(pm: ModuleType) -> dict[str, Any]:
    """The four messages of a query of ``n`` texts, for n = 1 (16 tokens) and 64 (128 each),
    built from the package ``pm`` (this checkout's or the revision's)."""
    out: dict[str, Any] = {}
    for n, tokens in ((1, 16), (64, 128)):
        ids, offsets = _ragged(n, tokens)
        rows = np.ones((n, 384), np.float32)
        timings = {"worker_wait": 0.01, "worker_compute": 0.6, "worker_reply": 0.05}
        out[f"SubmitRequest, {n} seq"] = pm.SubmitRequest(
            cid=7,
            model="all-MiniLM-L6-v2",
            lane=int(pm.Lane.INTERACTIVE),
            timeout_ms=30_000,
            output=pm.OutputOptions(),
            token_ids=ids,
            offsets=offsets,
        )
        out[f"BatchAssign, {n} seq"] = pm.BatchAssign(
            batch_id=3,
            model="all-MiniLM-L6-v2",
            timeout_ms=30_000,
            outputs=[pm.OutputOptions()],
            output_index=np.zeros(n, np.int32),
            token_ids=ids,
            offsets=offsets,
        )
        out[f"BatchResult, {n} rows"] = pm.BatchResult(
            batch_id=3, compute_ms=0.4, embeddings=[rows], timings=timings
        )
        out[f"RequestResult, {n} rows"] = pm.RequestResult(
            cid=7,
            prompt_tokens=n * tokens,
            indices=np.arange(n, dtype=np.int32),
            embeddings=rows,
            queue_ms=0.1,
            compute_ms=0.5,
            timings={**timings, "broker_queue": 0.05, "broker_worker": 1.0},
        )
    return out


def package_at(rev: str) -> ModuleType:
    """``proto_msgs`` as it was at ``rev``, imported as ``proto_msgs_at_rev``."""
    alias = "proto_msgs_at_rev"
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, "proto_msgs/"],
        capture_output=True,
        check=True,
        text=True,
        cwd=ROOT,
    ).stdout.split()
    with tempfile.TemporaryDirectory(prefix="codec-old-") as tmp:  # not needed once imported
        (Path(tmp) / alias).mkdir()
        for name in names:
            if not name.endswith(".py"):
                continue
            source = subprocess.run(
                ["git", "show", f"{rev}:{name}"], capture_output=True, check=True, text=True
            ).stdout
            # Its own modules, not this checkout's: messages.py registers into its codec.
            source = re.sub(
                r"^(\s*(?:from|import) )proto_msgs\b", rf"\1{alias}", source, flags=re.M
            )
            (Path(tmp) / alias / Path(name).name).write_text(source)
        sys.path.insert(0, tmp)
        try:
            return importlib.import_module(alias)
        finally:
            sys.path.remove(tmp)


def per_call_us(fn: object, number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e6  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="git revision of the old proto_msgs")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000, help="calls per repeat")
    args = parser.parse_args()
    packages = {"old": package_at(args.against), "new": proto_msgs}
    built = {name: messages(pm) for name, pm in packages.items()}
    print(f"best of {args.repeats} x {args.number} calls, µs per call (old = {args.against})")
    print(f"{'message':24} {'decode old':>10} {'new':>7} {'encode old':>10} {'new':>7}")
    for label in built["new"]:
        times: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            for name, pm in packages.items():  # alternating, so both see the same host load
                msg = built[name][label]
                frames = [bytes(memoryview(f)) for f in pm.encode(msg)]
                assert type(pm.decode(frames)) is type(msg)
                dec = per_call_us(lambda pm=pm, f=frames: pm.decode(f), args.number)
                enc = per_call_us(lambda pm=pm, m=msg: pm.encode(m), args.number)
                times.setdefault(f"dec {name}", []).append(dec)
                times.setdefault(f"enc {name}", []).append(enc)
        best = {k: min(v) for k, v in times.items()}
        print(
            f"{label:24} {best['dec old']:10.1f} {best['dec new']:7.1f}"
            f" {best['enc old']:10.1f} {best['enc new']:7.1f}"
        )


if __name__ == "__main__":
    main()
