"""No speed figures in the code's docstrings and comments: they go stale with the next change or machine, and
they belong in bench/results (bench/RESULTS.md). A docstring or comment says why a path is fast, not how fast.
Inline code (``...``, `...`) is exempt: it shows what a command prints, not a measurement."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "service", "training", "kernels", "tokenmill")
NUM = r"\d[\d,.]*"
UNITS = r"(?:docs|documents|tokens|items|rows|records|lines|chunks|samples|requests|words|pages|files|shards)"
SPEED = re.compile("|".join([
    rf"{NUM}\s*x\s+(?:faster|slower|cheaper|costlier|quicker|dearer|the speed|the throughput)",
    rf"{NUM}\s*[kKMG]?\s*[x%]?(?:\s+\S+){{0,3}}?\s*{UNITS}(?:/s\b|\s+(?:per|a)\s+second)",
    rf"{NUM}\s*[kKMGT]i?B/s",
    rf"{NUM}\s*(?:ns|us|µs|ms|s|sec|seconds?|minutes?)\s+(?:a|per|each|for)\s+(?:\d|[a-zA-Z])",
    rf"{NUM}\s*(?:CPU-s|CPU-seconds|core-hours)\s+(?:per|a)\b",
    rf"(?:took|takes|paused\b[^.]*?\bfor)\s+(?:about\s+|~)?{NUM}(?:\s*(?:to|-)\s*{NUM})?\s*(?:ns|us|µs|ms|s)\b",
]), re.IGNORECASE)
INLINE_CODE = re.compile(r"``.*?``|`[^`\n]*`", re.DOTALL)
C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


def python_prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python source; comments on consecutive lines are one
    text, so a figure broken over two lines is still seen."""
    found: list[tuple[int, str]] = []
    last = -1
    for t in tokenize.generate_tokens(io.StringIO(source).readline):
        if t.type == tokenize.COMMENT:
            text = t.string.lstrip("#:")
            if found and t.start[0] == last + 1:
                found[-1] = (found[-1][0], f"{found[-1][1]} {text}")
            else:
                found.append((t.start[0], text))
            last = t.start[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append((first.lineno, first.value.value))
    return found


def c_prose(source: str) -> list[tuple[int, str]]:
    return [(source.count("\n", 0, m.start()) + 1, m.group()) for m in C_COMMENT.finditer(source)]


def speed_figures(text: str) -> list[str]:
    return [m.group() for m in SPEED.finditer(INLINE_CODE.sub(" ", text))]


def test_the_pattern_catches_speed_figures_and_leaves_other_numbers():
    for claim in ("runs 3.5x faster than datasketch", "12k docs/s", "about 1.5x cheaper", "2.7k clean docs/s",
                  "5.5M tokens per second", "420 MB/s from the page cache", "~6 us a pre-token",
                  "529 CPU-s per GB", "it lost 35% of its tokens/s", "13.4x datatrove's docs/s",
                  "a full collection took 90 to 130 ms", "paused the model for 0.35 s"):
        assert speed_figures(claim), claim
    for fine in ("seq_len 2048, 16 heads", "a 4 MB bit filter", "exit 130 within 10 s", "the 5x5 kernel",
                 "``1.5k docs/s`` as the bar prints it", "`12 docs/s`", "rates in docs/s", "timeout of 30 s"):
        assert not speed_figures(fine), fine


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for ext in ("*.py", "*.c", "*.h") for p in (REPO / pkg).rglob(ext))


def test_no_speed_figures_in_docstrings_or_comments():
    found = []
    for path in _sources():
        source = path.read_text(encoding="utf-8")
        prose = python_prose(source) if path.suffix == ".py" else c_prose(source)
        for line, text in prose:
            found += [f"{path.relative_to(REPO)}:{line}: {hit!r}" for hit in speed_figures(text)]
    assert not found, "speed figures in docstrings/comments (say why, put the figure in bench/results):\n" + \
        "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ('"""Fast: 3.5x faster than datasketch."""\nx = "12k docs/s"  # 12k docs/s here\n', 2),
    ('def f():\n    """Prints ``12k docs/s``."""\n    return "3x faster"\n', 0),
    ("# the fast path is about 1.5x\n# faster on these pages\nx = 1  # 2 s\n# a\n", 1),
])
def test_only_docstrings_and_comments_are_read(source: str, expected: int):
    assert sum(len(speed_figures(text)) for _, text in python_prose(source)) == expected
