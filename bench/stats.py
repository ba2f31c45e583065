"""The report math: per-request samples in, rates and latency percentiles out; arrival schedules.

Pure functions without I/O so that they are unit-tested (``tests/unit/bench``).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 99)
# Asked for with "1", answered with "name=ms,name=ms,...": the ingress's per-hop timings.
TIMINGS_HEADER = "X-Embedmesh-Timings"
# The share of a request's latency that the ingress did not time: the load generator's client,
# the HTTP transport both ways and, in an open loop, any lag behind the schedule.
OUTSIDE_INGRESS = "outside_ingress"


@dataclass(frozen=True)
class Sample:
    """One request as the load generator saw it."""

    # When it was due (open loop: scheduled time), perf_counter seconds; from the start of the
    # load once results of several load processes are merged (bench.procs).
    start_s: float
    latency_s: float  # from start_s to the last byte of the response
    status: str  # HTTP status ("200", "429", ...) or the client-side failure ("timeout", ...)
    texts: int  # inputs in the request
    tokens: int = 0  # usage.prompt_tokens of a 200 answer, else 0
    # The ingress's per-hop ms (parse_timings) when the request asked for them; None otherwise.
    # Not hashed: a dict is not hashable, and a Sample stays usable as a key or in a set.
    hops: dict[str, float] | None = field(default=None, hash=False)

    @property
    def end_s(self) -> float:
        return self.start_s + self.latency_s

    @property
    def ok(self) -> bool:
        return self.status == "200"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks.

    The same definition as ``numpy.percentile``'s default; NaN for no values.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, not {q}")
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def parse_timings(header: str | None) -> dict[str, float]:
    """``name=ms,name=ms`` into a dict; an entry that does not parse is left out, not fatal
    (the header is a diagnostic, and its producer is changing under us)."""
    out: dict[str, float] = {}
    for part in (header or "").split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name:
            continue
        try:
            ms = float(value)
        except ValueError:
            continue
        if math.isfinite(ms):
            out[name] = ms
    return out


def hop_percentiles(
    timings: Iterable[Mapping[str, float]], qs: Sequence[float] = (50,)
) -> dict[str, dict[str, float]]:
    """Per ``q`` (key ``pQ``), per hop, the percentile over the requests that reported that hop;
    hops in first-seen order (a name that never arrives is not shown)."""
    values: dict[str, list[float]] = {}
    for one in timings:
        for name, ms in one.items():
            values.setdefault(name, []).append(ms)
    return {f"p{q:g}": {name: percentile(ms, q) for name, ms in values.items()} for q in qs}


def hops_summary(samples: Iterable[Sample]) -> dict[str, dict[str, float]]:
    """p50 and p99 per hop over the successful samples that carry hops, plus
    ``outside_ingress`` (latency minus ``ingress_total``, where the ingress reported it);
    ``{}`` when no sample carries hops (a lane that did not ask for them)."""
    timings = []
    for s in samples:
        if not s.ok or not s.hops:
            continue
        one = dict(s.hops)
        if "ingress_total" in one:
            one[OUTSIDE_INGRESS] = s.latency_s * 1000 - one["ingress_total"]
        timings.append(one)
    return hop_percentiles(timings, (50, 99)) if timings else {}


def poisson_schedule(
    rate: float, *, duration_s: float | None = None, count: int | None = None, seed: int = 0
) -> list[float]:
    """Arrival offsets (seconds from the start) of a Poisson process of ``rate`` per second.

    Exponential gaps of mean ``1 / rate``, seeded so that a run is reproducible; stops at
    ``count`` arrivals or at the last arrival before ``duration_s`` (give one of the two).
    """
    if rate <= 0:
        raise ValueError(f"rate must be positive, not {rate}")
    if (duration_s is None) == (count is None):
        raise ValueError("give exactly one of duration_s and count")
    rng = random.Random(seed)
    offsets: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if count is not None and len(offsets) >= count:
            return offsets
        if duration_s is not None and t >= duration_s:
            return offsets
        offsets.append(t)


def even_schedule(
    rate: float, *, duration_s: float | None = None, count: int | None = None
) -> list[float]:
    """Arrival offsets of a fixed rate: one every ``1 / rate`` seconds, the first after one gap.

    The live lane of ``mixed`` uses it: evenly spaced queries measure what the bulk load does to
    a query, where Poisson bursts would add queries waiting behind each other.
    """
    if rate <= 0:
        raise ValueError(f"rate must be positive, not {rate}")
    if (duration_s is None) == (count is None):
        raise ValueError("give exactly one of duration_s and count")
    n = count if count is not None else math.ceil(duration_s * rate) - 1  # type: ignore[operator]
    return [(i + 1) / rate for i in range(max(0, n))]


def cdf_ms(latencies_ms: Sequence[float], step: float = 0.5) -> list[float]:
    """Latency at every ``step``-th percentile from 0 to 100: the CDF a plot draws, small
    enough for the JSON report whatever the number of samples."""
    xs = sorted(latencies_ms)
    if not xs:
        return []
    steps = round(100 / step)
    return [percentile(xs, i * step) for i in range(steps + 1)]


def timeline(samples: Iterable[Sample], start_s: float, elapsed_s: float) -> dict[str, object]:
    """Successful requests and tokens per second in equal bins of the window, by completion
    time: throughput over time (1 s bins, or 20 bins in a window under 20 s)."""
    bin_s = 1.0 if elapsed_s >= 20 else elapsed_s / 20
    bins = max(1, math.ceil(elapsed_s / bin_s - 1e-9))
    requests, tokens = [0] * bins, [0] * bins
    for s in samples:
        i = math.floor((s.end_s - start_s) / bin_s)
        if s.ok and 0 <= i < bins:
            requests[i] += 1
            tokens[i] += s.tokens
    return {
        "bin_s": bin_s,
        "requests_per_s": [r / bin_s for r in requests],
        "tokens_per_s": [t / bin_s for t in tokens],
    }


@dataclass
class RunStats:
    """What one load run delivered, in the units of the report."""

    requests: int
    ok: int
    errors: dict[str, int]
    elapsed_s: float
    requests_per_s: float
    texts_per_s: float
    tokens_per_s: float
    tokens: int
    latency_ms: dict[str, float]  # p50, p90, p99, mean, max over successful requests

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def summarize(samples: Iterable[Sample], elapsed_s: float) -> RunStats:
    """Rates over ``elapsed_s`` (the measured window) count successful requests only."""
    samples = list(samples)
    if elapsed_s <= 0:
        raise ValueError(f"elapsed_s must be positive, not {elapsed_s}")
    ok = [s for s in samples if s.ok]
    errors = Counter(s.status for s in samples if not s.ok)
    latencies = [s.latency_s * 1000 for s in ok]
    latency = {f"p{q}": percentile(latencies, q) for q in PERCENTILES}
    latency["mean"] = sum(latencies) / len(latencies) if latencies else math.nan
    latency["max"] = max(latencies) if latencies else math.nan
    tokens = sum(s.tokens for s in ok)
    return RunStats(
        requests=len(samples),
        ok=len(ok),
        errors=dict(sorted(errors.items())),
        elapsed_s=elapsed_s,
        requests_per_s=len(ok) / elapsed_s,
        texts_per_s=sum(s.texts for s in ok) / elapsed_s,
        tokens_per_s=tokens / elapsed_s,
        tokens=tokens,
        latency_ms=latency,
    )
