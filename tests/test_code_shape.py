"""The engine stays a short sequencer (issue 21): read from the source, nothing imported.

``pipeline/job/engine.py`` holds the order of the phases, resume, cancel and failure translation, and every
phase lives in a module of its own; a function that grows past a screen in ``pipeline/job`` is a phase or a
scheduler creeping back into one place.
"""

from __future__ import annotations

import ast
from pathlib import Path

JOB = Path(__file__).resolve().parent.parent / "pipeline" / "job"
ENGINE_LINES = 200
FUNCTION_LINES = 60


def long_functions(folder: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_the_engine_is_a_short_sequencer() -> None:
    lines = len((JOB / "engine.py").read_text().splitlines())
    assert lines <= ENGINE_LINES, f"pipeline/job/engine.py has {lines} lines (at most {ENGINE_LINES})"


def test_no_function_in_the_job_package_is_long() -> None:
    found = long_functions(JOB, FUNCTION_LINES)
    assert not found, "functions over the limit:\n" + "\n".join("  " + f for f in found)


def test_the_length_check_sees_a_long_function(tmp_path: Path) -> None:
    """Control: a 61-line function is reported, a 60-line one is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n    return 0\n\ndef ok():\n{body}\n")
    assert long_functions(tmp_path, FUNCTION_LINES) == ["m.py:1 long: 61 lines"]
