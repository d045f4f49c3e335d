"""How much of the product mypy checks: the files and lines that ``[tool.mypy] files`` names, over every product file.

The product is every ``.py`` file under ``pipeline/``, ``service/``, ``training/`` and ``kernels/``; a line is a
non-blank line (blank lines say nothing either way). A file is covered when ``files`` names it or a folder above it
and no ``exclude`` pattern matches it, as mypy itself reads the two settings. Read from the sources and the
configuration only: mypy is not run (``make test`` runs it; this says what that run covers).

    python scripts/type_coverage.py 90          # exit 1 when under 90 % of the product's lines are covered
    python scripts/type_coverage.py 90 --list   # ... and name the files left out
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
#: the folders whose Python is the product (tests, bench and scripts are not)
PRODUCT = ("pipeline", "service", "training", "kernels", "tokenmill")


@dataclass(frozen=True)
class Coverage:
    files: int
    files_covered: int
    lines: int
    lines_covered: int
    #: per product folder: (lines covered, lines)
    by_folder: dict[str, tuple[int, int]]
    #: product files mypy does not check, relative to the root
    left_out: list[str]

    @property
    def percent(self) -> float:
        return 100.0 * self.lines_covered / self.lines if self.lines else 100.0


def mypy_settings(root: Path) -> tuple[list[str], list[str]]:
    """``files`` and ``exclude`` (a pattern or a list of them) of ``[tool.mypy]`` in ``root/pyproject.toml``."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8")).get("tool", {}).get("mypy", {})
    files = config.get("files", [])
    exclude = config.get("exclude", [])
    return ([files] if isinstance(files, str) else list(files)), ([exclude] if isinstance(exclude, str) else exclude)


def non_blank_lines(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def is_covered(rel: str, files: list[str], exclude: list[str]) -> bool:
    """Whether mypy, given ``files`` and ``exclude``, checks the file at ``rel`` (a POSIX path below the root)."""
    named = [PurePosixPath(f).as_posix() for f in files]  # "./pipeline/" is "pipeline"
    return any(rel == f or f == "." or rel.startswith(f + "/") for f in named) and not any(
        re.search(pattern, rel) for pattern in exclude) and not any(re.search(pattern, rel) for pattern in exclude)


def measure(root: Path) -> Coverage:
    files, exclude = mypy_settings(root)
    by_folder: dict[str, tuple[int, int]] = {}
    left_out: list[str] = []
    n_files = n_covered = 0
    for folder in PRODUCT:
        covered_lines = total_lines = 0
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            lines = non_blank_lines(path)
            n_files += 1
            total_lines += lines
            if is_covered(rel, files, exclude):
                n_covered += 1
                covered_lines += lines
            else:
                left_out.append(rel)
        by_folder[folder] = (covered_lines, total_lines)
    return Coverage(n_files, n_covered, sum(t for _, t in by_folder.values()),
                    sum(c for c, _ in by_folder.values()), by_folder, left_out)


def report(cov: Coverage, show_files: bool) -> str:
    out = [f"mypy covers {cov.files_covered} of {cov.files} product files, {cov.lines_covered} of {cov.lines} "
           f"non-blank lines ({cov.percent:.1f} %)"]
    for folder, (covered, total) in cov.by_folder.items():
        share = 100.0 * covered / total if total else 100.0
        out.append(f"  {folder + '/':<10} {covered:>6} of {total:>6} lines ({share:.1f} %)")
    if show_files and cov.left_out:
        out.append("left out:")
        out.extend(f"  {rel}" for rel in cov.left_out)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("threshold", type=float, help="the least share of product lines covered, in percent")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (its pyproject.toml and product)")
    parser.add_argument("--list", action="store_true", help="name the product files mypy does not check")
    args = parser.parse_args(argv)
    cov = measure(args.root)
    print(report(cov, args.list))
    if cov.percent < args.threshold:
        print(f"under the threshold of {args.threshold:g} %", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
