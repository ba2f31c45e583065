"""How long the ingress takes to base64 a response's rows (``mesh.ingress.encodings._b64_rows``),
with pybase64 (SIMD) and with the standard library, per response of 64 rows:

    python -m bench.base64_speed [--rows 64] [--repeat 2000]

The rows are encoded on the ingress's event loop, where a live query waits for them.
"""

from __future__ import annotations

import argparse
import base64
import sys
import timeit

import numpy as np

from mesh.ingress import encodings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args(argv)
    fast = encodings._fast_b64
    rng = np.random.default_rng(0)
    for dims in (384, 768, 1024):
        x = rng.standard_normal((args.rows, dims)).astype("<f4")

        def stdlib(x: np.ndarray = x) -> list[str]:  # what the ingress did before pybase64
            return [base64.b64encode(row).decode("ascii") for row in x]

        times = {"stdlib per row": stdlib}
        times["_b64_rows, stdlib"] = lambda x=x: _without_fast(x)
        if fast is not None:
            times["_b64_rows, pybase64"] = lambda x=x: encodings._b64_rows(x)
        for name, fn in times.items():
            us = timeit.timeit(fn, number=args.repeat) / args.repeat * 1e6
            print(f"{args.rows} x {dims} float32, {name}: {us:.1f} us")
    return 0


def _without_fast(x: np.ndarray) -> list[str]:
    saved, encodings._fast_b64 = encodings._fast_b64, None
    try:
        return encodings._b64_rows(x)
    finally:
        encodings._fast_b64 = saved


if __name__ == "__main__":
    sys.exit(main())
