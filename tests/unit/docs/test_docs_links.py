"""Every relative link and every backticked ``*.md`` name in README.md, CHANGELOG.md and docs/
resolves to a file in the repository, and every ``#anchor`` into a page to one of its headings;
the marked examples are well formed (the executed ones run in tests/e2e/test_docs_examples.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_blocks import DEFAULT_SERVER, ROOT, all_blocks, doc_pages, fenced_lines

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_MD_NAME = re.compile(r"`([\w./-]+\.md)(?:#[\w-]+)?`")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def prose(text: str) -> str:
    """``text`` without its fenced blocks (code is not a link, nor a heading)."""
    kept = [line for line, inside in zip(text.splitlines(), fenced_lines(text), strict=True)
            if not inside]  # fmt: skip
    return "\n".join(kept)


def anchors(page: Path) -> set[str]:
    lines = prose(page.read_text()).splitlines()
    return {slug(line.lstrip("#")) for line in lines if line.startswith("#")}


def candidates(page: Path, target: str) -> list[Path]:
    """Where ``target`` may point from ``page``: relative to the page, else to the repository."""
    paths = [(base / target).resolve() for base in (page.parent, ROOT)]
    return [path for path in paths if path.is_relative_to(ROOT)]


def resolves(page: Path, target: str) -> Path | None:
    """The file ``target`` names from ``page``, if it exists."""
    return next((path for path in candidates(page, target) if path.exists()), None)


def broken(page: Path, text: str | None = None) -> list[str]:
    """What ``page`` (or ``text`` read as if it stood at ``page``) names that does not exist."""
    found = []
    text = prose(page.read_text() if text is None else text)
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        path_part, _, anchor = target.partition("#")
        path = resolves(page, path_part) if path_part else page
        if path is None:
            found.append(f"link {target}")
            continue
        if anchor and path.suffix == ".md" and anchor not in anchors(path):
            found.append(f"anchor {target}")
    for name in _MD_NAME.findall(text):
        if resolves(page, name) is None:
            found.append(f"`{name}`")
    return found


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_md_name_resolves(page: Path) -> None:
    assert broken(page) == []


def test_the_checker_sees_a_broken_link_and_anchor() -> None:
    page = ROOT / "docs" / "README.md"
    text = "[a](missing.md) [b](serving.md#no-such-heading) `gone.md` [ok](serving.md#the-roles)"
    text += " [up](../README.md#try-it)\n```\n[in code](nowhere.md)\n```\n"
    assert broken(page, text) == [
        "link missing.md",
        "anchor serving.md#no-such-heading",
        "`gone.md`",
    ]


def test_every_run_block_names_a_known_server_and_language() -> None:
    blocks = all_blocks()
    servers = {b.server for b in blocks if b.kind == "server"} | {DEFAULT_SERVER}
    assert any(b.kind == "run" for b in blocks)
    for block in blocks:
        assert block.lang in {"sh", "python"}, block.where
        if block.kind == "run":
            assert block.server in servers, block.where
        else:
            assert "mesh-launch" in block.code, block.where
