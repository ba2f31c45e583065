from __future__ import annotations

from bench.pin import parse_cpus


def test_cpu_lists_and_ranges_parse_as_taskset_takes_them():
    assert parse_cpus("0,1") == {0, 1}
    assert parse_cpus("2-5") == {2, 3, 4, 5}
    assert parse_cpus("0,4-5,7") == {0, 4, 5, 7}
