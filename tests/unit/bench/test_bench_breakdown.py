"""Per-stage mean times from two scrapes of the ingress's /metrics."""

from __future__ import annotations

import pytest

from bench.breakdown import mean_ms, parse

BEFORE = """
# HELP embedmesh_ingress_request_duration_seconds Time to answer an HTTP request.
embedmesh_ingress_request_duration_seconds_bucket{le="0.01",route="/v1/embeddings"} 1.0
embedmesh_ingress_request_duration_seconds_sum{route="/v1/embeddings"} 1.0
embedmesh_ingress_request_duration_seconds_count{route="/v1/embeddings"} 10.0
embedmesh_ingress_request_duration_seconds_sum{route="/metrics"} 0.5
embedmesh_ingress_request_duration_seconds_count{route="/metrics"} 3.0
embedmesh_ingress_mesh_duration_seconds_sum{lane="0",model="m"} 0.6
embedmesh_ingress_mesh_duration_seconds_count{lane="0",model="m"} 8.0
embedmesh_ingress_mesh_duration_seconds_sum{lane="1",model="m"} 0.2
embedmesh_ingress_mesh_duration_seconds_count{lane="1",model="m"} 2.0
embedmesh_ingress_tokenize_duration_seconds_sum 0.01
embedmesh_ingress_tokenize_duration_seconds_count 10.0
"""

AFTER = (
    BEFORE.replace(
        'seconds_sum{route="/v1/embeddings"} 1.0', 'seconds_sum{route="/v1/embeddings"} 2.5'
    )
    .replace(
        'seconds_count{route="/v1/embeddings"} 10.0', 'seconds_count{route="/v1/embeddings"} 110.0'
    )
    .replace('seconds_count{route="/metrics"} 3.0', 'seconds_count{route="/metrics"} 4.0')
)


def test_parse_sums_label_sets_and_keeps_only_the_embeddings_route() -> None:
    scrape = parse(BEFORE)
    assert scrape["embedmesh_ingress_request_duration_seconds"] == (1.0, 10.0)
    assert scrape["embedmesh_ingress_mesh_duration_seconds"] == pytest.approx((0.8, 10.0))
    assert scrape["embedmesh_ingress_tokenize_duration_seconds"] == (0.01, 10.0)


def test_mean_ms_is_the_difference_of_sums_over_the_difference_of_counts() -> None:
    stages = mean_ms(parse(BEFORE), parse(AFTER))
    assert stages == {"http": pytest.approx(15.0)}  # 1.5 s over 100 requests; others idle


def test_no_metrics_gives_no_stages() -> None:
    assert mean_ms({}, {}) == {}


def test_a_lane_gets_the_means_of_its_own_traffic_only() -> None:
    before = parse(
        'embedmesh_ingress_queue_duration_seconds_sum{lane="batch",model="m"} 10.0\n'
        'embedmesh_ingress_queue_duration_seconds_count{lane="batch",model="m"} 10.0\n'
        'embedmesh_ingress_queue_duration_seconds_sum{lane="interactive",model="m"} 0.0\n'
        'embedmesh_ingress_queue_duration_seconds_count{lane="interactive",model="m"} 0.0\n'
        "embedmesh_ingress_tokenize_duration_seconds_sum 0.0\n"
        "embedmesh_ingress_tokenize_duration_seconds_count 0.0\n"
    )
    after = dict(before)
    after["embedmesh_ingress_queue_duration_seconds@batch"] = (30.0, 20.0)  # +20 s over +10
    after["embedmesh_ingress_queue_duration_seconds@interactive"] = (0.1, 10.0)  # +0.1 s over +10
    after["embedmesh_ingress_tokenize_duration_seconds"] = (0.2, 20.0)
    assert mean_ms(before, after, "batch") == {"queue": pytest.approx(2000.0)}
    assert mean_ms(before, after, "interactive") == {"queue": pytest.approx(10.0)}
    assert mean_ms(before, after)["tokenize"] == pytest.approx(10.0)  # no lane: every stage


def test_parse_sums_a_lane_labelled_histogram_both_per_lane_and_over_lanes() -> None:
    scrape = parse(
        'embedmesh_ingress_mesh_duration_seconds_sum{lane="batch",model="m"} 3.0\n'
        'embedmesh_ingress_mesh_duration_seconds_sum{lane="interactive",model="m"} 1.0\n'
        'embedmesh_ingress_mesh_duration_seconds_count{lane="batch",model="m"} 3.0\n'
        'embedmesh_ingress_mesh_duration_seconds_count{lane="interactive",model="m"} 2.0\n'
    )
    assert scrape["embedmesh_ingress_mesh_duration_seconds"] == (4.0, 5.0)
    assert scrape["embedmesh_ingress_mesh_duration_seconds@interactive"] == (1.0, 2.0)
