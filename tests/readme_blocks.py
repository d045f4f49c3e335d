"""The code blocks of README.md and of the guide (``docs/*.md``), as a test runs them.

Every runnable fenced block (``bash``, ``sh``, ``shell``, ``console``, ``python``) carries a marker on the line
before it, so that no command a user is meant to type goes untested, and a block that is not run says why:

- ``<!-- readme: run SCENARIO -->``: run as written, with the other blocks of its scenario, as one bash script
  (one terminal: a variable one block sets is there in the next), in a scratch folder. A ``python`` block runs
  as ``python - <<'PY' ... PY`` inside that script, so what a user pastes into Python is what runs;
- ``<!-- readme: file SCENARIO PATH -->``: a block of any language saved as ``PATH`` in that folder before the
  scenario's commands run (the README's YAML example is the job its commands run);
- ``<!-- readme: skip REASON -->``: not run here, with the reason (a block that runs this suite, one that needs
  the team's shared corpora or a server holding jobs, naming the test that runs it).

A scenario may span pages. Its blocks run in one order: README.md first, then the guide's pages in
``DOCS_ORDER`` (the reading order of ``docs/index.md``), then any other page of ``docs/`` by name; within a
page, top to bottom. Every error names the page and the line.

Pure parsing, no test here: ``tests/test_readme.py`` runs the scenarios.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"<!--\s*readme:\s*(run|file|skip)\s+(.*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
#: languages whose blocks a user runs: each needs a marker
RUNNABLE = ("bash", "sh", "shell", "console", "python")
#: the guide's pages in reading order (stems of docs/*.md); a page not listed follows them, by name
DOCS_ORDER = ("index", "jobs", "stages", "dedup", "filters", "pii", "decontamination", "outputs", "training",
              "evaluation", "ablations", "library", "writing-a-stage", "control-plane", "deploy", "architecture",
              "fast-paths")


@dataclass
class Block:
    """One fenced block: its page, language, text, the line its fence opens on, and its marker."""

    lang: str
    text: str
    line: int
    action: str | None = None
    args: list[str] = field(default_factory=list)
    page: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


@dataclass
class Scenario:
    """What one test runs: files to lay out, then commands, both in page order."""

    name: str
    files: dict[str, str] = field(default_factory=dict)
    commands: list[Block] = field(default_factory=list)

    def script(self) -> str:
        """The commands as one bash script, each block headed by its page and line (an error names it)."""
        return "\n".join(f"# {b.where}\n{_as_shell(b)}" for b in self.commands)


def _as_shell(block: Block) -> str:
    if block.lang != "python":
        return block.text
    if "PY" in block.text.splitlines():
        raise ValueError(f"{block.where}: a python block may not hold a line 'PY' (it ends the here-document)")
    return f"python - <<'PY'\n{block.text}PY\n"


def pages(root: Path = ROOT) -> list[Path]:
    """README.md, then the guide's pages in ``DOCS_ORDER``, then the other ``docs/*.md`` by name."""
    rank = {stem: i for i, stem in enumerate(DOCS_ORDER)}
    docs = sorted((root / "docs").glob("*.md"), key=lambda p: (rank.get(p.stem, len(rank)), p.name))
    return [root / "README.md", *docs]


def blocks(text: str | None = None, page: str = "README.md") -> list[Block]:
    """Every fenced block of one page (README.md when no text is given) with the marker on the line before
    its fence (if any)."""
    lines = (README.read_text(encoding="utf-8") if text is None else text).splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        block = Block(m.group(1), "\n".join(body) + "\n", start + 1, page=page)
        mark = MARKER.search(lines[start - 1]) if start > 0 else None
        if mark:
            block.action, rest = mark.group(1), mark.group(2)
            block.args = [rest] if block.action == "skip" else rest.split()
        found.append(block)
        i += 1
    return found


def all_blocks(root: Path = ROOT) -> list[Block]:
    """The blocks of every page, in scenario order (``pages``)."""
    return [b for p in pages(root) for b in blocks(p.read_text(encoding="utf-8"), p.relative_to(root).as_posix())]


def unmarked_blocks(found: Iterable[Block]) -> list[Block]:
    """Runnable blocks with no marker: each is a command nobody checks."""
    return [b for b in found if b.lang in RUNNABLE and b.action is None]


def scenarios(found: Iterable[Block] | None = None) -> dict[str, Scenario]:
    """The ``run`` and ``file`` blocks grouped by scenario name, in the order given (every page by default)."""
    out: dict[str, Scenario] = {}
    for b in all_blocks() if found is None else found:
        if b.action not in ("run", "file"):
            continue
        if not b.args:
            raise ValueError(f"{b.where}: a '{b.action}' marker needs a scenario name")
        sc = out.setdefault(b.args[0], Scenario(b.args[0]))
        if b.action == "file":
            if len(b.args) != 2:
                raise ValueError(f"{b.where}: 'file' takes a scenario and a path")
            sc.files[b.args[1]] = b.text
        else:
            _as_shell(b)
            sc.commands.append(b)
    return out
