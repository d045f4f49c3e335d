"""Which team owns an output folder, and the spec paths that would touch another team's.

An output folder belongs to the team whose job first wrote it: the job's claim records the team in the folder's
marker (``.tokenmill/marker.json``, ``owner``; :meth:`pipeline.output.store.StoreBase.claim`). A folder
whose marker names no owner was written before teams (or by ``tokenmill run``): the default team's, as every
job made before teams is. A path is the team's of the nearest folder at or above it that holds a marker, so a
file inside an output (a shard, a dedup index, ``documents/``) is its owner's too.

Another team's folder may not be written (``output.path``, overwrite or not) nor read (an input, a
``dedup_against`` index, a ``card_compare`` output, a tokenizer file): the API refuses such a spec with 403 at
the field, and the job process checks ``output.path`` again before it starts (the engine's claim refuses a
marker naming another team). Object-store paths are not checked here (no marker is read over the network in a
request); their roots bound them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.output.local_store import OutputDir
from pipeline.problems import Loc, Problem
from pipeline.readers.paths import expand_path
from pipeline.storage import is_remote
from service import confine
from service.store.models import DEFAULT_TEAM

#: the kind of the problem a path of another team's gets
OTHER_TEAM = "owned_by_another_team"
#: files of a glob whose folders are looked at (the fixed part of the glob always is)
MAX_MATCHES = 1000


def owner_of(path: str) -> tuple[str, str] | None:
    """``(folder, team)`` of the output folder at or above ``path`` (resolved), else None."""
    here = Path(os.path.realpath(path))
    for folder in (here, *here.parents):
        if (folder / ".tokenmill" / "marker.json").is_file():
            marker = OutputDir(str(folder)).read_marker()
            if marker is not None:
                return str(folder), marker.get("owner", DEFAULT_TEAM)
    return None


def problems(spec: Any, writer: str | None, reader: str | None) -> list[Problem]:
    """One problem per path of ``spec`` (a :class:`pipeline.spec.JobSpec`) in another team's folder: written by
    ``writer``'s job (``output.path``), read by ``reader`` (None: may read every team's, an admin)."""
    found = []
    for loc, raw, writes in _paths(spec):
        team = writer if writes else reader
        if team is None or is_remote(raw):
            continue
        for candidate in _candidates(raw, expand=not writes):
            owned = owner_of(candidate)
            if owned is not None and owned[1] != team:
                what = "write into" if writes else "read"
                found.append(Problem(loc, f"{owned[0]} belongs to another team (its job wrote it first); "
                                          f"this team's jobs may not {what} it", OTHER_TEAM))
                break
    return found


def _paths(spec: Any) -> Iterator[tuple[Loc, str, bool]]:
    """``(field path, value, whether it is written)`` of every path the spec names."""
    for i, inp in enumerate(spec.inputs):
        yield ("inputs", i, "path"), inp.path, False
    if spec.tokenizer is not None and spec.tokenizer.path:
        yield ("tokenizer", "path"), spec.tokenizer.path, False
    for i, stage in enumerate(spec.stages):
        for at, v in confine.stage_path_values(stage.type, stage.params):
            if isinstance(v, str) and v:
                yield ("stages", i, "params", *at), v, False
    for i, earlier in enumerate(spec.output.card_compare):
        yield ("output", "card_compare", i), earlier, False
    yield ("output", "path"), spec.output.path, True


def _candidates(raw: str, expand: bool) -> Iterator[str]:
    """The path itself, or a glob's (a folder's) fixed folders and the files it matches now."""
    fixed, is_glob = confine._static_root(raw)
    yield fixed
    if expand and (is_glob or os.path.isdir(fixed)):
        seen = {fixed}
        for n, path in enumerate(expand_path(raw)):
            folder = os.path.dirname(path)
            if n >= MAX_MATCHES:
                break
            if folder not in seen:
                seen.add(folder)
                yield path
