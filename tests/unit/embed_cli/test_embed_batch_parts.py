"""mesh-embed --batch's parts without a server: request files split at their limits, result
lines put back on their rows in any order, failed rows reported, the output written in order."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import orjson
import pytest

from mesh.embed_cli.batch_requests import custom_id, request_body, rows_of, write_request_files
from mesh.embed_cli.batch_results import Ingest, Scratch, emit_span, failure_of, failures_by_row
from mesh.embed_cli.batch_run import BatchRunner, Part, prepare_batch
from mesh.embed_cli.errors import InputError, ServerRefused
from mesh.embed_cli.pipeline import Job
from mesh.embed_cli.sinks import JsonlSink, NpySink

DIMS = 4


def lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_request_files_hold_one_request_a_row_keyed_by_row_number(tmp_path: Path) -> None:
    body = request_body("m", "base64", 8)
    rows = enumerate(["a", "b", "c", "d", "e"], 10)
    files = list(write_request_files(rows, tmp_path, body, max_rows=2, first_index=3))
    assert [(f.index, f.start, f.end) for f in files] == [(3, 10, 12), (4, 12, 14), (5, 14, 15)]
    first = lines(files[0].path)
    assert first[0] == {"custom_id": "10", "method": "POST", "url": "/v1/embeddings",
                        "body": {"model": "m", "encoding_format": "base64", "dimensions": 8,
                                 "input": "a"}}  # fmt: skip
    assert [line["custom_id"] for f in files for line in lines(f.path)] == [
        str(n) for n in range(10, 15)
    ]
    assert all(f.bytes == f.path.stat().st_size for f in files)


def test_rows_are_grouped_into_requests_of_batch_size_texts(tmp_path: Path) -> None:
    body = request_body("m", "float", None)
    rows = enumerate([f"t{i}" for i in range(7)])
    files = list(write_request_files(rows, tmp_path, body, max_rows=6, texts_per_line=3))
    assert [(f.start, f.end) for f in files] == [(0, 6), (6, 7)]
    first, last = lines(files[0].path), lines(files[1].path)
    assert [line["custom_id"] for line in first + last] == ["0-3", "3-6", "6"]
    assert first[1]["body"]["input"] == ["t3", "t4", "t5"]
    assert last[0]["body"]["input"] == "t6"


@pytest.mark.parametrize("custom", ["0-3", "7", "12-14"])
def test_each_custom_id_names_its_rows_back(custom: str) -> None:
    rows = rows_of(custom)
    assert custom_id(rows.start, len(rows)) == custom


@pytest.mark.parametrize("custom", ["x", "3-3", "5-2", "-1", "0-1", "03", None, 4])
def test_a_custom_id_of_another_shape_is_refused(custom: object) -> None:
    with pytest.raises(ValueError):
        rows_of(custom)


def test_a_request_file_closes_before_it_would_pass_its_byte_limit(tmp_path: Path) -> None:
    body = request_body("m", "float", None)
    texts = ["x" * 50] * 10
    files = list(write_request_files(enumerate(texts), tmp_path, body, max_bytes=400))
    assert len(files) > 1
    assert all(f.bytes <= 400 for f in files)
    assert sum(f.end - f.start for f in files) == 10


def test_a_row_whose_request_alone_is_over_the_byte_limit_is_an_input_error(
    tmp_path: Path,
) -> None:
    rows = enumerate(["short", "y" * 1000])
    with pytest.raises(InputError, match="rows 2-2"):
        list(write_request_files(rows, tmp_path, request_body("m", "float", None), max_bytes=300))


def success(row: int, vector: np.ndarray, as_base64: bool = True) -> dict[str, object]:
    embedding = base64.b64encode(vector.astype("<f4").tobytes()).decode() if as_base64 else vector.tolist()  # fmt: skip
    body = {"data": [{"index": 0, "embedding": embedding}], "usage": {"prompt_tokens": 3}}
    return {"id": "r", "custom_id": str(row), "error": None,
            "response": {"status_code": 200, "body": body}}  # fmt: skip


def failure(row: int) -> dict[str, object]:
    body = {"error": {"message": f"row {row} too long"}}
    return {"id": "r", "custom_id": str(row), "error": None,
            "response": {"status_code": 400, "body": body}}  # fmt: skip


def write_lines(path: Path, docs: list[dict[str, object]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    return path


def vector(row: int) -> np.ndarray:
    return np.arange(DIMS, dtype=np.float32) + row


def ingest_into(tmp_path: Path, docs: list[dict[str, object]], span: tuple[int, int]) -> tuple[Ingest, Scratch, io.BytesIO]:  # fmt: skip
    scratch = Scratch(tmp_path, span[1], DIMS)
    failed = io.BytesIO()
    ingest = Ingest(lambda dims: scratch, span, failed)
    ingest.file(write_lines(tmp_path / "out.jsonl", docs))
    return ingest, scratch, failed


def test_result_lines_in_any_order_land_on_their_rows(tmp_path: Path) -> None:
    docs = [success(r, vector(r), as_base64=r % 2 == 0) for r in (5, 2, 4, 3)]
    ingest, scratch, _ = ingest_into(tmp_path, [*docs, success(4, vector(99))], (2, 6))
    vectors, arrived = scratch.read(2, 4)
    assert arrived.all()
    assert np.array_equal(vectors, np.stack([vector(r) for r in range(2, 6)]))
    assert (ingest.tokens, ingest.duplicates) == (12, 1)  # the second row 4 is dropped


def test_a_line_of_several_rows_lands_each_vector_by_its_index(tmp_path: Path) -> None:
    data = [{"index": i, "embedding": vector(4 + i).tolist()} for i in (2, 0, 1)]
    body = {"data": data, "usage": {"prompt_tokens": 9}}
    doc = {"custom_id": "4-7", "error": None, "response": {"status_code": 200, "body": body}}
    ingest, scratch, _ = ingest_into(tmp_path, [doc], (4, 7))
    vectors, arrived = scratch.read(4, 3)
    assert arrived.all() and ingest.tokens == 9
    assert np.array_equal(vectors, np.stack([vector(r) for r in (4, 5, 6)]))


def test_a_failed_line_of_several_rows_fails_each_of_them(tmp_path: Path) -> None:
    doc = {**failure(0), "custom_id": "0-2"}
    _, _, failed = ingest_into(tmp_path, [doc], (0, 2))
    assert [orjson.loads(line)["row"] for line in failed.getvalue().splitlines()] == [0, 1]


def test_failed_lines_are_recorded_and_their_rows_stay_empty(tmp_path: Path) -> None:
    _, scratch, failed = ingest_into(tmp_path, [success(0, vector(0)), failure(1)], (0, 3))
    _, arrived = scratch.read(0, 3)
    assert arrived.tolist() == [True, False, False]
    recorded = [orjson.loads(line) for line in failed.getvalue().splitlines()]
    assert recorded == [{"row": 1, "error": "HTTP 400: row 1 too long"}]


@pytest.mark.parametrize("custom_id", ["7", "x", None])
def test_a_custom_id_outside_the_batch_is_refused(tmp_path: Path, custom_id: object) -> None:
    doc = {**success(0, vector(0)), "custom_id": custom_id}
    with pytest.raises(ServerRefused, match="custom_id"):
        ingest_into(tmp_path, [doc], (0, 3))


def test_a_line_failure_reads_openai_s_error_field_too() -> None:
    line = {"custom_id": "1", "response": None, "error": {"code": "x", "message": "expired"}}
    assert failure_of(line) == "expired"
    assert failure_of(success(0, vector(0))) is None


def test_emitting_keeps_failed_rows_as_nan_in_npy_and_leaves_them_out_elsewhere(
    tmp_path: Path,
) -> None:
    _, scratch, failed = ingest_into(tmp_path, [success(0, vector(0)), failure(1),
                                                success(3, vector(3))], (0, 4))  # fmt: skip
    failures_file = tmp_path / "failures.jsonl"
    failures_file.write_bytes(failed.getvalue())
    reasons = failures_by_row(failures_file)
    npy, jsonl = NpySink(tmp_path / "o.npy", 4), JsonlSink(tmp_path / "o.jsonl", 4)
    for sink in (npy, jsonl):
        errors = io.BytesIO()
        ids = iter(["a", "b", "c", "d"])
        assert emit_span(scratch, DIMS, (0, 4), reasons, ids, sink, errors) == 2
        sink.finish(DIMS)
        listed = [orjson.loads(line) for line in errors.getvalue().splitlines()]
        assert [(e["row"], e["id"]) for e in listed] == [(1, "b"), (2, "c")]
        assert listed[0]["error"] == "HTTP 400: row 1 too long"
        assert "no result" in listed[1]["error"]
    matrix = np.load(tmp_path / "o.npy")
    assert np.isnan(matrix[[1, 2]]).all()
    assert np.array_equal(matrix[[0, 3]], np.stack([vector(0), vector(3)]))
    assert [d["id"] for d in lines(tmp_path / "o.jsonl")] == ["a", "d"]


class CountsApi:
    """A server whose batch has answered ``lines`` request lines so far."""

    def __init__(self, lines: int) -> None:
        self.lines = lines

    async def retrieve(self, batch_id: str) -> dict[str, object]:
        counts = {"total": 3, "completed": self.lines, "failed": 0}
        return {"id": batch_id, "status": "in_progress", "request_counts": counts,
                "tokens_per_second": 100.0, "eta_seconds": 2.0}  # fmt: skip


async def test_the_bar_counts_rows_from_request_counts_of_lines(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"text": f"t{i}"}) + b"\n" for i in range(10)))
    job = Job(source, tmp_path / "out.npy", "http://127.0.0.1:9/v1", "m", batch=True,
              show_progress=False)  # fmt: skip
    runner = BatchRunner(job, *prepare_batch(job))
    part = Part(0, 0, 10, batch_id="b", per_line=4)  # lines of 4, 4 and 2 rows
    for lines, rows in ((0, 0), (2, 8), (3, 10)):
        await runner._poll(CountsApi(lines), part)  # type: ignore[arg-type]
        assert part.done == rows
    assert not part.collected


def test_a_batch_collected_again_rewrites_its_rows(tmp_path: Path) -> None:
    _, scratch, _ = ingest_into(tmp_path, [success(0, vector(7)), success(1, vector(1))], (0, 2))
    scratch.forget(0, 1)
    failed = io.BytesIO()
    again = Ingest(lambda dims: scratch, (0, 2), failed)
    again.file(write_lines(tmp_path / "again.jsonl", [success(0, vector(0))]))
    vectors, arrived = scratch.read(0, 2)
    assert arrived.all() and again.duplicates == 0
    assert np.array_equal(vectors, np.stack([vector(0), vector(1)]))
