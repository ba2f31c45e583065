"""No doc or code comment cites the round of work or the issue it came from: docs describe the
software as it is, and the history lives in git and CHANGELOG.md. The pattern is the one the
project's before-stop check uses."""

from __future__ import annotations

import re
from pathlib import Path

from tests.doc_blocks import ROOT, doc_pages

HISTORY = re.compile(
    r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|[0-9]+(st|nd|rd|th)"
    r"|next|last|this|previous|earlier) session\b|\bissues? #?[0-9]+\b",
    re.IGNORECASE,
)
CODE = ("mesh", "launch", "proto_msgs")


def citing(paths: list[Path]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for path in paths for n, line in enumerate(path.read_text().splitlines(), 1)
            if HISTORY.search(line)]  # fmt: skip


def test_no_doc_line_cites_a_session_or_an_issue() -> None:
    assert citing([page for page in doc_pages() if page.name != "CHANGELOG.md"]) == []


def test_no_code_line_cites_a_session_or_an_issue() -> None:
    files = [path for top in CODE for path in sorted((ROOT / top).rglob("*.py"))]
    assert citing(files) == []


def test_the_pattern_catches_what_it_is_for() -> None:
    for line in ("as the eighth session found", "issue #9", "Issue 13's families", "issues 12"):
        assert HISTORY.search(line), line
    for line in ("a session of the client", "the issue of a ticket", "tissue 9"):
        assert not HISTORY.search(line), line
