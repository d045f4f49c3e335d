"""The import graph of our packages, read from the source (ast: nothing is imported or run).

Every ``import`` and ``from ... import`` counts: at module level, under ``if TYPE_CHECKING``, and inside
functions (a deferred import still ties two modules together). The rules:

- Data flow one way, ``service -> pipeline -> kernels`` and ``training -> kernels``. ``training`` reads shard sets
  through the shard contract only (:data:`CONTRACT`: ``pipeline.shard_format``, the mixture contract
  ``pipeline.mixture_format``, the storage-by-URI layer ``pipeline.storage``, and the reading side
  ``pipeline.shard_source``, ``pipeline.shard_reader``, ``pipeline.mixture_source``), which imports nothing else
  of ours. ``pipeline`` never imports ``training``, and neither does ``service``: the control plane reads a
  shard set or a mixture through that same contract and writes one with ``pipeline.output``, never the trainer.
- Inside ``pipeline``, the engine (``pipeline.job``) is on top: it runs the readers, stages, output and card, and
  nothing else in ``pipeline`` imports it (an output is written and committed by ``pipeline.output``, which the
  card uses too). A stage (``pipeline.stages``) gets documents and never imports a reader (``pipeline.readers``);
  what both need of a document is in ``pipeline.documents``.
- ``tokenmill`` (the library facade: ``tokenmill.run``, ``tokenmill.apply``) sits beside ``service``, over
  ``pipeline``: it reaches the engine through ``pipeline.job.engine`` (and its errors) only, never imports the
  control plane or the trainer, and nothing of ours imports it (a stage written outside may).
- No two modules of ``pipeline``, ``service`` or ``tokenmill``, nor two subpackages of ``service``, import each
  other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "service", "kernels", "training", "tokenmill")
#: packages whose modules must not import each other in a circle
ACYCLIC = ("pipeline", "service", "tokenmill")
#: what the library facade may import of the engine
ENGINE_ENTRY = ("pipeline.job.engine", "pipeline.job.errors")
#: the modules of pipeline that training may import; they import nothing of ours beyond each other
CONTRACT = ("pipeline.shard_format", "pipeline.mixture_format", "pipeline.storage", "pipeline.shard_source",
            "pipeline.shard_reader", "pipeline.mixture_source")
#: (importer package, imported module prefix, allowed exceptions): an import against the flow of data. A module
#: importing inside the prefix it belongs to is not one (``pipeline.job.write -> pipeline.job.tasks``).
UPWARD = (
    ("pipeline", "service", ()),
    ("pipeline", "training", ()),
    # the engine runs everything else in pipeline; nothing else there reaches back into it
    ("pipeline", "pipeline.job", ()),
    # a stage gets documents, never a file
    ("pipeline.stages", "pipeline.readers", ()),
    ("kernels", "pipeline", ()),
    ("kernels", "service", ()),
    ("kernels", "training", ()),
    # the loader reads what the writer wrote, by the same URIs (local, s3://...): the shard contract and storage
    ("training", "pipeline", CONTRACT),
    ("training", "service", ()),
    # the control plane reads and writes shard sets and mixtures through pipeline, never through the trainer
    ("service", "training", ()),
    # the library facade is on top, beside the control plane: nothing of ours imports it
    ("pipeline", "tokenmill", ()),
    ("service", "tokenmill", ()),
    ("kernels", "tokenmill", ()),
    ("training", "tokenmill", ()),
    # ...and it runs a job through the engine's entry, not its phases
    ("tokenmill", "pipeline.job", ENGINE_ENTRY),
    ("tokenmill", "service", ()),
    ("tokenmill", "training", ()),
)


@dataclass
class ImportGraph:
    """``edges[a]``: the modules of ours that module ``a`` imports (anywhere in its source)."""

    modules: set[str]
    edges: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def read(cls, root: Path, packages: Iterable[str] = PACKAGES) -> ImportGraph:
        files = {_module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
        graph = cls(set(files))
        for name, path in files.items():
            is_package = path.name == "__init__.py"
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            graph.edges[name] = {t for t in graph._targets(tree, name, is_package) if t != name}
        return graph

    def _targets(self, tree: ast.AST, name: str, is_package: bool) -> Iterator[str]:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self._known(alias.name)
                    if target:
                        yield target
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, is_package)
                for alias in node.names:
                    # ``from pkg import submodule`` imports the submodule; ``from mod import symbol`` the module
                    target = self._known(f"{base}.{alias.name}") if alias.name != "*" else None
                    target = target or self._known(base)
                    if target:
                        yield target

    def _known(self, dotted: str) -> str | None:
        """The most specific module of ours that ``dotted`` names (``a.b.c`` -> ``a.b`` when c is a symbol)."""
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            candidate = ".".join(parts[:n])
            if candidate in self.modules:
                return candidate
        return None

    def collapsed(self, depth: int, prefix: str) -> dict[str, set[str]]:
        """The graph of the modules under ``prefix``, each named by its first ``depth`` components
        (``service.api.routers.jobs`` -> ``service.api`` at depth 2)."""
        def head(m: str) -> str:
            return ".".join(m.split(".")[:depth])

        out: dict[str, set[str]] = {}
        for a, targets in self.edges.items():
            if not _under(a, prefix):
                continue
            out.setdefault(head(a), set()).update(head(b) for b in targets if _under(b, prefix) and head(b) != head(a))
        return out


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The module a ``from`` import reads from, relative imports resolved against the importer."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if is_package else name.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@dataclass(frozen=True, order=True)
class Knot:
    """Modules that all reach each other through imports (a strongly connected component), and one
    shortest circle through the first of them, ``[a, b, ..., a]``."""

    circle: list[str]
    members: list[str]

    def __str__(self) -> str:
        more = [m for m in self.members if m not in self.circle]
        return " -> ".join(self.circle) + (f"  (same knot: {', '.join(more)})" if more else "")


def cycles(edges: dict[str, set[str]], among: Iterable[str] = ("",)) -> list[Knot]:
    """Every knot of more than one module under one of the prefixes ``among`` ("" for all), sorted."""
    keep = {a for a in edges if any(p == "" or _under(a, p) for p in among)}
    graph = {a: sorted(b for b in edges[a] if b in keep) for a in sorted(keep)}
    return sorted(Knot(_circle(graph, c[0], set(c)), c) for c in _components(graph) if len(c) > 1)


def _components(graph: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative: no recursion limit on long chains)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                out.append(sorted(component))
    return out


def _circle(graph: dict[str, list[str]], start: str, component: set[str]) -> list[str]:
    """A shortest path from ``start`` back to itself inside its component (breadth first)."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in graph[v]:
                if w not in component:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a component but on no circle")


def upward(graph: ImportGraph, rules: Iterable[tuple[str, str, tuple[str, ...]]] = UPWARD) -> list[str]:
    """``importer -> imported`` for every import against the flow of data."""
    found = []
    for a, targets in graph.edges.items():
        for b in targets:
            for src, dst, allowed in rules:
                if (_under(a, src) and _under(b, dst) and not _under(a, dst)
                        and not any(_under(b, ok) for ok in allowed)):
                    found.append(f"{a} -> {b}")
    return sorted(found)


def _report(title: str, knots: list[Knot]) -> str:
    return f"{title}:\n" + "\n".join(f"  {k}" for k in knots)


# ---- the project -------------------------------------------------------------------------------------


def test_no_module_cycles() -> None:
    found = cycles(ImportGraph.read(ROOT).edges, ACYCLIC)
    assert not found, _report("modules importing each other in a circle", found)


def test_no_upward_imports() -> None:
    found = upward(ImportGraph.read(ROOT))
    assert not found, "imports against the flow of data:\n" + "\n".join("  " + f for f in found)


def test_the_shard_contract_stands_alone() -> None:
    """What training may import of pipeline imports nothing else of ours: no way round the rule above."""
    graph = ImportGraph.read(ROOT)
    beyond = sorted(f"{m} -> {b}" for m in CONTRACT for b in graph.edges.get(m, ())
                    if any(_under(b, p) for p in PACKAGES) and not any(_under(b, ok) for ok in CONTRACT))
    assert not beyond, "the shard contract imports more of ours:\n" + "\n".join("  " + f for f in beyond)


def test_no_service_subpackage_cycles() -> None:
    found = cycles(ImportGraph.read(ROOT).collapsed(2, "service"))
    assert not found, _report("subpackages of service importing each other", found)


def test_graph_reads_the_project() -> None:
    """The graph is not empty by accident: known imports of each kind are in it."""
    graph = ImportGraph.read(ROOT)
    assert "pipeline.shard_format" in graph.edges["training.data"]  # module level, from a.b import symbol
    assert "pipeline.dedup.near_tasks" in graph.edges["pipeline.dedup.near"]  # inside a method
    assert "pipeline.dedup.graph" in graph.edges["pipeline.dedup.distributed"]  # from pkg import submodule


# ---- the detector itself, on a made-up tree -----------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_detector_on_a_synthetic_tree(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pipeline/__init__.py": "",
        "pipeline/shard_format.py": "",
        "pipeline/a.py": "from pipeline import b\n",  # from a package, a submodule
        "pipeline/b.py": "def f():\n    from .a import x\n",  # relative, inside a function
        "pipeline/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import service.api.r\n",
        "pipeline/sub/__init__.py": "from .d import y\n",  # relative from a package's __init__
        "pipeline/sub/d.py": "from .. import shard_format\n",
        "kernels/__init__.py": "",
        "kernels/k.py": "import numpy\nfrom pipeline.a import z\n",
        "training/__init__.py": "",
        "training/ok.py": "from pipeline.shard_format import HEADER\nfrom pipeline import shard_format\n",
        "training/bad.py": "from pipeline.sub import d\n",
        "service/__init__.py": "",
        "service/api/__init__.py": "",
        "service/api/r.py": "from service.schedules.s import f\n",
        "service/schedules/__init__.py": "",
        "service/schedules/s.py": "def g():\n    from ..api import q\n",  # q: a symbol of service.api
    })
    graph = ImportGraph.read(tmp_path)
    assert graph.edges["pipeline.sub"] == {"pipeline.sub.d"}
    assert graph.edges["pipeline.sub.d"] == {"pipeline.shard_format"}
    assert graph.edges["service.schedules.s"] == {"service.api"}
    assert [k.circle for k in cycles(graph.edges, ACYCLIC)] == [["pipeline.a", "pipeline.b", "pipeline.a"]]
    assert upward(graph) == ["kernels.k -> pipeline.a", "pipeline.c -> service.api.r", "training.bad -> pipeline.sub.d"]
    service = cycles(graph.collapsed(2, "service"))
    assert [k.circle for k in service] == [["service.api", "service.schedules", "service.api"]]


def test_detector_rules_inside_pipeline_and_from_service(tmp_path: Path) -> None:
    """The engine is imported by nothing else in pipeline (but by itself), a stage imports no reader, and
    neither service nor pipeline imports the trainer."""
    _write(tmp_path, {
        "pipeline/__init__.py": "",
        "pipeline/job/__init__.py": "",
        "pipeline/job/engine.py": "from pipeline.job import tasks\nfrom pipeline.output import store\n",
        "pipeline/job/tasks.py": "",
        "pipeline/output/__init__.py": "",
        "pipeline/output/store.py": "",
        "pipeline/card/__init__.py": "",
        "pipeline/card/cli.py": "from pipeline.job.engine import run\n",
        "pipeline/readers/__init__.py": "",
        "pipeline/readers/docs.py": "",
        "pipeline/stages/__init__.py": "",
        "pipeline/stages/normalize.py": "from pipeline.readers.docs import is_blank\n",
        "pipeline/shard_source.py": "",
        "pipeline/mix.py": "def f():\n    import training.data\n",
        "service/__init__.py": "",
        "service/mix.py": "from pipeline.shard_source import ShardSource\nfrom training.data import LoaderError\n",
        "training/__init__.py": "",
        "training/data.py": "from pipeline.shard_source import ShardSource\n",
    })
    assert upward(ImportGraph.read(tmp_path)) == [
        "pipeline.card.cli -> pipeline.job.engine", "pipeline.mix -> training.data",
        "pipeline.stages.normalize -> pipeline.readers.docs", "service.mix -> training.data"]


def test_detector_rules_of_the_library_facade(tmp_path: Path) -> None:
    """tokenmill imports pipeline and the engine's entry, nothing reaches back into it, and it skips the engine's
    phases, the control plane and the trainer."""
    _write(tmp_path, {
        "pipeline/__init__.py": "",
        "pipeline/spec.py": "",
        "pipeline/job/__init__.py": "",
        "pipeline/job/engine.py": "",
        "pipeline/job/errors.py": "",
        "pipeline/job/graph.py": "",
        "pipeline/demo.py": "import tokenmill\n",
        "service/__init__.py": "",
        "service/cli.py": "from tokenmill.running import run\n",
        "training/__init__.py": "",
        "training/train.py": "",
        "tokenmill/__init__.py": "from pipeline import spec\nfrom pipeline.job.errors import JobError\n",
        "tokenmill/running.py": "def f():\n    from pipeline.job.engine import Job\n",
        "tokenmill/deep.py": "from pipeline.job.graph import build_graph\nimport service.cli\nimport training.train\n",
    })
    assert upward(ImportGraph.read(tmp_path)) == [
        "pipeline.demo -> tokenmill", "service.cli -> tokenmill.running", "tokenmill.deep -> pipeline.job.graph",
        "tokenmill.deep -> service.cli", "tokenmill.deep -> training.train"]


def test_cycle_report_is_a_closed_path() -> None:
    edges = {"m.a": {"m.b"}, "m.b": {"m.c", "m.f"}, "m.c": {"m.a", "m.d"}, "m.d": set(), "m.e": {"m.e"},
             "m.f": {"m.b"}}
    (knot,) = cycles(edges)
    assert knot.circle == ["m.a", "m.b", "m.c", "m.a"]
    assert knot.members == ["m.a", "m.b", "m.c", "m.f"]
    assert str(knot) == "m.a -> m.b -> m.c -> m.a  (same knot: m.f)"
