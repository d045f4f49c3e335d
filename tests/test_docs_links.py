"""README.md stays short and every link of README.md and the guide works in a clone (issue 39).

The README is a front page (at most 300 lines); the guide in ``docs/`` holds the rest. A relative link must name
a file or folder inside the repository, and an anchor (``page.md#section``) a heading of that page, so nothing
points at a machine's folders or at a page that moved. Absolute ``http(s)://`` links are left alone (no network
here).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests import readme_blocks as rb

#: ``[text](target)`` outside code; the target up to a space or the closing parenthesis
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
EXTERNAL = ("http://", "https://", "mailto:")
MAX_README_LINES = 300


def _unfenced(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _prose(text: str) -> str:
    """The page without fenced blocks and inline code, where a bracket is not a link."""
    return re.sub(r"`[^`\n]*`", "", _unfenced(text))


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#{1,6}\s+(.*?)\s*$", _unfenced(page.read_text(encoding="utf-8")), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def broken_links(page: Path, root: Path) -> list[str]:
    """Each link of ``page`` that leaves the repository, names nothing, or names a missing heading."""
    bad = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if target.startswith(EXTERNAL):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(root.resolve()) or not dest.exists():
            bad.append(f"{page.relative_to(root)}: {target} (not a file of the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return bad


def test_the_readme_is_a_front_page_of_at_most_300_lines() -> None:
    lines = rb.README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move the detail into docs/"


def test_every_link_of_the_readme_and_the_guide_stays_in_the_repository() -> None:
    pages = rb.pages()
    assert len(pages) > 10, "README.md and the guide's pages"
    bad = [b for page in pages for b in broken_links(page, rb.ROOT)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_links_check_sees_a_link_out_of_the_repository(tmp_path: Path) -> None:
    """Control: a link out of the clone, a missing page and a missing heading are reported; an external URL, a
    link inside code and a good anchor are not."""
    (tmp_path / "repo" / "docs").mkdir(parents=True)
    (tmp_path / "shared.md").write_text("# outside\n")
    root = tmp_path / "repo"
    (root / "docs" / "jobs.md").write_text("# Jobs\n\n## Resume and cancel\n")
    page = root / "README.md"
    page.write_text("[design](../shared.md) [gone](docs/gone.md) [jobs](docs/jobs.md#resume-and-cancel)\n"
                    "[bad anchor](docs/jobs.md#resume) [ray](https://docs.ray.io) `[x](nowhere.md)`\n"
                    "```\n[y](nowhere.md)\n```\n")
    assert broken_links(page, root) == ["README.md: ../shared.md (not a file of the repository)",
                                        "README.md: docs/gone.md (not a file of the repository)",
                                        "README.md: docs/jobs.md#resume (no such heading)"]
