"""Where a request's time goes, from the ingress's own histograms on ``/metrics``.

The difference of each histogram's ``_sum`` and ``_count`` between two scrapes gives the mean
over the requests in between: HTTP total, tokenization, and the mesh part (submit to last
result) split into the broker queue wait and the workers' compute. The mesh histograms are
labelled by lane, so a window with live and bulk traffic (``--mode mixed``) is split by lane.
"""

from __future__ import annotations

import re
import urllib.request

# Short name -> the ingress histogram (see mesh/ingress/metrics.py).
STAGES = {
    "http": "embedmesh_ingress_request_duration_seconds",
    "tokenize": "embedmesh_ingress_tokenize_duration_seconds",
    "mesh": "embedmesh_ingress_mesh_duration_seconds",
    "queue": "embedmesh_ingress_queue_duration_seconds",
    "inference": "embedmesh_ingress_inference_duration_seconds",
}
_LINE = re.compile(r"^(\w+?)_(sum|count)(\{[^}]*\})?\s+(\S+)$")
_ROUTE = re.compile(r'route="([^"]*)"')
_LANE = re.compile(r'lane="([^"]*)"')

# histogram -> (sum, count), summed over labels; also "histogram@lane" for lane-labelled ones
Scrape = dict[str, tuple[float, float]]


def parse(text: str) -> Scrape:
    """``_sum`` and ``_count`` of every histogram, summed over label sets; for the HTTP
    histogram only the embeddings route counts (our own scrapes are requests too)."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name, part, labels, value = m.groups()
        route = _ROUTE.search(labels or "")
        if route is not None and route.group(1) != "/v1/embeddings":
            continue
        lane = _LANE.search(labels or "")
        for key in (name, f"{name}@{lane.group(1)}") if lane else (name,):
            acc = out.setdefault(key, [0.0, 0.0])
            acc[0 if part == "sum" else 1] += float(value)
    return {name: (s, c) for name, (s, c) in out.items()}


def scrape(v1_url: str, api_key: str | None = None, timeout_s: float = 5.0) -> Scrape:
    """``/metrics`` next to a ``.../v1`` URL; empty when it cannot be read."""
    url = v1_url.rstrip("/").removesuffix("/v1") + "/metrics"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout_s
        ) as r:
            return parse(r.read().decode())
    except OSError:
        return {}


def mean_ms(before: Scrape, after: Scrape, lane: str | None = None) -> dict[str, float]:
    """Mean milliseconds per observation of each stage between two scrapes; with ``lane``
    ("interactive", "batch"), only the stages the ingress labels by lane, for that lane."""
    out = {}
    for stage, name in STAGES.items():
        key = name if lane is None else f"{name}@{lane}"
        s0, c0 = before.get(key, (0.0, 0.0))
        s1, c1 = after.get(key, (0.0, 0.0))
        if c1 > c0:
            out[stage] = (s1 - s0) / (c1 - c0) * 1000
    return out
