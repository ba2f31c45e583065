import atexit, gc, os, sys, time, json, signal
_t = {}
_stats = {0: [], 1: [], 2: []}
_T0 = time.perf_counter()
_big = []
def _cb(phase, info):
    if phase == "start":
        _t["s"] = time.perf_counter()
    else:
        ms = (time.perf_counter() - _t.get("s", time.perf_counter())) * 1000
        _stats[info["generation"]].append(ms)
        if info["generation"] == 2:
            _big.append((round(time.perf_counter() - _T0, 1), round(ms, 1), info["collected"]))
gc.callbacks.append(_cb)
def _dump(*a):
    role = " ".join(sys.argv)[-80:]
    out = {"pid": os.getpid(), "argv": role, "objects": len(gc.get_objects())}
    for g, v in _stats.items():
        v = sorted(v)
        out[f"gen{g}"] = {"n": len(v), "max_ms": round(v[-1], 2) if v else 0, "sum_ms": round(sum(v), 1),
                          "p99_ms": round(v[int(0.99 * (len(v) - 1))], 2) if v else 0}
    out["gen2_at"] = _big
    out["uptime_s"] = round(time.perf_counter() - _T0, 1)
    with open(f"/tmp/gcprobe/out-{os.getpid()}.json", "w") as fh:
        json.dump(out, fh)
atexit.register(_dump)
_prev = signal.getsignal(signal.SIGTERM)
