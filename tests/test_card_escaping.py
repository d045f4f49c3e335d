"""Issue 37: every value the card (``README.md``) shows from data or from a spec (language codes, reasons, source
paths, stage parameters, names) is escaped for Markdown and HTML: rendered by a CommonMark renderer, the card holds
no markup that the data brought (no tag, no link, no emphasis, no extra table column), and shows each value as
written."""

from __future__ import annotations

import copy
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

from pipeline.card.build import write_card
from pipeline.card.profile import KeptProfile
from tests.test_card import SPEC, _output

HOSTILE = ["<script>alert(3)</script>", "<img src=x onerror=alert(2)>", "[x](javascript:alert(1))", "a|b|c",
           "`code` ``x``", "*em* _u_ ~~s~~", "two\nlines\n\n# heading", "&lt;b&gt;", "back\\|slash"]


class _Html(HTMLParser):
    """The tags (with their attributes) and the text of rendered HTML."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _rendered(card: Path) -> _Html:
    """The card's Markdown (after its YAML front matter, which the Hub reads as data) as a CommonMark renderer
    with GFM tables and raw HTML on makes it, links not vetted: the renderer a card must be safe in."""
    _, front, body = card.read_text().split("---\n", 2)
    yaml.safe_load(front)
    md = MarkdownIt("commonmark").enable("table")
    md.validateLink = lambda url: True
    parsed = _Html()
    parsed.feed(md.render(body))
    return parsed


def _hostile_output(folder: Path, values: list[str]) -> tuple[Path, dict]:
    out = _output(folder)
    stats = json.loads((out / "stats.json").read_text())
    stats["job"] = values[0]
    lid, gopher, pii, decontam = (next(s for s in stats["stages"] if s["stage"].endswith(t))
                                  for t in ("-lid", "-gopher_quality", "-pii", "-decontaminate"))
    for i, v in enumerate(values):
        lid["counters"][f"lang:{v}"] = i + 1
        gopher["dropped"][f"gopher_quality:{v}"] = i + 1
        pii["counters"][f"entity:{v}"] = i + 1
        decontam["counters"].update({f"docs:{v}": 1, f"rule:{v}:{v}": 1, f"item:{v}:{v}": 1})
    stats["inputs"] += [{"path": f"/data/{v}/*.jsonl", "format": v, "files": 1, "bytes": 2, "sha256": v}
                        for v in values]
    profile = KeptProfile((0,))
    for i, v in enumerate(values):
        profile.add(i * 8, "some words here " * 10, 40, json.dumps({"lang": v}))
    stats["profile"] = profile.to_json()
    (out / "stats.json").write_text(json.dumps(stats))
    spec = copy.deepcopy(SPEC)
    spec["inputs"][0]["path"] = f"/data/{values[1]}/*.jsonl"
    spec["inputs"][0]["template"] = "```\n" + "\n".join(values) + "\n```\n~~~\n"  # a fence in the spec's YAML
    spec["stages"][1]["params"]["languages"] = values
    return out, spec


@pytest.fixture(scope="module")
def cards(tmp_path_factory) -> tuple[Path, Path]:
    """``(plain, hostile)``: the card of an output with plain values, and of one with :data:`HOSTILE` values
    everywhere, compared with the plain one (whose folder's name is hostile too)."""
    root = tmp_path_factory.mktemp("cards")
    plain, plain_spec = _hostile_output(root / "a|b [x](javascript:alert(5)) <i>", ["en", "de", "fr"])
    write_card(str(plain), spec_json=plain_spec)
    out, spec = _hostile_output(root / "out", HOSTILE)
    write_card(str(out), compare=[str(plain)], spec_json=spec)
    return plain / "README.md", out / "README.md"


def test_values_from_data_and_spec_render_as_text_with_a_commonmark_renderer(cards):
    plain, hostile = cards
    allowed = {tag for tag, _ in _rendered(plain).tags}  # what the card itself emits
    html = _rendered(hostile)
    assert {tag for tag, _ in html.tags} <= allowed, {tag for tag, _ in html.tags} - allowed
    for tag, attrs in html.tags:  # the card's own figures only
        if tag in ("a", "img"):
            assert (attrs.get("href") or attrs.get("src") or "").startswith("card/"), (tag, attrs)
    text = " ".join("".join(html.text).split())
    for v in [*HOSTILE, "a|b [x](javascript:alert(5)) <i>"]:  # each shown as written, a line break as a space
        assert " ".join(v.split()) in text, v
    yaml_front = yaml.safe_load(hostile.read_text().split("---\n", 2)[1])
    assert yaml_front["pretty_name"] == HOSTILE[0]  # the front matter holds the data as data: YAML, not markup


def test_every_table_keeps_its_columns(cards):
    """A renderer pads or cuts a row to its header's columns: the source's rows must have them (a ``|`` from the
    data escaped), and every table must stay one (a line break from the data would end it)."""
    counts = []
    for card in cards:
        body = card.read_text().split("---\n", 2)[2]
        tables = [[line for line in block.splitlines() if line.startswith("|")] for block in body.split("\n\n")]
        tables = [rows for rows in tables if rows]
        for rows in tables:
            assert len({len(_cells(r)) for r in rows}) == 1, rows
        assert sum(t.type == "table_open" for t in MarkdownIt("commonmark").enable("table").parse(body)) \
            == len(tables)
        counts.append([len(rows) for rows in tables])
    plain, hostile = counts
    assert len(hostile) == len(plain) + 1  # the comparison's table
    assert all(h >= p for h, p in zip(hostile, plain, strict=False))


def _cells(row: str) -> list[str]:
    out, cur, escaped = [], "", False
    for ch in row:
        if ch == "|" and not escaped:
            out.append(cur)
            cur = ""
        else:
            cur += ch
        escaped = ch == "\\" and not escaped
    return out
