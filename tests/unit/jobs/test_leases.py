"""Leases: a chunk is one claimer's until its lease expires; then anyone's; each line once."""

from __future__ import annotations

import threading

import pytest

from mesh.jobs import BatchStatus, JobStore, LeaseLost, LineResult
from tests.unit.jobs.conftest import FakeClock, Target, output_lines, results_for, start_batch


def test_claims_hand_out_each_chunk_once_in_order(store: JobStore) -> None:
    start_batch(store, 5, chunk_lines=2)
    leases = [store.claim_chunk(f"w{n}") for n in range(4)]
    assert [lease.chunk_no for lease in leases[:3]] == [0, 1, 2]  # type: ignore[union-attr]
    assert [lease.span.first_line for lease in leases[:3]] == [0, 2, 4]  # type: ignore[union-attr]
    assert leases[3] is None


def test_an_older_batch_is_served_before_a_newer_one(store: JobStore, clock: FakeClock) -> None:
    older = start_batch(store, 2, chunk_lines=1)
    clock.advance(1)
    start_batch(store, 2, chunk_lines=1)
    assert {store.claim_chunk("w").batch_id for _ in range(2)} == {older}  # type: ignore[union-attr]


def test_an_expired_lease_goes_to_the_next_claimer_and_the_old_owner_loses_it(
    store: JobStore, clock: FakeClock
) -> None:
    batch_id = start_batch(store, 2, chunk_lines=2)
    stale = store.claim_chunk("dead", lease_s=10)
    assert stale is not None and stale.attempt == 1
    clock.advance(9.9)
    assert store.claim_chunk("other") is None
    clock.advance(0.1)
    fresh = store.claim_chunk("other", lease_s=10)
    assert fresh is not None and (fresh.chunk_no, fresh.attempt) == (0, 2)
    with pytest.raises(LeaseLost):
        store.renew(stale)
    with pytest.raises(LeaseLost):
        store.complete_chunk(stale, results_for(store, stale))
    store.complete_chunk(fresh, results_for(store, fresh))
    batch = store.get_batch(batch_id)
    assert [o["owner"] for o in output_lines(store, batch.output_file_id)] == ["other", "other"]
    with pytest.raises(LeaseLost):
        store.complete_chunk(stale, results_for(store, stale))
    assert store.get_batch(batch_id).request_counts.completed == 2


def test_renewing_keeps_a_chunk_past_its_first_lease(store: JobStore, clock: FakeClock) -> None:
    start_batch(store, 1, chunk_lines=1)
    lease = store.claim_chunk("w", lease_s=10)
    assert lease is not None
    for _ in range(5):
        clock.advance(8)
        lease = store.renew(lease, lease_s=10)
        assert lease.expires_at == clock.now + 10
        assert store.claim_chunk("other") is None


def test_a_chunk_that_keeps_failing_counts_its_lines_failed(store: JobStore) -> None:
    batch_id = start_batch(store, 4, chunk_lines=2)
    for attempt in (1, 2, 3):
        lease = store.claim_chunk("w")
        assert lease is not None and (lease.chunk_no, lease.attempt) == (0, attempt)
        store.fail_chunk(lease, "mesh unavailable")
    lease = store.claim_chunk("w")
    assert lease is not None and lease.chunk_no == 1
    store.complete_chunk(lease, results_for(store, lease))
    batch = store.get_batch(batch_id)
    assert batch.status == BatchStatus.COMPLETED
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 2)
    assert [(e.code, e.line) for e in batch.errors] == [("chunk_failed", 0)]
    assert "mesh unavailable" in batch.errors[0].message


def test_a_chunk_commits_only_with_one_result_per_line(store: JobStore) -> None:
    start_batch(store, 3, chunk_lines=3)
    lease = store.claim_chunk("w")
    assert lease is not None
    full = results_for(store, lease)
    with pytest.raises(ValueError):
        store.complete_chunk(lease, full[:2])
    with pytest.raises(ValueError):
        store.complete_chunk(lease, [*full, full[0]])
    with pytest.raises(ValueError):
        store.complete_chunk(lease, [*full[:2], LineResult(2, "req-2")])
    store.complete_chunk(lease, full)


def test_concurrent_claimers_never_get_the_same_chunk(target: Target) -> None:
    chunks = 60
    setup = target.open()
    start_batch(setup, chunks, chunk_lines=1)
    claimed: list[tuple[str, int]] = []
    guard = threading.Lock()

    def claimer(name: str) -> None:
        store = target.open()
        while (lease := store.claim_chunk(name)) is not None:
            with guard:
                claimed.append((lease.batch_id, lease.chunk_no))
        store.close()

    threads = [threading.Thread(target=claimer, args=(f"t{n}",)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(claimed) == chunks
    assert len(set(claimed)) == chunks
    setup.close()


def test_a_restarted_owner_frees_what_its_killed_predecessor_held(store: JobStore) -> None:
    start_batch(store, 6, chunk_lines=2)
    held = [store.claim_chunk("host-a/0", lease_s=600) for _ in range(2)]
    store.claim_chunk("host-b/0", lease_s=600)
    assert store.release_owner("host-a/0") == 2
    resumed = [store.claim_chunk("host-a/0") for _ in range(2)]
    assert [(r.chunk_no, r.attempt) for r in resumed] == [(0, 2), (1, 2)]  # type: ignore[union-attr]
    assert store.claim_chunk("host-c/0") is None
    for stale in held:
        with pytest.raises(LeaseLost):
            store.renew(stale)  # type: ignore[arg-type]
