"""The architecture page names only what exists: every file, folder and module it cites, and the tables it sends
a reader to (``COMMANDS``, ``REGISTRY``, ``FAST_PATHS``, ``ROUTES``).

A moved or renamed module makes this fail until the page follows it, so a newcomer's map cannot go stale.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("pipeline", "service", "training", "kernels", "tests", "scripts", "docs")

#: a cited path: `pipeline/job/engine.py`, `pipeline/output/`, `service/commands/exits.py`
PATH = re.compile(r"`((?:" + "|".join(PACKAGES) + r")/[\w./-]*)`")
#: a cited module: `pipeline.job.engine.Job`, `service.cli:main`, `training.train`
MODULE = re.compile(r"`((?:pipeline|service|training|kernels)\.[\w.]+)(?::\w+)?`")
#: a table the page sends a reader to, and the module that must define it
TABLES = {"COMMANDS": "service/cli.py", "REGISTRY": "pipeline/stages/__init__.py",
          "FAST_PATHS": "pipeline/fast/__init__.py", "ROUTES": "pipeline/fast/word_chain.py"}


def missing_paths(text: str, root: Path) -> list[str]:
    return sorted({p for p in PATH.findall(text) if not (root / p.rstrip("/")).exists()})


def missing_modules(text: str, root: Path) -> list[str]:
    """A dotted name is found when some prefix of it is a module file or package and the rest names
    something that module's source defines or imports (a class, a function, a table)."""
    missing = set()
    for dotted in MODULE.findall(text):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            base = root.joinpath(*parts[:cut])
            source = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
            if source.exists():
                rest = parts[cut:]
                if rest and rest[0] not in _defined(source):
                    missing.add(dotted)
                break
        else:
            missing.add(dotted)
    return sorted(missing)


def _defined(source: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def test_every_path_and_module_the_page_cites_exists() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert len(PATH.findall(text)) > 40, "the page cites the modules it describes"
    assert not missing_paths(text, ROOT), f"docs/architecture.md cites missing paths: {missing_paths(text, ROOT)}"
    assert not missing_modules(text, ROOT), f"docs/architecture.md cites missing modules: {missing_modules(text, ROOT)}"


def test_the_tables_the_page_names_are_where_it_says() -> None:
    text = PAGE.read_text(encoding="utf-8")
    for table, source in TABLES.items():
        assert f"`{table}`" in text
        assert table in _defined(ROOT / source), f"{table} is not defined in {source}"


def test_the_check_sees_a_stale_page(tmp_path: Path) -> None:
    """Control: a moved module and a renamed class are both reported."""
    (tmp_path / "pipeline" / "job").mkdir(parents=True)
    (tmp_path / "pipeline" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "job" / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "job" / "engine.py").write_text("class Job:\n    pass\n")
    text = ("`pipeline/job/engine.py` `pipeline/job/output_dir.py` "
            "`pipeline.job.engine.Job` `pipeline.job.engine.Runner`")
    assert missing_paths(text, tmp_path) == ["pipeline/job/output_dir.py"]
    assert missing_modules(text, tmp_path) == ["pipeline.job.engine.Runner"]
