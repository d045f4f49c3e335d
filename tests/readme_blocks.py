"""The README's code blocks, as a test runs them.

Every fenced ``bash`` block of README.md carries a marker on the line before it, so that no command a user is
meant to type goes untested, and a block that is not run says why:

- ``<!-- readme: run SCENARIO -->``: run as written, with the other blocks of its scenario, in README order, as one
  bash script (one terminal: a variable one block sets is there in the next), in a scratch folder;
- ``<!-- readme: file SCENARIO PATH -->``: a block of any language saved as ``PATH`` in that folder before the
  scenario's commands run (the README's YAML example is the job its commands run);
- ``<!-- readme: skip REASON -->``: not run here, with the reason (a block that runs this suite, or one that needs
  the team's shared corpora, which a fresh machine lacks).

Pure parsing, no test here: ``tests/test_readme.py`` runs the scenarios.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = re.compile(r"<!--\s*readme:\s*(run|file|skip)\s+(.*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Block:
    """One fenced block: its language, its text, the line its fence opens on, and its marker."""

    lang: str
    text: str
    line: int
    action: str | None = None
    args: list[str] = field(default_factory=list)


@dataclass
class Scenario:
    """What one test runs: files to lay out, then commands, both in README order."""

    name: str
    files: dict[str, str] = field(default_factory=dict)
    commands: list[Block] = field(default_factory=list)

    def script(self) -> str:
        """The commands as one bash script, each block headed by its README line (an error names it)."""
        parts = [f"# README.md line {b.line}\n{b.text}" for b in self.commands]
        return "\n".join(parts)


def blocks(text: str | None = None) -> list[Block]:
    """Every fenced block of the README with the marker on the line before its fence (if any)."""
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
        block = Block(m.group(1), "\n".join(body) + "\n", start + 1)
        mark = MARKER.search(lines[start - 1]) if start > 0 else None
        if mark:
            block.action, rest = mark.group(1), mark.group(2)
            block.args = [rest] if block.action == "skip" else rest.split()
        found.append(block)
        i += 1
    return found


def unmarked_shell_blocks(text: str | None = None) -> list[Block]:
    """``bash``/``sh`` blocks with no marker: each is a command nobody checks."""
    return [b for b in blocks(text) if b.lang in ("bash", "sh", "shell", "console") and b.action is None]


def scenarios(text: str | None = None) -> dict[str, Scenario]:
    """The ``run`` and ``file`` blocks grouped by scenario name."""
    out: dict[str, Scenario] = {}
    for b in blocks(text):
        if b.action not in ("run", "file"):
            continue
        if not b.args:
            raise ValueError(f"README.md line {b.line}: a '{b.action}' marker needs a scenario name")
        sc = out.setdefault(b.args[0], Scenario(b.args[0]))
        if b.action == "file":
            if len(b.args) != 2:
                raise ValueError(f"README.md line {b.line}: 'file' takes a scenario and a path")
            sc.files[b.args[1]] = b.text
        else:
            sc.commands.append(b)
    return out
