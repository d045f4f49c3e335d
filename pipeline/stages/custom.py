"""Stages from outside this repository: a ``module:Class`` in a spec, or an installed package's entry point.

A spec names a stage three ways, looked up in this order: a built-in (:data:`pipeline.stages.REGISTRY`), an
entry point of the group :data:`ENTRY_POINT_GROUP` (``name = "module:Class"`` in an installed package's
``pyproject.toml``), or a reference ``package.module:Class`` written in the spec itself. An entry point cannot
take a built-in's name, nor two packages one name: a spec naming such a stage is refused, naming both, rather
than running one of them by chance. Whatever way it came, the class must be a stage (a subclass of
:class:`~pipeline.stages.base.Stage` or :class:`~pipeline.stages.base.DatasetStage`); its ``Params`` is then
validated like a built-in's.

A reference is imported from the spec file's folder first (:func:`next_to_spec`), then from ``sys.path``
(``PYTHONPATH``, installed packages). Modules found in the spec's folder are not on a Ray worker's path: the
engine ships them by value (:func:`travelling_modules`); everything else must be importable on the workers
(a local Ray started by tokenmill inherits this process's environment, ``PYTHONPATH`` included).

Importing runs the module's code, so a service that takes specs from callers refuses references
(:func:`refuse_references`, set for each request): it runs built-in and installed stages only.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from pipeline.stages.base import DatasetStage, Stage

StageClass = type[Stage] | type[DatasetStage]

#: the entry-point group an installed package registers its stages in
ENTRY_POINT_GROUP = "tokenmill.stages"
#: a reference written in a spec: dotted module, a colon, a class name (the form entry points use)
REFERENCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")

#: why references are refused in this context (None: they are allowed)
_REFUSED: ContextVar[str | None] = ContextVar("tokenmill_stage_references_refused", default=None)
#: module name -> the folder of the spec file that named it: imported from there first
_FOLDERS: dict[str, Path] = {}
#: modules imported from a spec's folder, by name: the engine sends them to Ray workers by value
_TRAVELLING: dict[str, ModuleType] = {}


class StageLookupError(ValueError):
    """A stage name that names no usable stage; ``kind`` is the problem's type in a spec error."""

    def __init__(self, msg: str, kind: str):
        super().__init__(msg)
        self.kind = kind


@dataclass(frozen=True)
class EntryPoint:
    """One ``tokenmill.stages`` entry point: its name, ``module:Class`` and the distribution that declares it."""

    name: str
    value: str
    package: str


def is_reference(name: str) -> bool:
    """Whether a stage type is written as ``module:Class`` (built-ins and entry points are plain names)."""
    return ":" in name


@lru_cache(maxsize=1)
def installed() -> dict[str, tuple[EntryPoint, ...]]:
    """The ``tokenmill.stages`` entry points of the installed packages, by name (several: a clash). Read once per
    process: a package installed later is seen by the next process."""
    found: dict[str, dict[str, EntryPoint]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        package = getattr(dist, "name", None) or "an unknown package"
        found.setdefault(ep.name, {}).setdefault(ep.value, EntryPoint(ep.name, ep.value, package))
    return {name: tuple(by_value.values()) for name, by_value in found.items()}


def entry_point_class(name: str, builtin: bool) -> StageClass | None:
    """The class of entry point ``name`` (None: no package declares it); :class:`StageLookupError` when it clashes
    with a built-in (``builtin``) or another package's, or cannot be loaded."""
    eps = installed().get(name, ())
    if not eps:
        return None
    where = ", ".join(f"{ep.value} (package {ep.package})" for ep in eps)
    if builtin:
        raise StageLookupError(
            f"{name!r} is a built-in stage, and the {ENTRY_POINT_GROUP} entry point {where} takes the same name: "
            "an installed stage cannot replace a built-in; rename the entry point", "stage_clash")
    if len(eps) > 1:
        raise StageLookupError(f"{name!r} is declared by several {ENTRY_POINT_GROUP} entry points: {where}; "
                               "uninstall or rename all but one", "stage_clash")
    return load_class(eps[0].value, f"entry point {name!r} ({eps[0].package}): ")


def reference_class(name: str) -> StageClass:
    """The class a spec's ``module:Class`` names, imported from the spec's folder first; refused where
    :func:`refuse_references` says so."""
    refused = _REFUSED.get()
    if refused is not None:
        raise StageLookupError(f"{name!r}: {refused}", "stage_reference_refused")
    if not REFERENCE.match(name):
        raise StageLookupError(f"{name!r} is not a stage name nor a module:Class (e.g. mypkg.filters:MyFilter)",
                               "unknown_stage")
    return load_class(name)


def load_class(value: str, what: str = "") -> StageClass:
    """Import ``module:Class`` and check that it is a stage; one line naming what failed."""
    module_name, _, attr = value.partition(":")
    try:
        module = _import(module_name)
    except Exception as exc:  # the module's own code may raise anything: one line, not a traceback
        reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ImportError) else str(exc)
        raise StageLookupError(f"{what}cannot import {module_name}: {reason}", "stage_import") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise StageLookupError(f"{what}{module_name} has no {attr!r}", "stage_import")
    if not (isinstance(cls, type) and issubclass(cls, (Stage, DatasetStage))):
        raise StageLookupError(
            f"{what}{value} is not a stage: subclass pipeline.stages.Stage, FilterStage or DatasetStage",
            "not_a_stage")
    return cls


def _import(module_name: str) -> ModuleType:
    """``importlib.import_module``, with the spec's folder first on the path while it runs; what came from that
    folder is remembered for the workers (:func:`travelling_modules`)."""
    folder = _FOLDERS.get(module_name)
    if folder is None or module_name in sys.modules:
        return importlib.import_module(module_name)
    before = set(sys.modules)
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        module = importlib.import_module(module_name)
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)
    for name in set(sys.modules) - before:  # the module, and what it imported from the folder beside it
        file = getattr(sys.modules.get(name), "__file__", None)
        if "." not in name and isinstance(file, str) and _inside(file, folder) and not _found_elsewhere(name, file):
            _TRAVELLING[name] = sys.modules[name]
    return module


def _inside(file: str, folder: Path) -> bool:
    return os.path.realpath(file).startswith(os.path.realpath(folder) + os.sep)


def _found_elsewhere(name: str, file: str) -> bool:
    """Whether top-level module ``name`` (``file``) is found without the spec's folder on the path (an installed
    package, ``PYTHONPATH``): then a worker imports it as usual, and it need not travel."""
    for finder in sys.meta_path:
        try:
            spec = finder.find_spec(name, None)
        except (ImportError, AttributeError, ValueError):
            continue
        if spec is not None:
            origin = spec.origin if spec.origin not in (None, "namespace") else None
            return origin is not None and os.path.realpath(origin) == os.path.realpath(file)
    return False


def next_to_spec(stage_type: str, folder: str | os.PathLike[str]) -> None:
    """A spec file in ``folder`` names ``stage_type``: when it is a ``module:Class``, its module is imported from
    that folder first, now and on any later lookup in this process (a spec parsed again, the engine's)."""
    if is_reference(stage_type):
        _FOLDERS[stage_type.partition(":")[0]] = Path(folder)


def refuse_references(why: str) -> None:
    """Refuse ``module:Class`` references in this context from now on, saying ``why`` (a server's request)."""
    _REFUSED.set(why)


def travelling_modules() -> list[ModuleType]:
    """The top-level modules imported from a spec's folder in this process: not importable on a Ray worker, so
    the engine pickles them by value."""
    return list(_TRAVELLING.values())
