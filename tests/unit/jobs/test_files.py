"""Files: upload, read back, list newest first with paging, delete, size limit, retention."""

from __future__ import annotations

import io

import pytest

from mesh.jobs import Conflict, JobStore, NotFound, TooLarge
from tests.unit.jobs.conftest import FakeClock, jsonl, results_for, start_batch


def test_an_uploaded_file_reads_back_byte_for_byte(store: JobStore, clock: FakeClock) -> None:
    data = jsonl(5)
    made = store.create_file(io.BytesIO(data), filename="in.jsonl", purpose="batch")
    assert made.id.startswith("file-")
    assert (made.bytes, made.filename, made.purpose) == (len(data), "in.jsonl", "batch")
    assert made.created_at == int(clock.now)
    assert made.expires_at is None
    assert store.get_file(made.id) == made
    with store.open_file(made.id) as src:
        assert src.read() == data
    shape = made.to_openai()
    assert shape["object"] == "file" and shape["status"] == "processed"


def test_files_list_newest_first_and_page_with_after(store: JobStore, clock: FakeClock) -> None:
    ids = []
    for n in range(5):
        ids.append(store.create_file(b"{}\n", filename=f"f{n}", purpose="batch").id)
        clock.advance(1)
    first = store.list_files(limit=2)
    assert [f.id for f in first.data] == ids[::-1][:2] and first.has_more
    second = store.list_files(limit=2, after=first.data[-1].id)
    assert [f.id for f in second.data] == ids[::-1][2:4] and second.has_more
    last = store.list_files(limit=2, after=second.data[-1].id)
    assert [f.id for f in last.data] == ids[:1] and not last.has_more
    shape = second.to_openai()
    assert shape["object"] == "list" and shape["has_more"] is True
    assert (shape["first_id"], shape["last_id"]) == (ids[2], ids[1])
    assert [f["id"] for f in shape["data"]] == [ids[2], ids[1]]


def test_files_list_filters_by_purpose(store: JobStore) -> None:
    upload = store.create_file(b"{}\n", filename="a", purpose="batch")
    assert [f.id for f in store.list_files(purpose="batch").data] == [upload.id]
    assert store.list_files(purpose="batch_output").data == []


def test_list_refuses_a_limit_out_of_range_and_an_unknown_cursor(store: JobStore) -> None:
    with pytest.raises(ValueError):
        store.list_files(limit=0)
    with pytest.raises(ValueError):
        store.list_files(limit=101)
    with pytest.raises(NotFound):
        store.list_files(after="file-nope")


def test_a_deleted_file_is_gone_with_its_blob(store: JobStore) -> None:
    made = store.create_file(b"{}\n", filename="a", purpose="batch")
    blob = store.blobs.path(f"files/{made.id}")  # type: ignore[attr-defined]
    assert blob.exists()
    store.delete_file(made.id)
    assert not blob.exists()
    with pytest.raises(NotFound):
        store.get_file(made.id)
    with pytest.raises(NotFound):
        store.delete_file(made.id)


def test_a_file_over_the_limit_is_refused_and_leaves_nothing(store: JobStore) -> None:
    with pytest.raises(TooLarge):
        store.create_file(io.BytesIO(b"x" * 5000), filename="big", purpose="batch", max_bytes=4096)
    with pytest.raises(TooLarge):
        store.create_file(b"x" * 5000, filename="big", purpose="batch", max_bytes=4096)
    assert store.list_files().data == []
    leftovers = [p for p in store.blobs.root.rglob("*") if p.is_file()]  # type: ignore[attr-defined]
    assert leftovers == []


def test_the_input_of_a_running_batch_cannot_be_deleted(store: JobStore) -> None:
    batch_id = start_batch(store, 4, chunk_lines=2)
    input_id = store.get_batch(batch_id).input_file_id
    with pytest.raises(Conflict):
        store.delete_file(input_id)
    store.cancel_batch(batch_id)
    store.delete_file(input_id)


def test_output_files_are_purged_after_the_retention_and_inputs_stay(
    store: JobStore, clock: FakeClock
) -> None:
    batch_id = start_batch(store, 3, chunk_lines=3)
    lease = store.claim_chunk("w")
    assert lease is not None
    store.complete_chunk(lease, results_for(store, lease))
    batch = store.get_batch(batch_id)
    output = store.get_file(batch.output_file_id)  # type: ignore[arg-type]
    assert output.purpose == "batch_output"
    assert output.expires_at == output.created_at + 30 * 24 * 3600
    clock.advance(30 * 24 * 3600 - 1)
    assert store.purge() == []
    clock.advance(1)
    assert store.purge() == [output.id]
    with pytest.raises(NotFound):
        store.get_file(output.id)
    assert store.get_file(batch.input_file_id).purpose == "batch"


def test_stored_bytes_count_every_file_until_it_is_deleted(store: JobStore) -> None:
    assert store.stored_bytes() == 0
    first = store.create_file(b"x" * 100, filename="a", purpose="batch")
    store.create_file(b"y" * 50, filename="b", purpose="batch")
    assert store.stored_bytes() == 150
    store.delete_file(first.id)
    assert store.stored_bytes() == 50
