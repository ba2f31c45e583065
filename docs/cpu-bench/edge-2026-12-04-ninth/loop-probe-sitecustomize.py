import sys, os
if "ingress" in " ".join(sys.argv):
    import asyncio.events, time, atexit, json, collections
    _orig = asyncio.events.Handle._run
    _durs = []
    _slow = collections.Counter()
    _slow_t = collections.defaultdict(float)
    def _run(self):
        t = time.perf_counter()
        try:
            return _orig(self)
        finally:
            d = (time.perf_counter() - t) * 1000
            _durs.append(d)
            if d > 1.0:
                cb = getattr(self, "_callback", None)
                name = getattr(cb, "__qualname__", None) or repr(cb)[:120]
                if hasattr(cb, "get_coro"):
                    try: name = "task:" + cb.get_coro().__qualname__
                    except Exception: pass
                if "Task" in type(getattr(cb, "__self__", None)).__name__:
                    try: name = "task-step:" + cb.__self__.get_coro().__qualname__
                    except Exception: pass
                _slow[name] += 1
                _slow_t[name] += d
    asyncio.events.Handle._run = _run
    import asyncio as _a, uvloop as _u
    _u.run = lambda coro, **kw: _a.run(coro)
    def _dump():
        v = sorted(_durs)
        n = len(v)
        out = {"pid": os.getpid(), "n": n}
        if n:
            for q in (0.5, 0.9, 0.99, 0.999):
                out[f"p{q}"] = round(v[int(q * (n - 1))], 3)
            out["max"] = round(v[-1], 2)
            out["total_s"] = round(sum(v) / 1000, 2)
            out["over1ms"] = sum(1 for x in v if x > 1)
            out["over1ms_total_s"] = round(sum(x for x in v if x > 1) / 1000, 2)
        out["slow"] = sorted(((k, c, round(_slow_t[k], 1)) for k, c in _slow.items()), key=lambda r: -r[2])[:15]
        with open(f"/tmp/loopprobe/out-{os.getpid()}.json", "w") as fh:
            json.dump(out, fh, indent=1)
    atexit.register(_dump)
