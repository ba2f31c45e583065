"""Bulk threads step aside for the GIL while a live batch runs in the worker.

A worker's threads share one GIL: the compute thread (launching bulk batches), the finisher
(collecting and encoding their results) and whichever thread runs a live query (the link's or
the lane's). The live lane gives a query its own CUDA stream, graphs and result slot
(:mod:`mesh.worker.live_lane`), but not its own interpreter: on the H200 under MiniLM bulk, a
query's forward took 1.8 ms at p50 and 4.5 ms at p99 against 0.7 idle, while its kernels alone
lose at most 0.3 ms to bulk (measured with CUDA green contexts). The rest is the query's thread
waiting for the GIL at each point where it let it go (a graph replay, an event wait, a socket
send), behind bulk threads that hold it for up to the switch interval each time.

So while a live batch runs, the bulk threads wait at their loop heads, asleep and without the
GIL, for it to finish: the compute thread before launching its next batch, the finisher before
collecting its next result. The device keeps the bulk work already launched (the worker holds
up to its credits), so bulk loses only the host time of a query. A bulk thread never waits
longer than ``max_wait_s`` at one checkpoint, whatever the live rate; with live batches
longer than that running back to back (a large model's), each bulk batch can lose that at
each of its two checkpoints. Measured at 10 live queries a second (docs/tuning.md).

``EMBEDMESH_LIVE_GATE_MS`` sets the bound (0 turns the gate off; default LIVE_GATE_MS).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from mesh.env_knobs import float_from_env

log = logging.getLogger("embedmesh.worker")

# A live query's host time in the worker is 0.5-1 ms on an H200; this bounds what one bulk
# checkpoint waits for it (a long live batch, or queries back to back). 0..20 is reasonable.
LIVE_GATE_MS = 3.0
_MAX_MS = 20.0


def live_gate_ms_from_env() -> float:
    """``EMBEDMESH_LIVE_GATE_MS`` (0..20; 0 turns the gate off), else LIVE_GATE_MS. A bad value
    warns and keeps the default."""
    return float_from_env("EMBEDMESH_LIVE_GATE_MS", LIVE_GATE_MS, 0.0, _MAX_MS, "ms", log)


class LiveGate:
    """Counts the live batches running; bulk threads wait (bounded) for the count to be zero."""

    def __init__(self, max_wait_ms: float) -> None:
        self.max_wait_s = max(0.0, max_wait_ms) / 1000
        self._cond = threading.Condition(threading.Lock())
        self._live = 0
        self.waits = 0  # checkpoints that found a live batch running
        self.waited_s = 0.0  # and how long they waited, in all
        self.timeouts = 0  # of those, the waits cut at max_wait_s

    @property
    def enabled(self) -> bool:
        return self.max_wait_s > 0

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        """Around a live batch's whole run (launch, collect, encode)."""
        with self._cond:
            self._live += 1
        try:
            yield
        finally:
            with self._cond:
                self._live -= 1
                if self._live == 0:
                    self._cond.notify_all()

    def yield_to_live(self) -> float:
        """A bulk thread's checkpoint: return at once when no live batch runs (or the gate is
        off), else sleep until none does or ``max_wait_s`` passed. Returns the seconds waited."""
        # Unlocked read: a stale answer costs one checkpoint's wait or one missed wait, and
        # the common case (no live batch) must cost the bulk loop nothing.
        if self._live == 0 or self.max_wait_s <= 0:
            return 0.0
        started = time.perf_counter()
        with self._cond:
            if self._live == 0:  # ended since the unlocked read
                return 0.0
            clear = self._cond.wait_for(lambda: self._live == 0, timeout=self.max_wait_s)
            waited = time.perf_counter() - started
            # Counted under the lock: both bulk threads update them.
            self.waits += 1
            self.waited_s += waited
            self.timeouts += not clear
        return waited

    def summary(self) -> str:
        if not self.enabled:
            return "live gate off"
        return (f"live gate: {self.waits} bulk waits, {self.waited_s * 1000:.0f} ms in all, "
                f"{self.timeouts} cut at {self.max_wait_s * 1000:g} ms")  # fmt: skip
