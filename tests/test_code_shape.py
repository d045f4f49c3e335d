"""Functions stay short (issues 21 and 38): read from the source, nothing imported.

``pipeline/job/engine.py`` holds the order of the phases, resume, cancel and failure translation, and every
phase lives in a module of its own. Across the product (``pipeline``, ``service``, ``training``, ``kernels``'
Python) no function runs past a screen: a longer one is a phase, a parser or a scheduler creeping back into one
place, and is split into named steps.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "pipeline" / "job"
#: the product's packages whose every function the length limit applies to
PRODUCT = ("pipeline", "service", "training", "kernels", "tokenmill")
ENGINE_LINES = 200
FUNCTION_LINES = 60


def long_functions(folder: Path, limit: int) -> list[str]:
    """``path:line name: N lines`` of every function (methods and nested ones too) below ``folder`` over ``limit``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(folder).as_posix()}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_the_engine_is_a_short_sequencer() -> None:
    lines = len((JOB / "engine.py").read_text().splitlines())
    assert lines <= ENGINE_LINES, f"pipeline/job/engine.py has {lines} lines (at most {ENGINE_LINES})"


def test_no_function_in_the_product_is_long() -> None:
    found = [f"{package}/{f}" for package in PRODUCT for f in long_functions(ROOT / package, FUNCTION_LINES)]
    assert not found, "functions over the limit:\n" + "\n".join("  " + f for f in found)


def test_the_length_check_sees_a_long_function(tmp_path: Path) -> None:
    """Control: a 61-line function is reported, a 60-line one is not, in a subfolder too."""
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.py").write_text(f"def long():\n{body}\n    return 0\n\ndef ok():\n{body}\n")
    assert long_functions(tmp_path, FUNCTION_LINES) == ["sub/m.py:1 long: 61 lines"]
