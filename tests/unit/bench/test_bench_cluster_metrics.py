"""bench/cluster_metrics.py: /metrics read defensively: every embedmesh series by kind and
role, the headline figures picked by name and label, whatever series exist."""

from __future__ import annotations

import itertools

from bench import cluster_metrics
from bench.cluster_metrics import Watch, parse

TEXT = """# HELP embedmesh_broker_queued_tokens Tokens waiting.
# TYPE embedmesh_broker_queued_tokens gauge
embedmesh_broker_queued_tokens{{broker="tcp://b:5555",lane="batch",model="m"}} {queued}
# HELP embedmesh_worker_batch_fill Share of the token budget a batch used.
# TYPE embedmesh_worker_batch_fill gauge
embedmesh_worker_batch_fill{{worker="w1"}} {fill}
# HELP embedmesh_worker_batches_total Batches done.
# TYPE embedmesh_worker_batches_total counter
embedmesh_worker_batches_total{{worker="w1"}} {batches}
embedmesh_worker_batches_created{{worker="w1"}} 1.7e9
# HELP embedmesh_ingress_mesh_duration_seconds Mesh time.
# TYPE embedmesh_ingress_mesh_duration_seconds histogram
embedmesh_ingress_mesh_duration_seconds_bucket{{le="+Inf",lane="batch"}} {count}
embedmesh_ingress_mesh_duration_seconds_count{{lane="batch"}} {count}
embedmesh_ingress_mesh_duration_seconds_sum{{lane="batch"}} {total}
# HELP process_cpu_seconds_total CPU.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.0
"""


def _text(queued: float, fill: float, batches: float, count: float, total: float) -> str:
    return TEXT.format(queued=queued, fill=fill, batches=batches, count=count, total=total)


def test_series_are_kept_by_kind_and_other_prefixes_ignored() -> None:
    s = parse(_text(30, 0.5, 4, 2, 0.1), at=1.0)
    assert s.gauges == {
        'embedmesh_broker_queued_tokens{broker="tcp://b:5555",lane="batch",model="m"}': 30.0,
        'embedmesh_worker_batch_fill{worker="w1"}': 0.5,
    }
    assert s.counters == {'embedmesh_worker_batches_total{worker="w1"}': 4.0}
    assert s.histograms == {'embedmesh_ingress_mesh_duration_seconds{lane="batch"}': (0.1, 2.0)}


def test_figures_summarize_the_window_per_role() -> None:
    scrapes = [
        parse(_text(10, 0.5, 4, 2, 0.1), at=0.0),
        parse(_text(30, 0.7, 14, 4, 0.5), at=2.0),
        parse(_text(20, 0.9, 24, 6, 0.9), at=4.0),
    ]
    out = cluster_metrics.figures(scrapes)
    assert set(out["roles"]) == {"broker", "worker", "ingress"}
    (queue,) = out["queue_depth"].values()
    assert queue == {"mean": 20.0, "max": 30.0, "last": 20.0}
    assert list(out["queue_depth"])[0].count('lane="batch"') == 1
    assert abs(out["batch_fill"]['embedmesh_worker_batch_fill{worker="w1"}']["mean"] - 0.7) < 1e-9
    assert out["per_worker"]['embedmesh_worker_batches_total{worker="w1"}'] == {"per_s": 5.0}
    mesh = out["roles"]["ingress"]['embedmesh_ingress_mesh_duration_seconds{lane="batch"}']
    assert mesh["count"] == 4.0 and abs(mesh["mean"] - 0.2) < 1e-9


def test_no_scrape_gives_empty_figures_and_a_failed_read_is_counted() -> None:
    assert cluster_metrics.figures([])["queue_depth"] == {}
    texts = itertools.chain(
        [_text(1, 0.1, 1, 1, 0.1), None], itertools.repeat(_text(3, 0.1, 3, 2, 0.2))
    )
    watch = Watch(lambda: next(texts), every_s=60)
    watch.start()
    watch.stop()
    figures = watch.figures()
    assert figures["scrapes"] == 1 and figures["failed"] == 1
    watch.stop()
    assert watch.figures()["scrapes"] == 2


FILL = """# TYPE embedmesh_broker_batch_tokens_total counter
embedmesh_broker_batch_tokens_total{{broker="b",model="m"}} {used}
# TYPE embedmesh_broker_batch_budget_tokens_total counter
embedmesh_broker_batch_budget_tokens_total{{broker="b",model="m"}} {budget}
"""


def test_batch_fill_is_derived_from_tokens_over_budgets_where_both_are_counted() -> None:
    scrapes = [
        parse(FILL.format(used=100, budget=400), 0.0),
        parse(FILL.format(used=400, budget=800), 1.0),
    ]
    fill = cluster_metrics.figures(scrapes)["batch_fill"]
    assert fill == {'embedmesh_broker_batch_fill{broker="b",model="m"}': {"mean": 0.75}}
