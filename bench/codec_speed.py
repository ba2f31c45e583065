"""Warm encode and decode cost of the messages on a query's path, this checkout against a
git revision's ``proto_msgs/codec.py``, measured in the same process (alternating, medians).

    python bench/codec_speed.py --against HEAD~1 --repeats 7
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from types import ModuleType

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proto_msgs import (  # noqa: E402
    BatchAssign,
    BatchResult,
    Lane,
    Message,
    OutputOptions,
    RequestResult,
    SubmitRequest,
    codec,
)


def _ragged(n: int, tokens: int = 16) -> tuple[np.ndarray, np.ndarray]:
    ids = np.arange(100, 100 + n * tokens, dtype=np.int32)
    return ids, np.arange(0, n * tokens + 1, tokens, dtype=np.int32)


def messages() -> dict[str, Message]:
    """An idle 16-token query's four messages (MiniLM width), and a 64-sequence submit."""
    one = _ragged(1)
    many = _ragged(64)
    row = np.ones((1, 384), np.float32)
    submit = dict(cid=7, model="all-MiniLM-L6-v2", lane=Lane.INTERACTIVE, timeout_ms=30_000)
    return {
        "SubmitRequest, 1 seq": SubmitRequest(
            **submit, output=OutputOptions(), token_ids=one[0], offsets=one[1]
        ),
        "SubmitRequest, 64 seq": SubmitRequest(
            **submit, output=OutputOptions(), token_ids=many[0], offsets=many[1]
        ),
        "BatchAssign, 1 seq": BatchAssign(
            batch_id=3,
            model="all-MiniLM-L6-v2",
            timeout_ms=30_000,
            outputs=[OutputOptions()],
            output_index=np.zeros(1, np.int32),
            token_ids=one[0],
            offsets=one[1],
        ),
        "BatchResult, 1 row": BatchResult(
            batch_id=3,
            compute_ms=0.4,
            embeddings=[row],
            timings={"worker_wait": 0.01, "worker_compute": 0.6, "worker_reply": 0.05},
        ),
        "RequestResult, 1 row": RequestResult(
            cid=7,
            prompt_tokens=16,
            indices=np.zeros(1, np.int32),
            embeddings=row,
            timings={"worker_compute": 0.6, "broker_queue": 0.05, "broker_worker": 1.0},
        ),
    }


def old_codec(rev: str) -> ModuleType:
    """``proto_msgs/codec.py`` at ``rev``, sharing this checkout's registered messages."""
    source = subprocess.run(
        ["git", "show", f"{rev}:proto_msgs/codec.py"], capture_output=True, check=True, text=True
    ).stdout
    with tempfile.TemporaryDirectory(prefix="codec-old-") as tmp:  # not needed once loaded
        path = Path(tmp) / "codec_old.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("codec_old", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # In sys.modules before it runs: @dataclass looks its module up there (a KW_ONLY
        # check), so a codec that declares one failed to load (the default, --against HEAD).
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    module.REGISTRY = codec.REGISTRY  # type: ignore[attr-defined]
    return module


def per_call_us(fn: object, number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e6  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="git revision of the old codec")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000, help="calls per repeat")
    args = parser.parse_args()
    codecs = {"old": old_codec(args.against), "new": codec}
    print(f"median of {args.repeats} x {args.number} calls, µs per call (old = {args.against})")
    print(f"{'message':24} {'decode old':>10} {'new':>7} {'encode old':>10} {'new':>7}")
    for label, msg in messages().items():
        times: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            for name, c in codecs.items():  # alternating, so both see the same host load
                frames = [bytes(f) for f in c.encode(msg)]
                assert type(c.decode(frames)) is type(msg)
                dec = per_call_us(lambda c=c, f=frames: c.decode(f), args.number)
                enc = per_call_us(lambda c=c, m=msg: c.encode(m), args.number)
                times.setdefault(f"dec {name}", []).append(dec)
                times.setdefault(f"enc {name}", []).append(enc)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{label:24} {med['dec old']:10.1f} {med['dec new']:7.1f}"
            f" {med['enc old']:10.1f} {med['enc new']:7.1f}"
        )


if __name__ == "__main__":
    main()
