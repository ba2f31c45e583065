"""The user-facing Markdown pages and the examples marked in them, for the docs tests.

An example meant to be run is a fenced block with an HTML comment on the line before it
(invisible when the page is rendered):

- ``<!-- run -->``: run the block against ``mesh-launch --role all`` serving the built-in
  all-MiniLM-L6-v2 on port 8000 (what ``make serve`` starts);
- ``<!-- run: NAME -->``: run it against the server of the block marked ``<!-- server: NAME -->``
  (its ``mesh-launch`` line; a line before it that downloads the model is not run, the test
  builds a small model of that directory name instead);
- ``expect="TEXT"`` (or ``expect='TEXT'``, repeatable) inside the comment: what the block's
  output must contain.

A ``sh`` block runs in bash, a ``python`` block in this interpreter, both with this
interpreter's ``bin/`` first on ``PATH`` (as after ``. .venv/bin/activate``). The test rewrites
only the address: ``127.0.0.1:8000`` (or ``localhost:8000``) and a broker's
``tcp://127.0.0.1:5555`` become the test server's free ports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SERVER = "serve"

_MARK = re.compile(r"^\s*<!--\s*(run|server)(?::\s*([\w-]+))?(.*?)-->\s*$")
_EXPECT = re.compile(r"""expect=(?:"([^"]*)"|'([^']*)')""")
_FENCE = re.compile(r"^(\s*)(```+)\s*([\w-]*)\s*$")


def doc_pages() -> list[Path]:
    """README.md, CHANGELOG.md and every page under docs/ (what the link test checks)."""
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [page for page in pages if page.exists()]


@dataclass
class Block:
    """One marked fenced block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    kind: str  # "run" | "server"
    server: str  # the server it needs (run) or starts (server)
    lang: str  # the fence's info string: "sh", "python", ...
    code: str
    expect: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fenced_lines(text: str) -> list[bool]:
    """For each line of ``text``, whether it lies inside (or is) a fence."""
    inside, fence, flags = False, "", []
    for line in text.splitlines():
        match = _FENCE.match(line)
        if match and (not inside or match.group(2) == fence):
            flags.append(True)
            inside, fence = not inside, match.group(2)
            continue
        flags.append(inside)
    return flags


def marked_blocks(page: Path) -> list[Block]:
    """The blocks of ``page`` with a run or server comment right before their opening fence."""
    lines = page.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines[:-1]):
        mark, opening = _MARK.match(line), _FENCE.match(lines[i + 1])
        if not mark or not opening:
            continue
        indent, fence, lang = opening.groups()
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == fence)
        code = "\n".join(body[len(indent) :] for body in lines[i + 2 : end]) + "\n"
        expect = [a or b for a, b in _EXPECT.findall(mark.group(3))]
        blocks.append(Block(page, i + 2, mark.group(1), mark.group(2) or DEFAULT_SERVER, lang,
                            code, expect))  # fmt: skip
    return blocks


def all_blocks() -> list[Block]:
    return [block for page in doc_pages() for block in marked_blocks(page)]
