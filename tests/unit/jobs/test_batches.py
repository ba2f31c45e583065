"""Batches: OpenAI's states from validating to an end, paging, cancel, expiry, output order."""

from __future__ import annotations

import pytest

from mesh.jobs import BatchError, BatchStatus, Conflict, JobStore, LeaseLost, NotFound
from tests.unit.jobs.conftest import (
    FakeClock,
    Target,
    jsonl,
    output_lines,
    results_for,
    start_batch,
)


def test_a_batch_runs_from_validating_to_completed_with_counts_that_move(
    store: JobStore, clock: FakeClock
) -> None:
    upload = store.create_file(jsonl(5), filename="in.jsonl", purpose="batch")
    batch = store.create_batch(
        input_file_id=upload.id, endpoint="/v1/embeddings", metadata={"job": "nightly"}
    )
    assert batch.id.startswith("batch_") and batch.status == BatchStatus.VALIDATING
    assert batch.expires_at == batch.created_at + 24 * 3600
    clock.advance(1)
    started = store.start_batch(batch.id, store.plan_chunks(upload.id, 2), tokens_total=10)
    assert started.status == BatchStatus.IN_PROGRESS
    assert started.in_progress_at == int(clock.now)
    assert (started.request_counts.total, started.tokens_total) == (5, 10)
    lease = store.claim_chunk("w")
    assert lease is not None
    store.complete_chunk(lease, results_for(store, lease, fail={1}))
    moving = store.get_batch(batch.id)
    assert (moving.request_counts.completed, moving.request_counts.failed) == (1, 1)
    assert moving.tokens_done == 2 and moving.status == BatchStatus.IN_PROGRESS
    while (lease := store.claim_chunk("w")) is not None:
        store.complete_chunk(lease, results_for(store, lease, fail={1}))
    done = store.get_batch(batch.id)
    assert done.status == BatchStatus.COMPLETED
    assert done.finalizing_at is not None and done.completed_at is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 1)
    assert done.metadata == {"job": "nightly"}
    output = output_lines(store, done.output_file_id)
    assert [o["custom_id"] for o in output] == ["req-0", "req-2", "req-3", "req-4"]
    assert [e["custom_id"] for e in output_lines(store, done.error_file_id)] == ["req-1"]
    shape = done.to_openai()
    assert shape["object"] == "batch" and shape["status"] == "completed"
    assert shape["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
    assert shape["errors"] is None and shape["tokens_done"] == 8


def test_a_batch_without_failures_has_no_error_file(store: JobStore) -> None:
    batch_id = start_batch(store, 3, chunk_lines=2)
    while (lease := store.claim_chunk("w")) is not None:
        store.complete_chunk(lease, results_for(store, lease))
    batch = store.get_batch(batch_id)
    assert batch.error_file_id is None
    assert len(output_lines(store, batch.output_file_id)) == 3


def test_validation_that_fails_ends_the_batch_failed_with_openai_errors(store: JobStore) -> None:
    upload = store.create_file(b"not json\n", filename="bad.jsonl", purpose="batch")
    batch = store.create_batch(input_file_id=upload.id, endpoint="/v1/embeddings")
    failed = store.fail_batch(batch.id, [BatchError("invalid_json_line", "not JSON", line=1)])
    assert failed.status == BatchStatus.FAILED and failed.failed_at is not None
    assert failed.to_openai()["errors"] == {
        "object": "list",
        "data": [{"code": "invalid_json_line", "message": "not JSON", "param": None, "line": 1}],
    }
    with pytest.raises(Conflict):
        store.start_batch(batch.id, [])


def test_a_batch_needs_an_existing_input_file_of_purpose_batch(store: JobStore) -> None:
    with pytest.raises(NotFound):
        store.create_batch(input_file_id="file-missing", endpoint="/v1/embeddings")
    batch_id = start_batch(store, 1, chunk_lines=1)
    lease = store.claim_chunk("w")
    assert lease is not None
    store.complete_chunk(lease, results_for(store, lease))
    output_id = store.get_batch(batch_id).output_file_id
    with pytest.raises(Conflict):
        store.create_batch(input_file_id=output_id, endpoint="/v1/embeddings")  # type: ignore[arg-type]
    upload = store.create_file(b"{}\n", filename="in.jsonl", purpose="batch")
    with pytest.raises(ValueError):
        store.create_batch(
            input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="soon"
        )


def test_batches_list_newest_first_and_page_with_after(store: JobStore, clock: FakeClock) -> None:
    ids = []
    for _ in range(5):
        ids.append(start_batch(store, 1, chunk_lines=1))
        clock.advance(1)
    first = store.list_batches(limit=3)
    assert [b.id for b in first.data] == ids[::-1][:3] and first.has_more
    rest = store.list_batches(limit=3, after=first.data[-1].id)
    assert [b.id for b in rest.data] == ids[::-1][3:] and not rest.has_more
    with pytest.raises(NotFound):
        store.get_batch("batch_missing")


def _validated_by_a(target, clock: FakeClock):  # noqa: ANN001, ANN202
    """Two stores on one target; a batch whose validation store ``first`` claimed as "a"."""
    first, second = target.open(clock=clock), target.open(clock=clock)
    upload = first.create_file(jsonl(2), filename="in.jsonl", purpose="batch")
    batch = first.create_batch(input_file_id=upload.id, endpoint="/v1/embeddings")
    assert first.claim_validation("a", lease_s=10).id == batch.id  # type: ignore[union-attr]
    return first, second, upload, batch


def test_a_validating_batch_is_claimed_by_one_validator_until_its_lease_expires(
    target, clock: FakeClock
) -> None:
    first, second, upload, batch = _validated_by_a(target, clock)
    assert second.claim_validation("b", lease_s=10) is None
    clock.advance(10)
    assert second.claim_validation("b", lease_s=10).id == batch.id  # type: ignore[union-attr]
    second.start_batch(batch.id, second.plan_chunks(upload.id, 1))
    assert first.claim_validation("a") is None
    first.close()
    second.close()


def test_a_validator_renews_its_lease_and_loses_it_to_a_takeover_or_a_cancel(
    target, clock: FakeClock
) -> None:
    first, second, upload, batch = _validated_by_a(target, clock)
    for _ in range(3):  # 24 s of a large file's validation, renewed every 8 s: still its own
        clock.advance(8)
        first.renew_validation(batch.id, "a", lease_s=10)
        assert second.claim_validation("b", lease_s=10) is None
    with pytest.raises(LeaseLost):
        second.renew_validation(batch.id, "b")  # never its own
    clock.advance(10)  # not renewed: the lease runs out, another validator takes it
    assert second.claim_validation("b", lease_s=10).id == batch.id  # type: ignore[union-attr]
    with pytest.raises(LeaseLost):
        first.renew_validation(batch.id, "a")
    second.cancel_batch(batch.id)
    with pytest.raises(LeaseLost):  # cancelled while it validates: it stops
        second.renew_validation(batch.id, "b")
    first.close()
    second.close()


def test_cancel_without_live_leases_ends_cancelled_at_once(store: JobStore) -> None:
    batch_id = start_batch(store, 4, chunk_lines=2)
    cancelled = store.cancel_batch(batch_id)
    assert cancelled.status == BatchStatus.CANCELLED
    assert cancelled.cancelling_at is not None and cancelled.cancelled_at is not None
    assert store.claim_chunk("w") is None
    with pytest.raises(Conflict):
        store.cancel_batch(batch_id)


def test_a_cancelled_validating_batch_never_starts(store: JobStore) -> None:
    upload = store.create_file(jsonl(2), filename="in.jsonl", purpose="batch")
    batch = store.create_batch(input_file_id=upload.id, endpoint="/v1/embeddings")
    assert store.cancel_batch(batch.id).status == BatchStatus.CANCELLED
    with pytest.raises(Conflict):
        store.start_batch(batch.id, store.plan_chunks(upload.id, 1))


def test_cancel_waits_for_live_leases_and_keeps_what_they_finish(store: JobStore) -> None:
    batch_id = start_batch(store, 6, chunk_lines=2)
    first = store.claim_chunk("w")
    second = store.claim_chunk("w")
    assert first is not None and second is not None
    assert store.cancel_batch(batch_id).status == BatchStatus.CANCELLING
    assert store.claim_chunk("w") is None
    assert store.renew(first).cancel_requested
    store.complete_chunk(first, results_for(store, first))
    assert store.get_batch(batch_id).status == BatchStatus.CANCELLING
    store.release_chunk(second)
    batch = store.get_batch(batch_id)
    assert batch.status == BatchStatus.CANCELLED
    assert [o["custom_id"] for o in output_lines(store, batch.output_file_id)] == [
        "req-0",
        "req-1",
    ]
    assert batch.request_counts.completed == 2


def test_a_cancelled_lease_that_then_expires_lets_the_batch_end(
    store: JobStore, clock: FakeClock
) -> None:
    batch_id = start_batch(store, 2, chunk_lines=2)
    assert store.claim_chunk("w", lease_s=5) is not None
    assert store.cancel_batch(batch_id).status == BatchStatus.CANCELLING
    clock.advance(5)
    assert store.finalize(batch_id).status == BatchStatus.CANCELLED


def test_a_batch_past_its_window_expires_and_keeps_what_was_done(
    store: JobStore, clock: FakeClock
) -> None:
    batch_id = start_batch(store, 6, chunk_lines=2, window="1h")
    done = store.claim_chunk("w")
    late = store.claim_chunk("w")
    assert done is not None and late is not None
    store.complete_chunk(done, results_for(store, done))
    clock.advance(3599)
    assert store.expire() == []
    assert store.renew(late).cancel_requested is False
    clock.advance(1)
    assert store.claim_chunk("w") is None
    assert store.expire() == [batch_id]
    batch = store.get_batch(batch_id)
    assert batch.status == BatchStatus.EXPIRED and batch.expired_at == int(clock.now)
    assert [o["custom_id"] for o in output_lines(store, batch.output_file_id)] == [
        "req-0",
        "req-1",
    ]
    with pytest.raises(LeaseLost):
        store.complete_chunk(late, results_for(store, late))
    assert store.unfinished_batches() == []


def test_a_batch_of_an_empty_file_completes_with_no_output(store: JobStore) -> None:
    upload = store.create_file(b"", filename="empty.jsonl", purpose="batch")
    batch = store.create_batch(input_file_id=upload.id, endpoint="/v1/embeddings")
    assert store.plan_chunks(upload.id) == []
    done = store.start_batch(batch.id, [])
    assert done.status == BatchStatus.COMPLETED
    assert (done.output_file_id, done.error_file_id, done.request_counts.total) == (None, None, 0)


@pytest.mark.parametrize("committer_finalizes", [True, False], ids=["lost", "raced"])
def test_a_chunk_committed_while_an_expired_batch_is_finalized_still_lands_once(
    target: Target,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    committer_finalizes: bool,
) -> None:
    """The committing process finalizes the batch itself (the other finalizer loses), or dies
    right after its commit (the other finalizer sees new rows and assembles again)."""
    finalizer, runner = target.open(clock=clock), target.open(clock=clock)
    batch_id = start_batch(finalizer, 4, chunk_lines=2, window="1h")
    first, second = runner.claim_chunk("w"), runner.claim_chunk("w")
    assert first is not None and second is not None
    runner.complete_chunk(first, results_for(runner, first))
    clock.advance(3600)
    if not committer_finalizes:
        monkeypatch.setattr(runner, "finalize", lambda batch: None)
    assemble = finalizer._assemble  # type: ignore[attr-defined]
    assembled: list[str] = []

    def assemble_then_race(batch: str):  # another process commits between read and seal
        made = assemble(batch)
        if not assembled:
            runner.complete_chunk(second, results_for(runner, second))
        assembled.append(batch)
        return made

    monkeypatch.setattr(finalizer, "_assemble", assemble_then_race)
    batch = finalizer.finalize(batch_id)
    assert len(assembled) == (1 if committer_finalizes else 2)
    assert batch.status == BatchStatus.EXPIRED
    lines = output_lines(finalizer, batch.output_file_id)
    assert [line["custom_id"] for line in lines] == [f"req-{n}" for n in range(4)]
    outputs = finalizer.list_files(purpose="batch_output").data
    assert [f.id for f in outputs] == [batch.output_file_id]
    on_disk = {p.name for p in (finalizer.blobs.root / "files").iterdir()}  # type: ignore[attr-defined]
    assert on_disk == {batch.output_file_id, batch.input_file_id}
    assert not (finalizer.blobs.root / "parts" / batch_id).exists()  # type: ignore[attr-defined]
    finalizer.close()
    runner.close()


def test_rate_and_eta_follow_the_tokens_done(store: JobStore, clock: FakeClock) -> None:
    batch_id = start_batch(store, 10, chunk_lines=2)  # 2 tokens a line: 20 in all
    assert store.get_batch(batch_id).rate_and_eta(clock.now) == (0.0, None)
    lease = store.claim_chunk("w")
    assert lease is not None
    clock.advance(10)
    store.complete_chunk(lease, results_for(store, lease))
    rate, eta = store.get_batch(batch_id).rate_and_eta(clock.now)
    assert rate == pytest.approx(0.4) and eta == pytest.approx(40.0)
