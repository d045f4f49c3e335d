"""mypy covers the product (issue 38): ``scripts/type_coverage.py`` says how much, and fails under a threshold.

Read from the sources and ``[tool.mypy]`` only (mypy itself runs in ``make test``): the share of the product's
non-blank lines in the files mypy checks must be at least 90 %.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "type_coverage.py"
THRESHOLD = 90


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_mypy_covers_at_least_90_percent_of_the_product_lines() -> None:
    done = run(str(THRESHOLD), "--list")
    print(done.stdout)  # the figures, in the test log
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("mypy covers ")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_script_counts_non_blank_lines_and_fails_under_its_threshold(tmp_path: Path) -> None:
    # the control: a product of 4 non-blank lines, 3 of them in the files mypy checks (75 %)
    write(tmp_path / "pyproject.toml", '[tool.mypy]\nfiles = ["pipeline", "service/typed.py"]\nexclude = "_skip"\n')
    write(tmp_path / "pipeline" / "a.py", "x = 1\n\n\ny = 2\n")
    write(tmp_path / "pipeline" / "a_skip.py", "z = 3\n")  # excluded: not covered
    write(tmp_path / "service" / "typed.py", "\nw = 4\n")
    write(tmp_path / "training" / "b.py", "")  # no lines
    write(tmp_path / "bench" / "c.py", "not = product\n" * 50)  # outside the product
    passed = run("75", "--root", str(tmp_path), "--list")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "mypy covers 2 of 4 product files, 3 of 4 non-blank lines (75.0 %)" in passed.stdout
    assert "pipeline/a_skip.py" in passed.stdout.split("left out:")[1]
    failed = run("76", "--root", str(tmp_path))
    assert failed.returncode == 1
    assert "under the threshold of 76 %" in failed.stderr
