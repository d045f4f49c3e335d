"""``--set key.path=value``: change one field of a spec file from the command line, before it is validated.

An override edits the spec's data, so the result is checked, hashed and recorded like a spec that had the value in
its file: the same checks (a bad value is refused at its field), the same spec hash when the value equals the
file's, another one when it does not. Path segments are mapping keys or list indices (``stages.2.params.min_words``);
the value is read as YAML, as the spec file is (``true``, ``3``, ``0.5``, ``[a, b]``, ``null``; a quoted string stays
a string). A key that does not exist is added, for the schema to refuse by name when the spec has no such field.
A relative path given in a value resolves against the current folder (the command line's), not the spec's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.nesting import Loader
from pipeline.preflight import checked
from pipeline.problems import SPEC_FILE, Loc, Problem, SpecError
from pipeline.spec import JobSpec, Lines, parse_spec, read_spec_file, resolve_paths, with_lines


@dataclass(frozen=True)
class Override:
    """One ``--set``: the text as given (what an error quotes), the field's path and the value."""

    text: str
    path: tuple[str, ...]
    value: Any

    def fail(self, why: str) -> SpecError:
        """The one-line problem of this flag (shown as written: ``--set a.b=1: why``)."""
        return SpecError.one((), f"--set {self.text}: {why}", SPEC_FILE)


def parse_override(text: str) -> Override:
    """``key.path=value`` as an :class:`Override`; :class:`SpecError` for text that is not one."""
    key, eq, raw = text.partition("=")
    path = tuple(key.strip().split("."))
    if not eq or not all(path):
        raise SpecError.one((), f"--set {text}: expected key.path=value (e.g. execution.parallelism=4)", SPEC_FILE)
    try:
        value = yaml.load(raw, Loader=Loader) if raw.strip() else None  # noqa: S506 - Loader is a SafeLoader
    except yaml.YAMLError as exc:
        why = str(getattr(exc, "problem", None) or exc).splitlines()[0]
        raise SpecError.one((), f"--set {text}: the value is not YAML: {why}", SPEC_FILE) from None
    return Override(text, path, value)


def apply_override(data: dict[str, Any], o: Override) -> Loc:
    """Set ``o``'s field in ``data`` (in place), adding missing mappings on the way; returns the field's loc
    (list indices as ints). :class:`SpecError` for a path through a list by a name or an index it does not
    have, or through a value that is neither a mapping nor a list."""
    node: Any = data
    loc: list[str | int] = []
    for i, seg in enumerate(o.path):
        last = i == len(o.path) - 1
        where = ".".join(str(p) for p in loc) or "the spec"
        if isinstance(node, list):
            if not seg.isdigit() or int(seg) >= len(node):
                raise o.fail(f"{where} has {len(node)} entries" + ("" if seg.isdigit() else
                                                                   f"; {seg!r} is not an index (0, 1, ...)"))
            key: str | int = int(seg)
        elif isinstance(node, dict):
            key = seg
            if not last and key not in node:
                node[key] = {}
        else:
            raise o.fail(f"{where} is {type(node).__name__} {node!r}, not a mapping or a list")
        loc.append(key)
        if last:
            node[key] = o.value
        else:
            node = node[key]
    return tuple(loc)


def overridden(path: str | Path, sets: list[str]) -> tuple[Any, Lines, dict[Loc, str]]:
    """The spec file's data (as :func:`pipeline.spec.read_spec_file` reads it) with every ``--set`` of ``sets``
    applied in order, the YAML lines of the fields the file still decides, and the ``--set`` of each field set."""
    data, lines = read_spec_file(Path(path))
    overrides = [parse_override(s) for s in sets]
    if overrides and not isinstance(data, dict):
        raise SpecError.one((), f"{path}: not a mapping, nothing to --set", SPEC_FILE)
    given = {apply_override(data, o): o.text for o in overrides}
    if given:
        resolve_paths(data, Path.cwd())  # only the paths a --set gave are still relative
    return data, {loc: n for loc, n in lines.items() if _set_by(loc, given) is None}, given


def _set_by(loc: Loc, given: dict[Loc, str]) -> str | None:
    """The ``--set`` that gave the field at ``loc`` or one above it, if one did."""
    return next((text for at, text in given.items() if loc[:len(at)] == at), None)


def load_spec_with(path: str | Path, sets: list[str], check_files: bool = True) -> JobSpec:
    """The spec file at ``path`` with ``sets`` applied, validated; each problem with its YAML line, or the
    ``--set`` that gave its field. With ``check_files`` also checked against the filesystem
    (:func:`pipeline.preflight.checked`, what ``run`` does; ``submit`` leaves that to the server)."""
    data, lines, given = overridden(path, sets)
    try:
        return checked(data) if check_files else parse_spec(data)
    except SpecError as exc:
        raise SpecError([with_lines([p], lines)[0] if by is None else Problem(p.loc, f"{p.msg} (--set {by})", p.kind)
                         for p in exc.problems for by in [_set_by(p.loc, given)]]) from None


def quick_look(data: dict[str, Any], limit: int) -> dict[str, Any]:
    """``tokenmill run --limit N`` on a spec's ``data`` (in place): every input's first ``limit`` documents
    (``inputs[].limit``), written to ``OUTPUT.limit-N`` beside the output and replaced on each run (a scratch folder,
    so the real output is neither touched nor claimed; a folder tokenmill did not write is still refused there)."""
    for inp in data["inputs"]:
        inp["limit"] = limit
    data["output"]["path"] = f"{data['output']['path'].rstrip('/')}.limit-{limit}"
    data["output"]["overwrite"] = True
    return data
