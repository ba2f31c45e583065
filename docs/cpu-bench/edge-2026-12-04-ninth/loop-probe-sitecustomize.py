"""Times every callback of an ingress's asyncio event loop (issue 8's `outside_ingress`).

Put this directory first on PYTHONPATH (as ``sitecustomize``) of an ingress process; it runs
the ingress on asyncio's loop instead of uvloop (uvloop's handles cannot be timed from
Python) and, at exit, writes ``/tmp/loopprobe/out-PID.json``: callback-length percentiles and
the callbacks over 1 ms by name (a task's coroutine for task steps).
"""

import contextlib
import os
import sys

if "ingress" in " ".join(sys.argv):
    import asyncio
    import asyncio.events
    import atexit
    import collections
    import json
    import time

    import uvloop

    _orig = asyncio.events.Handle._run
    _durs: list[float] = []
    _slow: collections.Counter[str] = collections.Counter()
    _slow_ms: collections.defaultdict[str, float] = collections.defaultdict(float)

    def _name(cb: object) -> str:
        name = getattr(cb, "__qualname__", None) or repr(cb)[:120]
        owner = getattr(cb, "__self__", None)
        if "Task" in type(owner).__name__:
            with contextlib.suppress(Exception):
                name = "task-step:" + owner.get_coro().__qualname__  # type: ignore[union-attr]
        return name

    def _run(self: asyncio.events.Handle) -> None:
        started = time.perf_counter()
        try:
            return _orig(self)
        finally:
            ms = (time.perf_counter() - started) * 1000
            _durs.append(ms)
            if ms > 1.0:
                name = _name(getattr(self, "_callback", None))
                _slow[name] += 1
                _slow_ms[name] += ms

    asyncio.events.Handle._run = _run  # type: ignore[method-assign]
    uvloop.run = lambda coro, **_: asyncio.run(coro)  # type: ignore[assignment]

    def _dump() -> None:
        v = sorted(_durs)
        out: dict[str, object] = {"pid": os.getpid(), "n": len(v)}
        if v:
            for q in (0.5, 0.9, 0.99, 0.999):
                out[f"p{q}"] = round(v[int(q * (len(v) - 1))], 3)
            out["max"] = round(v[-1], 2)
            out["total_s"] = round(sum(v) / 1000, 2)
            out["over1ms"] = sum(1 for x in v if x > 1)
            out["over1ms_total_s"] = round(sum(x for x in v if x > 1) / 1000, 2)
        rows = ((k, c, round(_slow_ms[k], 1)) for k, c in _slow.items())
        out["slow"] = sorted(rows, key=lambda r: -r[2])[:15]
        os.makedirs("/tmp/loopprobe", exist_ok=True)
        with open(f"/tmp/loopprobe/out-{os.getpid()}.json", "w") as fh:
            json.dump(out, fh, indent=1)

    atexit.register(_dump)
