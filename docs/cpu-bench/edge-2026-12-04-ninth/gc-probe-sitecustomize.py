"""Times Python's cyclic garbage collections in every process that has this directory first
on PYTHONPATH (as ``sitecustomize``): per generation, the count and the longest, and when
each gen2 collection ran; written at exit to ``/tmp/gcprobe/out-PID.json``."""

import atexit
import gc
import json
import os
import sys
import time

_T0 = time.perf_counter()
_start: dict[str, float] = {}
_ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
_gen2_at: list[tuple[float, float, int]] = []


def _callback(phase: str, info: dict[str, int]) -> None:
    now = time.perf_counter()
    if phase == "start":
        _start["t"] = now
        return
    ms = (now - _start.get("t", now)) * 1000
    _ms[info["generation"]].append(ms)
    if info["generation"] == 2:
        _gen2_at.append((round(now - _T0, 1), round(ms, 1), info["collected"]))


def _dump() -> None:
    out: dict[str, object] = {
        "pid": os.getpid(),
        "argv": " ".join(sys.argv)[-80:],
        "objects": len(gc.get_objects()),
        "uptime_s": round(time.perf_counter() - _T0, 1),
        "gen2_at": _gen2_at,
    }
    for gen, values in _ms.items():
        v = sorted(values)
        out[f"gen{gen}"] = {
            "n": len(v),
            "max_ms": round(v[-1], 2) if v else 0,
            "sum_ms": round(sum(v), 1),
        }
    os.makedirs("/tmp/gcprobe", exist_ok=True)
    with open(f"/tmp/gcprobe/out-{os.getpid()}.json", "w") as fh:
        json.dump(out, fh)


gc.callbacks.append(_callback)
atexit.register(_dump)
