"""mesh-embed against a fake OpenAI-compatible server in this process: every input and output
format, retries honouring Retry-After, exit codes, interruption and --resume, bounded memory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mesh.embed_cli.cli import main
from tests.fake_embeddings import FakeServer, Scripted, fake_vectors, read_output, write_input

TEXTS = [f"text number {i}: " + "word " * (i % 13) for i in range(300)]
IDS = [f"doc-{i}" for i in range(len(TEXTS))]  # what write_input gives them


@pytest.fixture
def server() -> Iterator[FakeServer]:
    yield from FakeServer().serve()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--quiet"])
    return int(exit_.value.code or 0), capsys.readouterr().err


def args(server: FakeServer, source: Path, out: Path, *more: str) -> list[str]:
    return [str(source), "-o", str(out), "--url", server.url, "--model", "fake", *more]


@pytest.mark.parametrize("suffix_in", [".jsonl", ".csv", ".parquet"])
@pytest.mark.parametrize("suffix_out", [".npy", ".jsonl", ".parquet"])
def test_every_format_pair_holds_the_servers_vectors_in_input_order(
    capsys: pytest.CaptureFixture[str], server: FakeServer, tmp_path: Path, suffix_in: str,
    suffix_out: str,
) -> None:  # fmt: skip
    source = write_input(tmp_path / f"in{suffix_in}", TEXTS)
    out = tmp_path / f"out{suffix_out}"
    code, err = run(capsys, *args(server, source, out, "--batch-size", "16"))
    assert code == 0, err
    ids, vectors = read_output(out)
    assert np.array_equal(vectors, fake_vectors(TEXTS))
    assert ids in (None, IDS)
    assert not (tmp_path / f"out{suffix_out}.progress").exists()
    assert server.priorities == {"batch"}  # embedmesh's batch lane, whatever the size


def test_float_encoding_dimensions_and_priority_reach_the_server(
    capsys: pytest.CaptureFixture[str], server: FakeServer, tmp_path: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", TEXTS)
    out = tmp_path / "out.npy"
    more = ("--encoding-format", "float", "--dimensions", "64", "--concurrency", "1",
            "--priority", "interactive")  # fmt: skip
    assert run(capsys, *args(server, source, out, *more))[0] == 0
    assert np.array_equal(np.load(out), fake_vectors(TEXTS, 64))
    assert server.priorities == {"interactive"}


def test_a_429_is_retried_after_the_wait_its_retry_after_names(
    capsys: pytest.CaptureFixture[str], server: FakeServer, tmp_path: Path
) -> None:
    server.script = [Scripted(429, {"Retry-After": "1"}, "slow down")]
    source = write_input(tmp_path / "in.jsonl", TEXTS[:10])
    out = tmp_path / "out.npy"
    code, err = run(capsys, *args(server, source, out, "--concurrency", "1"))
    assert code == 0, err
    (refused_at, status), (answered_at, ok) = server.requests
    assert (status, ok) == (429, 200)
    assert answered_at - refused_at >= 0.95  # the backoff alone would have waited 0.5 s
    assert np.array_equal(np.load(out), fake_vectors(TEXTS[:10]))


def test_503s_without_retry_after_are_retried_with_backoff(
    capsys: pytest.CaptureFixture[str], server: FakeServer, tmp_path: Path
) -> None:
    server.script = [Scripted(503), Scripted(502)]
    source = write_input(tmp_path / "in.jsonl", TEXTS[:10])
    code, err = run(capsys, *args(server, source, tmp_path / "out.npy", "--concurrency", "1"))
    assert code == 0, err
    assert [status for _, status in server.requests] == [503, 502, 200]


def test_a_4xx_fails_at_once_with_the_servers_message_and_keeps_what_was_written(
    capsys: pytest.CaptureFixture[str], server: FakeServer, tmp_path: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", TEXTS[:40])
    out = tmp_path / "out.jsonl"
    # The third request is refused: the two batches before it are written and saved.
    server.script = [None, None, Scripted(422, message="input 3 is too long")]
    more = ("--concurrency", "1", "--batch-size", "10")
    code, err = run(capsys, *args(server, source, out, *more))
    assert code == 2
    assert "HTTP 422: input 3 is too long" in err
    assert [status for _, status in server.requests] == [200, 200, 422]
    saved = json.loads((tmp_path / "out.jsonl.progress").read_text())
    assert saved["rows"] == 20
    assert len(out.read_text().splitlines()) == 20
    code, err = run(capsys, *args(server, source, out, *more, "--resume"))
    assert code == 0, err
    assert len(server.requests) == 5  # rows 20 to 39 only
    ids, vectors = read_output(out)
    assert ids == IDS[:40]
    assert np.array_equal(vectors, fake_vectors(TEXTS[:40]))


def test_a_server_that_stays_unavailable_exits_3(
    capsys: pytest.CaptureFixture[str], server: FakeServer, tmp_path: Path
) -> None:
    server.script = [Scripted(503, message="draining")] * 3
    source = write_input(tmp_path / "in.jsonl", TEXTS[:5])
    more = ("--max-retries", "2", "--concurrency", "1")
    code, err = run(capsys, *args(server, source, tmp_path / "out.npy", *more))
    assert code == 3
    assert "HTTP 503: draining (after 2 retries)" in err


def test_no_server_at_all_exits_3(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from bench.spawn import free_port

    source = write_input(tmp_path / "in.jsonl", TEXTS[:5])
    argv = [str(source), "-o", str(tmp_path / "o.npy"), "--url",
            f"http://127.0.0.1:{free_port()}/v1", "--model", "m", "--max-retries", "1"]  # fmt: skip
    code, err = run(capsys, *argv)
    assert code == 3
    assert "ClientConnectorError" in err


def test_the_api_key_comes_from_the_environment(
    capsys: pytest.CaptureFixture[str], server: FakeServer, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    server.api_key = "sesame"
    source = write_input(tmp_path / "in.jsonl", TEXTS[:5])
    code, err = run(capsys, *args(server, source, tmp_path / "a.npy"))
    assert (code, "HTTP 401: wrong API key" in err) == (2, True)
    monkeypatch.setenv("EMBEDMESH_API_KEY", "sesame")
    assert run(capsys, *args(server, source, tmp_path / "b.npy"))[0] == 0


def test_a_200_without_embeddings_is_a_refusal_not_a_crash(
    capsys: pytest.CaptureFixture[str], server: FakeServer, tmp_path: Path
) -> None:
    server.script = [Scripted(200, message="not an embeddings list")]
    source = write_input(tmp_path / "in.jsonl", TEXTS[:5])
    code, err = run(capsys, *args(server, source, tmp_path / "out.npy"))
    assert code == 2
    assert "answered no embeddings for 5 inputs" in err


def test_a_url_without_v1_is_refused_with_a_hint(
    capsys: pytest.CaptureFixture[str], server: FakeServer, tmp_path: Path
) -> None:
    source = write_input(tmp_path / "in.jsonl", TEXTS[:5])
    argv = [str(source), "-o", str(tmp_path / "o.npy"), "--url", server.url.removesuffix("/v1"),
            "--model", "m"]  # fmt: skip
    code, err = run(capsys, *argv)
    assert code == 2
    assert "HTTP 404" in err
    assert "is --url the server's /v1 base?" in err
