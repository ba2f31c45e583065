"""The batch API's pure parts: validating an input file's lines, the token estimate, the
retention flag's durations and the lease owner id an ingress takes."""

from __future__ import annotations

import json
from types import SimpleNamespace

import click
import pytest

from launch.ingress_role import duration_s, jobs_config
from launch.options import IngressArgs
from mesh.errors import Unavailable, WorkerFailed
from mesh.ingress import batch_lines
from mesh.ingress.batch_lines import (
    LINE_RETRIES,
    MAX_ERRORS,
    ChunkFailed,
    estimate_tokens,
    run_line,
    validate,
)
from mesh.ingress.batch_runner import CHUNK_INPUTS, CHUNK_LINES, MIN_CHUNK_LINES, chunk_lines


def line(custom_id: str = "a", url: str = "/v1/embeddings", **extra: object) -> bytes:
    doc = {"custom_id": custom_id, "method": "POST", "url": url,
           "body": {"model": "m", "input": "x" * 40}, **extra}  # fmt: skip
    return json.dumps(doc).encode() + b"\n"


def test_a_valid_file_has_no_errors_and_an_estimate_of_its_tokens() -> None:
    errors, tokens, inputs = validate(iter([line("a"), line("b")]), "/v1/embeddings")
    assert errors == [] and tokens == 2 * (40 // 4 + 2) and inputs == 2


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b"not json\n", "invalid_json_line", None),
        (b"[1, 2]\n", "invalid_json_line", None),
        (b"\n", "invalid_json_line", None),
        (line(custom_id=""), "missing_required_parameter", "custom_id"),
        (line(method="GET"), "invalid_method", "method"),
        (line(url="/v1/chat/completions"), "mismatched_endpoint", "url"),
    ],
)
def test_a_bad_line_is_an_error_naming_its_line(raw: bytes, code: str, param: str | None) -> None:
    errors, _, _ = validate(iter([line("first"), raw]), "/v1/embeddings")
    assert [(e.code, e.line, e.param) for e in errors] == [(code, 2, param)]


def test_a_repeated_custom_id_fails_and_an_empty_file_fails() -> None:
    errors, _, _ = validate(iter([line("a"), line("b"), line("a")]), "/v1/embeddings")
    assert [(e.code, e.line) for e in errors] == [("duplicate_custom_id", 3)]
    errors, _, _ = validate(iter([]), "/v1/embeddings")
    assert [e.code for e in errors] == ["empty_file"]


def test_errors_are_capped_but_every_line_is_read() -> None:
    errors, _, _ = validate(iter([b"bad\n"] * (MAX_ERRORS + 5)), "/v1/embeddings")
    assert len(errors) == MAX_ERRORS and errors[-1].line == MAX_ERRORS


def test_token_estimates_count_ids_as_given_and_texts_by_characters() -> None:
    assert estimate_tokens({"input": [1, 2, 3]}) == 3
    assert estimate_tokens({"input": [[1, 2], [3]]}) == 3
    assert estimate_tokens({"input": ["abcd" * 10, "ab"]}) == (10 + 2) + (0 + 2)
    assert estimate_tokens("not a body") == 0


def test_retention_durations_read_units_and_refuse_nonsense() -> None:
    assert duration_s("30d", "--x") == 30 * 86400
    assert duration_s("12h", "--x") == 12 * 3600
    assert duration_s("90s", "--x") == 90 and duration_s("2", "--x") == 2 * 86400
    for bad in ("", "0d", "-1h", "soon", "h"):
        with pytest.raises(click.BadParameter):
            duration_s(bad, "--x")


def test_the_lease_owner_is_host_port_and_slot_stable_across_restarts() -> None:
    first = jobs_config(IngressArgs(http_port=8000, ingress_slot=3))
    assert first.owner.endswith(":8000:3")
    assert jobs_config(IngressArgs(http_port=8000, ingress_slot=3)).owner == first.owner
    assert jobs_config(IngressArgs(http_port=8000)).owner.endswith(":8000:0")
    assert first.retention_s == 30 * 86400 and first.max_file_bytes == 200 << 20


def test_a_state_url_that_is_not_postgresql_is_refused_at_start() -> None:
    with pytest.raises(click.BadParameter, match="postgresql://"):
        jobs_config(IngressArgs(state_url="mysql://db/x"))
    assert jobs_config(IngressArgs(state_url="postgresql://db/x")).state_url == "postgresql://db/x"


def test_a_small_batch_is_cut_into_smaller_chunks_a_large_one_into_full_ones() -> None:
    assert chunk_lines(3) == MIN_CHUNK_LINES
    assert chunk_lines(300) == 38  # 8 chunks
    assert chunk_lines(100_000) == CHUNK_LINES
    # lines of many inputs each: a chunk's answers stay about CHUNK_INPUTS embeddings
    assert chunk_lines(100_000, 100_000 * 2048) == CHUNK_INPUTS // 2048
    assert chunk_lines(100_000, 100_000 * 64) == CHUNK_LINES
    assert chunk_lines(10, 10 * 100_000) == 1


class _Mesh:
    """``batch_lines.embed`` failing every call with ``error``; the calls counted."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    async def __call__(self, *_: object) -> None:
        self.calls += 1
        raise self.error


def _state() -> SimpleNamespace:
    return SimpleNamespace(
        cfg=SimpleNamespace(max_inputs=64), client=SimpleNamespace(models=lambda: ["m"])
    )


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    async def instant(_: float) -> None:
        return None

    monkeypatch.setattr(batch_lines.asyncio, "sleep", instant)


async def test_a_line_the_workers_kept_dying_on_is_answered_once_not_retried(
    monkeypatch: pytest.MonkeyPatch, no_backoff: None
) -> None:
    # The broker already gave it its attempts (each one a worker lost): trying again would
    # only kill more workers, so it is the line's answer, in the error file.
    mesh = _Mesh(WorkerFailed("workers failed on this input 3 times"))
    monkeypatch.setattr(batch_lines, "embed", mesh)
    result = await run_line(_state(), 0, line())  # type: ignore[arg-type]
    assert mesh.calls == 1 and not result.ok
    assert json.loads(result.error or b"")["response"]["status_code"] == 502


async def test_a_line_the_mesh_has_no_room_for_is_retried_then_fails_its_chunk(
    monkeypatch: pytest.MonkeyPatch, no_backoff: None
) -> None:
    mesh = _Mesh(Unavailable("no worker serves m"))
    monkeypatch.setattr(batch_lines, "embed", mesh)
    with pytest.raises(ChunkFailed):
        await run_line(_state(), 0, line())  # type: ignore[arg-type]
    assert mesh.calls == LINE_RETRIES


async def test_a_chunk_the_mesh_could_not_take_goes_back_unspent_and_claims_pause(
    monkeypatch: pytest.MonkeyPatch, no_backoff: None, tmp_path: object
) -> None:
    """No worker serves the model now (503): the chunk is released without counting a
    failure, however often it happens, and the runner claims nothing for a while; a worker
    that fails the line (504) spends one of the chunk's attempts."""
    import time

    from mesh.errors import DeadlineExceeded
    from mesh.ingress.batch_runner import UNAVAILABLE_PAUSE_S, BatchRunner
    from mesh.jobs import open_store

    store = open_store(tmp_path, max_chunk_attempts=2)  # type: ignore[arg-type]
    upload = store.create_file(line("a") + line("b"), filename="in.jsonl", purpose="batch")
    batch = store.create_batch(input_file_id=upload.id, endpoint="/v1/embeddings")
    store.start_batch(batch.id, store.plan_chunks(upload.id, 10))

    async def run(fn: object, *args: object) -> object:
        return fn(*args)  # type: ignore[operator]

    jobs = SimpleNamespace(cfg=SimpleNamespace(owner="host:1:0"), run=run)
    runner = BatchRunner(_state(), jobs)  # type: ignore[arg-type]
    monkeypatch.setattr(batch_lines, "embed", _Mesh(Unavailable("no worker serves m")))
    for _ in range(3):  # more outages than the chunk has attempts
        lease = store.claim_chunk("host:1:0")
        assert lease is not None
        before = time.monotonic()
        await runner._chunk(store, lease)
        assert runner.paused_until >= before + UNAVAILABLE_PAUSE_S
    assert store.get_batch(batch.id).status == "in_progress"
    assert store.get_batch(batch.id).request_counts.failed == 0

    monkeypatch.setattr(batch_lines, "embed", _Mesh(DeadlineExceeded("took too long")))
    for _ in range(2):
        lease = store.claim_chunk("host:1:0")
        assert lease is not None
        await runner._chunk(store, lease)
    assert store.get_batch(batch.id).request_counts.failed == 2  # its 2 attempts spent
    store.close()


def _validating(tmp_path, lines: int = 3):  # noqa: ANN202
    from mesh.jobs import open_store

    store = open_store(tmp_path / "state")
    data = b"".join(line(f"c{i}") for i in range(lines))
    made = store.create_file(data, filename="in.jsonl", purpose="batch")
    batch = store.create_batch(input_file_id=made.id, endpoint="/v1/embeddings")
    claimed = store.claim_validation("me")
    assert claimed is not None and claimed.id == batch.id
    return store, batch


def test_a_batch_whose_input_cannot_be_read_fails_at_once_with_the_reason(tmp_path) -> None:
    from mesh.ingress.batch_runner import _validate

    store, batch = _validating(tmp_path)
    store.blobs.path(f"files/{batch.input_file_id}").unlink()  # the shared volume lost it
    _validate(store, batch, "me")
    failed = store.get_batch(batch.id)
    assert failed.status == "failed", failed.status
    [error] = failed.errors
    assert error.code == "input_file_unreadable" and batch.input_file_id in error.message
    assert "upload it again" in error.message
    assert store.claim_validation("me") is None  # not retried until its window ends
    store.close()


def test_a_transient_error_reading_the_input_leaves_the_batch_to_be_validated_again(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from mesh.ingress.batch_runner import _validate

    store, batch = _validating(tmp_path)

    def busy(_file_id: str) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(store, "open_file", busy)
    with pytest.raises(OSError):  # up to the runner's retry; the lease lapses
        _validate(store, batch, "me")
    assert store.get_batch(batch.id).status == "validating"
    store.close()


def test_a_long_validation_renews_its_lease_and_stops_when_it_is_lost(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mesh.ingress import batch_runner
    from mesh.jobs import LeaseLost

    store, batch = _validating(tmp_path, lines=5)
    renewed: list[str] = []
    real = store.renew_validation

    def renew(batch_id: str, owner: str, **kw: float) -> None:
        renewed.append(owner)
        real(batch_id, owner, **kw)

    monkeypatch.setattr(store, "renew_validation", renew)
    monkeypatch.setattr(batch_runner, "RENEW_S", 0.0)  # every check is due
    batch_runner._validate(store, batch, "me")
    assert renewed and set(renewed) == {"me"}
    assert store.get_batch(batch.id).status == "in_progress"

    # Another validator took it over: this one gives up, and neither fails nor starts it.
    store2, other = _validating(tmp_path / "b")
    monkeypatch.setattr(store2, "renew_validation", lambda *a, **k: (_ for _ in ()).throw(
        LeaseLost("taken over")))  # fmt: skip
    batch_runner._validate(store2, other, "me")
    assert store2.get_batch(other.id).status == "validating"
    store.close()
    store2.close()
