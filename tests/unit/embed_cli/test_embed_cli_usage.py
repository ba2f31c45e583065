"""mesh-embed's command line before any request: usage errors exit 1, an output in the way is
refused naming --resume and --force."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesh.embed_cli.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    return int(exit_.value.code or 0), capsys.readouterr().err


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "x"}\n')
    return path


def base(source: Path, out: Path) -> list[str]:
    # Port 9 (discard) on loopback: nothing answers, and none of these tests gets that far.
    return [str(source), "-o", str(out), "--url", "http://127.0.0.1:9/v1", "--model", "m"]


def test_help_lists_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for line in ("0    done", "1    usage", "2    the server refused", "3    the server stayed",
                 "130  interrupted"):  # fmt: skip
        assert line in text


def test_a_missing_option_is_a_usage_error_exiting_1(
    capsys: pytest.CaptureFixture[str], source: Path
) -> None:
    code, err = run(capsys, str(source), "--url", "http://127.0.0.1:9/v1", "--model", "m")
    assert code == 1
    assert "Missing option '-o'" in err


def test_resume_and_force_together_are_refused(
    capsys: pytest.CaptureFixture[str], source: Path, tmp_path: Path
) -> None:
    code, err = run(capsys, *base(source, tmp_path / "out.npy"), "--resume", "--force")
    assert (code, "exclude each other" in err) == (1, True)


def test_an_existing_output_is_refused_naming_resume_and_force(
    capsys: pytest.CaptureFixture[str], source: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.npy"
    out.write_bytes(b"precious")
    code, err = run(capsys, *base(source, out))
    assert code == 1
    assert "--resume continues an interrupted run, --force starts over" in err
    code, err = run(capsys, *base(source, out), "--resume")
    assert code == 1
    assert "has no out.npy.progress: it is complete" in err
    assert out.read_bytes() == b"precious"


@pytest.mark.parametrize(("name", "message"), [("in.txt", "unknown input format"),
                                                ("missing.jsonl", "no such file")])  # fmt: skip
def test_an_unusable_input_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, message: str
) -> None:
    path = tmp_path / name
    if name.endswith(".txt"):
        path.write_text("x\n")
    code, err = run(capsys, *base(path, tmp_path / "out.npy"))
    assert code == 1
    assert message in err


def test_an_unknown_output_format_exits_1_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], source: Path, tmp_path: Path
) -> None:
    code, err = run(capsys, *base(source, tmp_path / "out.csv"))
    assert (code, "unknown output format" in err) == (1, True)
    assert not (tmp_path / "out.csv.progress").exists()
