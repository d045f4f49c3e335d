"""The fast-path registry (:data:`pipeline.fast.FAST_PATHS`) says what is true: each fast path's module exists and
its docstring states what it must equal and its test; the library it must equal is installed at a version its pin
(the one ``pyproject.toml`` states) allows; its fallback is an importable name; its difference test exists and
mentions it. The checker is run on made-up entries too, so that it is seen to fail."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from pipeline.fast import FAST_PATHS, FastPath, Reference
from tests.test_import_graph import ImportGraph

ROOT = Path(__file__).resolve().parent.parent


def pyproject_pins(root: Path = ROOT) -> dict[str, SpecifierSet]:
    """Every distribution ``pyproject.toml`` depends on (optional groups too) -> its version specifier."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = [project.get("dependencies", []), *project.get("optional-dependencies", {}).values()]
    pins: dict[str, SpecifierSet] = {}
    for line in (d for group in groups for d in group):
        req = Requirement(line)
        pins.setdefault(canonicalize_name(req.name), req.specifier)
    return pins


def resolve(name: str) -> object:
    """The object ``module:qualname`` names (imports the module)."""
    module, _, qualname = name.partition(":")
    obj: object = importlib.import_module(module)
    for part in qualname.split(".") if qualname else []:
        obj = getattr(obj, part)
    return obj


def _module_file(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin) if spec is not None and spec.origin else None


def _mentions(text: str, module: str) -> bool:
    """Whether a test's source names ``module``: dotted, or imported from its package."""
    package, _, leaf = module.rpartition(".")
    imported = rf"from {re.escape(package)} import [^\n]*\b{re.escape(leaf)}\b"
    return module in text or re.search(imported, text) is not None


def problems(path: FastPath, root: Path = ROOT, pins: dict[str, SpecifierSet] | None = None) -> list[str]:
    """What is wrong with one registry entry (nothing: an empty list)."""
    pins = pyproject_pins(root) if pins is None else pins
    out: list[str] = []
    try:
        source = _module_file(path.module)
    except ModuleNotFoundError:
        source = None
    if source is None or not source.is_file():
        return [f"{path.name}: no module {path.module}"]
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""
    if path.test not in doc:
        out.append(f"{path.name}: the docstring of {path.module} does not name its test {path.test}")
    ref = path.equals
    if ref.library is not None:
        want = pins.get(canonicalize_name(ref.library))
        if want is None or want != SpecifierSet(ref.pin):
            out.append(f"{path.name}: pin {ref.library}{ref.pin} is not pyproject's ({want})")
        try:
            version = importlib.metadata.version(ref.library)
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{path.name}: {ref.library} is not installed")
        else:
            if not SpecifierSet(ref.pin).contains(version, prereleases=True):
                out.append(f"{path.name}: {ref.library} {version} is installed, the pin is {ref.pin}")
        if ref.pin not in doc:
            out.append(f"{path.name}: the docstring of {path.module} does not state the pin {ref.pin}")
    for what, name in (("reference", ref.entry), ("fallback", path.fallback)):
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            out.append(f"{path.name}: {what} {name} is not importable ({exc})")
    test = root / path.test
    if not test.is_file():
        out.append(f"{path.name}: no test file {path.test}")
    elif not _mentions(test.read_text(encoding="utf-8"), path.module):
        out.append(f"{path.name}: {path.test} does not mention {path.module}")
    if path.bench is not None and not (root / path.bench).is_file():
        out.append(f"{path.name}: no bench {path.bench}")
    if not path.steps_aside.strip():
        out.append(f"{path.name}: no step-aside condition")
    return out


@pytest.mark.parametrize("path", FAST_PATHS, ids=lambda p: p.name)
def test_each_registered_fast_path_is_what_it_says(path: FastPath) -> None:
    assert problems(path) == []


def test_every_module_of_pipeline_fast_is_registered_once() -> None:
    names = [p.name for p in FAST_PATHS]
    assert len(names) == len(set(names))
    registered = {p.module for p in FAST_PATHS}
    modules = {f"pipeline.fast.{f.stem}" for f in (ROOT / "pipeline" / "fast").glob("*.py") if f.stem != "__init__"}
    assert modules <= registered, f"modules of pipeline/fast not in FAST_PATHS: {sorted(modules - registered)}"


def test_the_fast_paths_import_only_each_other_and_kernels() -> None:
    """pipeline/fast is a layer under the stages: what must equal a library depends on no stage, job or output."""
    graph = ImportGraph.read(ROOT)
    def under(module: str, *packages: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in packages)

    beyond = sorted(f"{a} -> {b}" for a, targets in graph.edges.items() if under(a, "pipeline.fast")
                    for b in targets if not under(b, "pipeline.fast", "kernels"))
    assert not beyond, "pipeline/fast imports more of ours:\n" + "\n".join(beyond)
    assert "kernels.fasttext_tokens" in graph.edges["pipeline.fast.fasttext_predict"]  # the graph is read


def test_the_guide_page_lists_every_fast_path() -> None:
    page = (ROOT / "docs" / "fast-paths.md").read_text(encoding="utf-8")
    for path in FAST_PATHS:
        module_file = path.module.replace(".", "/") + ".py"
        assert f"| `{path.name}` | `{module_file}`" in page, f"docs/fast-paths.md lacks {path.name}"
        assert f"`{path.test}`" in page


def test_the_checker_finds_what_is_wrong() -> None:
    """Control: entries that lie are reported, each for what is wrong with it."""
    good = next(p for p in FAST_PATHS if p.name == "byte_level_bpe")
    missing = FastPath("ghost", "pipeline.fast.no_such_module", good.equals, good.fallback, "never", good.test)
    assert problems(missing) == ["ghost: no module pipeline.fast.no_such_module"]

    wrong_pin = FastPath("bpe", good.module, Reference(good.equals.entry, "tokenizers", ">=99"), good.fallback,
                         good.steps_aside, good.test)
    found = problems(wrong_pin)
    assert any("is not pyproject's" in p for p in found)
    assert any("is installed, the pin is >=99" in p for p in found)
    assert any("does not state the pin >=99" in p for p in found)

    not_installed = Reference(good.equals.entry, "no-such-distribution", ">=1")
    found = problems(FastPath("bpe", good.module, not_installed, good.fallback, good.steps_aside, good.test))
    assert any("no-such-distribution is not installed" in p for p in found)

    bad_names = FastPath("bpe", good.module, Reference("tokenizers:NoSuchThing", "tokenizers", ">=0.20"),
                         "pipeline.fast.byte_level_bpe:Nowhere", good.steps_aside, good.test)
    found = problems(bad_names)
    assert any("reference tokenizers:NoSuchThing is not importable" in p for p in found)
    assert any("fallback pipeline.fast.byte_level_bpe:Nowhere is not importable" in p for p in found)

    other_test = FastPath("bpe", good.module, good.equals, good.fallback, good.steps_aside, "tests/test_minhash.py")
    found = problems(other_test)
    assert "bpe: tests/test_minhash.py does not mention pipeline.fast.byte_level_bpe" in found
    assert any("does not name its test tests/test_minhash.py" in p for p in found)

    no_test = FastPath("bpe", good.module, good.equals, good.fallback, " ", "tests/test_nothing_here.py",
                       "bench/nothing.py")
    assert set(problems(no_test)) >= {"bpe: no test file tests/test_nothing_here.py", "bpe: no bench bench/nothing.py",
                                      "bpe: no step-aside condition"}


def test_pins_are_read_from_pyproject(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["spacy>=3.8,<3.9", "Fast_Thing==1.0"]\n'
        '[project.optional-dependencies]\nextra = ["datasketch>=1.6"]\n', encoding="utf-8")
    assert pyproject_pins(tmp_path) == {"spacy": SpecifierSet(">=3.8,<3.9"), "fast-thing": SpecifierSet("==1.0"),
                                        "datasketch": SpecifierSet(">=1.6")}
