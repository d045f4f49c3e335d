"""Which files an input names (a file, a folder, or a glob) and which reader a file needs."""

from __future__ import annotations

import glob
import os

from pipeline.spec import InputSpec

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
WARC_SUFFIXES = (".warc", ".wet", ".arc")
COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd")


def expand_path(path: str) -> list[str]:
    """The regular files ``path`` names, sorted and de-duplicated; [] when it matches nothing."""
    path = os.path.expanduser(path)
    matches = glob.glob(path, recursive=True) if glob.has_magic(path) else [path]
    files: dict[str, str] = {}
    for match in matches:
        if os.path.isdir(match):
            for root, dirs, names in os.walk(match):
                dirs.sort()
                for name in names:
                    full = os.path.join(root, name)
                    if os.path.isfile(full):
                        files.setdefault(os.path.normpath(full), full)
        elif os.path.isfile(match):
            files.setdefault(os.path.normpath(match), match)
    return [files[key] for key in sorted(files)]


def expand_inputs(inputs: list[InputSpec]) -> list[tuple[int, InputSpec, str]]:
    """``(file_index, input, path)`` for every file of every input, in input order then path order."""
    out: list[tuple[int, InputSpec, str]] = []
    for spec in inputs:
        for path in expand_path(spec.path):
            out.append((len(out), spec, path))
    return out


def source_name(input_path: str, path: str) -> str:
    """``path`` relative to the input that named it, with ``/`` separators: default ids are built from it.

    For a folder input, the path below the folder (``sub/doc.txt``); for a glob, the path below its
    fixed leading folders (``data/**/*.txt`` gives ``a/doc.txt``); for a single file, its name. So two
    files of one input never share a name, and no path of this machine ends up in an id.
    """
    root = os.path.expanduser(input_path)
    if glob.has_magic(root):
        while glob.has_magic(root):
            root = os.path.dirname(root)
    elif os.path.normpath(root) == os.path.normpath(path):
        return os.path.basename(path)
    rel = os.path.relpath(path, root or os.curdir)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):  # not below the input: not expected for
        return os.path.basename(path)  # files from expand_path, and a name is still better than an error
    return rel.replace(os.sep, "/")


def detect_format(path: str, declared: str) -> str:
    """The declared format, or for ``auto`` the one the file name says (text when it says nothing)."""
    if declared != "auto":
        return declared
    name = os.path.basename(path).lower()
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            break
    else:
        base, suffix = name, ""
    if base.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if base.endswith(WARC_SUFFIXES) and suffix in ("", ".gz"):
        return "warc"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"
