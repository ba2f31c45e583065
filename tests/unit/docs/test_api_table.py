"""docs/api.md's route table is the one rendered from the OpenAPI document the ingress serves:
a route added, removed or given another status fails here until the page is refreshed with
``python -m mesh.ingress.api_markdown --write docs/api.md``."""

from __future__ import annotations

import pytest

from mesh.ingress.api_markdown import BEGIN, END, generated_block, replace_block, route_table
from tests.doc_blocks import ROOT

API = ROOT / "docs" / "api.md"


def test_api_md_route_table_is_current() -> None:
    text = API.read_text()
    assert generated_block() in text, "run: python -m mesh.ingress.api_markdown --write docs/api.md"


def test_route_table_has_a_row_per_operation() -> None:
    spec = {"paths": {"/a": {"get": {"summary": "A | b", "responses": {"200": {}, "404": {},
                                                                      "default": {}},
                                     "security": [{"bearer": []}]}},
                      "/b": {"post": {"summary": "B", "responses": {"200": {}}, "security": []}}}}  # fmt: skip
    rows = route_table(spec).splitlines()[2:]
    assert rows == ["| GET | `/a` | A \\| b | 200, 404 | yes |", "| POST | `/b` | B | 200 |  |"]


def test_replace_block_swaps_only_the_marked_part() -> None:
    text = f"before\n{BEGIN}\nold\n{END}\nafter\n"
    assert replace_block(text, f"{BEGIN}\nnew\n{END}") == f"before\n{BEGIN}\nnew\n{END}\nafter\n"
    with pytest.raises(ValueError):
        replace_block("no markers", "x")
