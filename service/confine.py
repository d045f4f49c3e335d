"""Which files a job submitted over the API may read and write: configured roots, checked on resolved paths.

The API checks a spec before it accepts it, and the job process checks it again just before it runs (the
filesystem may have changed in between). Rules:

- every path is absolute and has no ``..`` component (a spec over HTTP has no folder to be relative to);
- what a job reads (each input path or glob, ``tokenizer.path``, each stage's path parameters such as
  ``dedup_against``, the earlier outputs of ``output.card_compare``) must resolve (symlinks followed) inside a
  read root: the input roots or the output roots, since a job may read what an earlier job wrote
  (``format: documents``, a dedup index);
- for a glob or a folder, the fixed leading folders must resolve inside a root, and so must every file it
  matches now, so a symlink inside a root that points elsewhere (``/data/link -> /etc``) is refused;
- the output folder must resolve strictly inside an output root (never the root itself);
- a refusal names the path as the spec wrote it and the roots it must lie in, never where it leads (a link's
  target, the files a glob matched through it): those lie beyond the roots, and are not the client's to learn.

Roots and paths may also be object-store URIs (``s3://bucket/prefix``, :mod:`pipeline.storage`): a URI
path must lie below a URI root of the same scheme and bucket, compared by key prefix (an object store has
no symlinks to follow), and may not contain a ``..`` segment.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.readers.paths import expand_path
from pipeline.stages import stage_class
from pipeline.storage import is_remote


@dataclass(frozen=True)
class Roots:
    read: tuple[Path, ...]
    write: tuple[Path, ...]
    #: object-store roots (``s3://bucket/prefix``, no trailing slash)
    remote_read: tuple[str, ...] = ()
    remote_write: tuple[str, ...] = ()

    @classmethod
    def of(cls, input_roots: Iterable[str | os.PathLike[str]],
           output_roots: Iterable[str | os.PathLike[str]]) -> Roots:
        outs_all, ins_all = [os.fspath(p) for p in output_roots], [os.fspath(p) for p in input_roots]
        outs = tuple(_real(p) for p in outs_all if not is_remote(p))
        ins = tuple(_real(p) for p in ins_all if not is_remote(p))
        r_outs = tuple(p.rstrip("/") for p in outs_all if is_remote(p))
        r_ins = tuple(p.rstrip("/") for p in ins_all if is_remote(p))
        return cls(read=tuple(dict.fromkeys(ins + outs)), write=outs,
                   remote_read=tuple(dict.fromkeys(r_ins + r_outs)), remote_write=r_outs)

    def to_json(self) -> dict[str, list[str]]:
        return {"read": [str(p) for p in self.read], "write": [str(p) for p in self.write],
                "remote_read": list(self.remote_read), "remote_write": list(self.remote_write)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Roots:
        return cls(read=tuple(Path(p) for p in data["read"]), write=tuple(Path(p) for p in data["write"]),
                   remote_read=tuple(data.get("remote_read", ())), remote_write=tuple(data.get("remote_write", ())))


@dataclass(frozen=True)
class PathProblem:
    """One refused path: ``loc`` is its field path in the spec (``("inputs", 0, "path")``)."""

    loc: tuple[str | int, ...]
    msg: str

    def __str__(self) -> str:
        return f"{'.'.join(str(p) for p in self.loc)}: {self.msg}"


def problems(spec: Any, roots: Roots, expand: bool = True) -> list[PathProblem]:
    """Every path of ``spec`` (a :class:`pipeline.spec.JobSpec`) that falls outside ``roots``."""
    found: list[PathProblem] = []
    for i, inp in enumerate(spec.inputs):
        found += check_read(("inputs", i, "path"), inp.path, roots, expand)
    if spec.tokenizer is not None and spec.tokenizer.path:
        found += check_read(("tokenizer", "path"), spec.tokenizer.path, roots, expand=False)
    for i, stage in enumerate(spec.stages):
        for at, v in stage_path_values(stage.type, stage.params):
            if isinstance(v, str) and v:
                found += check_read(("stages", i, "params", *at), v, roots, expand)
    for i, earlier in enumerate(spec.output.card_compare):  # the card reads their stats.json
        found += check_read(("output", "card_compare", i), earlier, roots, expand=False)
    found += check_write(("output", "path"), spec.output.path, roots)
    return found


def stage_path_values(stage_type: str, params: dict[str, Any]) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """``(where below params, value)`` of each path a stage's params name (``Stage.path_params``; a list param
    gives one per item); KeyError for an unknown stage type."""
    for param in stage_class(stage_type).path_params:
        value = params.get(param)
        if isinstance(value, list):
            yield from (((param, k), v) for k, v in enumerate(value))
        else:
            yield (param,), value


def readable(raw: Any, roots: Roots) -> bool:
    """True when ``raw`` is a path a job may read (every file it matches now included)."""
    return isinstance(raw, str) and bool(raw) and not check_read(("path",), raw, roots, expand=True)


def _real(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(os.fspath(path)))


def _inside(path: Path, roots: Sequence[Path], strictly: bool = False) -> bool:
    return any(path.is_relative_to(root) and not (strictly and path == root) for root in roots)


def _shape(loc: tuple[str | int, ...], raw: str) -> PathProblem | None:
    if "\0" in raw:
        return PathProblem(loc, "contains a NUL byte")
    if not os.path.isabs(raw):
        return PathProblem(loc, f"{raw!r} must be an absolute path (the server resolves no relative path or ~)")
    if ".." in Path(raw).parts:
        return PathProblem(loc, f"{raw!r} may not contain '..'")
    return None


def _static_root(raw: str) -> tuple[str, bool]:
    """The fixed leading folders of a glob and whether it is one (``/d/*/x.jsonl`` -> ``/d``)."""
    parts = Path(raw).parts
    for i, part in enumerate(parts):
        if glob.has_magic(part):
            return str(Path(*parts[:i])), True
    return raw, False


def _names(roots: Sequence[Path]) -> str:
    return ", ".join(str(r) for r in roots) or "none configured"


def _uri_problem(loc: tuple[str | int, ...], raw: str, roots: tuple[str, ...], what: str,
                 strictly: bool = False) -> list[PathProblem]:
    """A URI inside a URI root, by key prefix; ``..`` segments refused (a store would not resolve them)."""
    if "\0" in raw:
        return [PathProblem(loc, "contains a NUL byte")]
    if ".." in raw.split("://", 1)[1].split("/"):
        return [PathProblem(loc, f"{raw!r} may not contain '..'")]
    root = raw
    for c in "*?[":
        root = root.split(c, 1)[0]
    if root != raw:
        root = root.rsplit("/", 1)[0]
    root = root.rstrip("/")
    if any(root.startswith(r + "/") or (root == r and not strictly) for r in roots):
        return []
    return [PathProblem(loc, f"{raw!r} is not inside {what} ({', '.join(roots) or 'no object-store root configured'})")]


def check_read(loc: tuple[str | int, ...], raw: str, roots: Roots, expand: bool) -> list[PathProblem]:
    if is_remote(raw):
        return _uri_problem(loc, raw, roots.remote_read, "the readable roots")
    bad = _shape(loc, raw)
    if bad:
        return [bad]
    root, is_glob = _static_root(raw)
    real = _real(root)
    if not _inside(real, roots.read):
        return [PathProblem(loc, _outside(raw, "the readable roots", roots.read, linked=str(real) != root))]
    if not expand or not (is_glob or real.is_dir()):
        return []
    if any(not _inside(_real(p), roots.read) for p in expand_path(raw)):
        return [PathProblem(loc, f"{raw!r} matches files outside the readable roots ({_names(roots.read)}) "
                                 "through a symbolic link; every file a job reads must lie inside them")]
    return []


def check_write(loc: tuple[str | int, ...], raw: str, roots: Roots) -> list[PathProblem]:
    if is_remote(raw):
        return _uri_problem(loc, raw, roots.remote_write, "an output root (the root itself is not allowed)",
                            strictly=True)
    bad = _shape(loc, raw)
    if bad:
        return [bad]
    real = _real(raw)
    if _inside(real, roots.write, strictly=True):
        return []
    msg = _outside(raw, "the output roots", roots.write, linked=str(real) != raw.rstrip("/"))
    return [PathProblem(loc, f"{msg}; a root itself is not allowed")]


def _outside(raw: str, what: str, roots: Sequence[Path], linked: bool) -> str:
    """The path as the spec wrote it and the roots it must lie in: never where it leads (a symlink's target, the
    files a glob matched there), which is beyond the roots and not the client's to learn."""
    return f"{raw!r} is outside {what} ({_names(roots)}){', symbolic links followed' if linked else ''}"
