"""Which files an input names (a file, a folder, or a glob) and which reader a file needs.

Folders and globs are walked here rather than by ``glob.glob(recursive=True)``, which follows symlinked
folders into loops (``self -> .`` made every file appear 41 times; two loops never ended). The rules:

- A symlink to a file is read like the file. A symlink to a folder is followed once: a folder already
  entered (by any route, for the same part of a pattern) is not entered again, and a link to the folder
  that holds it or to one of its ancestors (a loop) is not followed. A link to a folder elsewhere (outside
  the input) is read once, under the link's path. A file reached by several routes (links, hard links)
  is listed once, under the smallest path.
- Glob wildcards do not match names starting with ``.`` and ``**`` does not descend into them (as in
  :mod:`glob`); a folder named by an input, or matched by a pattern, is read whole, hidden files included.
- Nothing is skipped without a count: a folder that cannot be listed and an entry that cannot be
  examined (no permission, a broken symlink) are still listed, and :func:`pipeline.readers.read_file`
  turns them into one ``unreadable_folder`` / ``unreadable_file`` drop each. Only special files
  (FIFOs, sockets, devices, which would block or never end) are left out.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import os
import stat
from collections.abc import Hashable

from pipeline import storage
from pipeline.spec import InputSpec

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
WARC_SUFFIXES = (".warc", ".wet", ".arc")
COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd")


def expand_path(path: str) -> list[str]:
    """The regular files ``path`` names, each real file once, sorted; [] when it matches nothing.

    Folders that cannot be listed and entries that cannot be examined are included (see the module
    docstring), so the read step can count them.
    """
    if storage.is_remote(path):  # an object store: a key, a prefix, or a glob over keys
        return storage.expand_remote(path)
    path = storage.local_path(path)
    walk = _Walk()
    if glob.has_magic(path):
        walk.pattern(*_split_pattern(path))
    else:
        walk.named(path)
    return walk.result()


def expand_inputs(inputs: list[InputSpec]) -> list[tuple[int, InputSpec, str]]:
    """``(file_index, input, path)`` for every file of every input, in input order then path order."""
    out: list[tuple[int, InputSpec, str]] = []
    for spec in inputs:
        for path in expand_path(spec.path):
            out.append((len(out), spec, path))
    return out


def _split_pattern(path: str) -> tuple[str, list[str]]:
    """``("data", ["**", "*.txt"])`` for ``data/**/*.txt``: the fixed leading folder and the rest."""
    parts = path.split(os.sep)
    first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    root = os.sep.join(parts[:first])
    if not root and path.startswith(os.sep):
        root = os.sep
    return root, [p for p in parts[first:] if p]


def _join(folder: str, name: str) -> str:
    return os.path.join(folder, name) if folder else name


def _kind(path: str) -> tuple[str, os.stat_result | None]:
    """``file``, ``dir``, ``special``, ``missing``, ``broken`` (a dangling link or a link cycle: a file
    that should be there and is not) or ``unreadable`` (there, but cannot be examined)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return ("broken" if os.path.islink(path) else "missing"), None
    except OSError as exc:
        return ("broken" if exc.errno == errno.ELOOP else "unreadable"), None
    except ValueError:  # a NUL byte in the name
        return "missing", None
    if stat.S_ISDIR(st.st_mode):
        return "dir", st
    if stat.S_ISREG(st.st_mode):
        return "file", st
    return "special", st


def _is_loop(link: str, folder: str) -> bool:
    """True when the symlink ``link`` inside ``folder`` leads to ``folder`` or to one of its ancestors."""
    target, here = os.path.realpath(link), os.path.realpath(folder)
    return here == target or here.startswith(target.rstrip(os.sep) + os.sep)


class _Walk:
    """The files found so far, keyed by real identity, and the folders entered (per pattern position)."""

    def __init__(self) -> None:
        self.found: dict[Hashable, str] = {}
        self.entered: set[tuple[int, int, int]] = set()

    def result(self) -> list[str]:
        return sorted(self.found.values(), key=os.path.normpath)

    def _add(self, key: Hashable, path: str) -> None:
        old = self.found.get(key)
        if old is None or os.path.normpath(path) < os.path.normpath(old):
            self.found[key] = path

    def _add_file(self, path: str, st: os.stat_result) -> None:
        self._add((st.st_dev, st.st_ino), path)

    def _add_unreadable(self, path: str) -> None:
        self._add(("unreadable", os.path.normpath(path)), path)

    def _enter(self, folder: str, st: os.stat_result, step: int) -> bool:
        """False when this folder was already entered at this pattern position (``-1``: read whole)."""
        key = (st.st_dev, st.st_ino, step)
        if key in self.entered:
            return False
        self.entered.add(key)
        return True

    def _list(self, folder: str) -> list[tuple[str, str]] | None:
        """``(name, path)`` of the folder's entries by name, or None (recorded) when it cannot be listed."""
        try:
            with os.scandir(folder or os.curdir) as entries:
                names = sorted(e.name for e in entries)
        except OSError:
            self._add_unreadable(folder or os.curdir)
            return None
        return [(name, _join(folder, name)) for name in names]

    def named(self, path: str) -> None:
        """A path named as is: a file, a folder (read whole), or nothing."""
        kind, st = _kind(path)
        if kind == "file" and st is not None:  # a file or a folder always has its stat
            self._add_file(path, st)
        elif kind == "dir" and st is not None:
            self.folder(path, st)
        elif kind in ("unreadable", "broken"):
            self._add_unreadable(path)

    def folder(self, top: str, st: os.stat_result) -> None:
        """Every file below ``top`` (depth first, by name; a stack, so depth is not bounded by recursion)."""
        stack = [(top, st)]
        while stack:
            folder, fst = stack.pop()
            if not self._enter(folder, fst, -1):
                continue
            entries = self._list(folder)
            subfolders: list[tuple[str, os.stat_result]] = []
            for _, path in entries or ():
                kind, est = _kind(path)
                if kind == "file" and est is not None:
                    self._add_file(path, est)
                elif kind in ("unreadable", "broken"):
                    self._add_unreadable(path)
                elif kind == "dir" and est is not None and not (os.path.islink(path) and _is_loop(path, folder)):
                    subfolders.append((path, est))
            stack.extend(reversed(subfolders))

    def pattern(self, root: str, segs: list[str]) -> None:
        """Paths below ``root`` matching ``segs`` segment by segment (``**``: zero or more folders)."""
        kind, st = _kind(root or os.curdir)
        if kind in ("unreadable", "broken"):
            self._add_unreadable(root or os.curdir)
        if kind != "dir" or st is None:
            return
        stack: list[tuple[str, os.stat_result, int]] = [(root, st, 0)]
        while stack:
            folder, fst, i = stack.pop()
            if not self._enter(folder, fst, i):
                continue
            seg, last = segs[i], i == len(segs) - 1
            if seg == "**" and last:  # a trailing ** names everything below
                self.folder(folder, fst)
                continue
            found: list[tuple[str, os.stat_result, int]] = []
            if seg == "**":
                found.append((folder, fst, i + 1))  # ** as zero folders
                candidates = self._children(folder, "*") or []
                nxt = i  # ... or as one more folder, still at **
            elif not glob.has_magic(seg):
                candidates, nxt = [_join(folder, seg)], i + 1
            else:
                candidates, nxt = self._children(folder, seg) or [], i + 1
            for path in candidates:  # (seg is not a trailing ** here)
                kind, est = _kind(path)
                if kind == "unreadable" or (kind == "broken" and last):  # a broken link on the way holds
                    self._add_unreadable(path)  # no folder to search; one in the last place names a lost file
                elif kind != "dir" or est is None:
                    if last and kind == "file" and est is not None:
                        self._add_file(path, est)
                elif os.path.islink(path) and _is_loop(path, folder):
                    continue
                elif last:
                    self.folder(path, est)
                else:
                    found.append((path, est, nxt))
            stack.extend(reversed(found))

    def _children(self, folder: str, seg: str) -> list[str] | None:
        """Entries whose name matches ``seg``; names starting with ``.`` only when ``seg`` does too."""
        entries = self._list(folder)
        if entries is None:
            return None
        hidden = seg.startswith(".")
        return [p for name, p in entries if (hidden or not name.startswith(".")) and fnmatch.fnmatchcase(name, seg)]


def source_name(input_path: str, path: str) -> str:
    """``path`` relative to the input that named it, with ``/`` separators: default ids are built from it.

    For a folder input, the path below the folder (``sub/doc.txt``); for a glob, the path below its
    fixed leading folders (``data/**/*.txt`` gives ``a/doc.txt``); for a single file, its name. So two
    files of one input never share a name, and no path of this machine ends up in an id.
    """
    if storage.is_remote(input_path):
        return _remote_source_name(input_path, path)
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


def _remote_source_name(input_path: str, path: str) -> str:
    """The key below the input's fixed prefix, as for local paths (no bucket name ends up in an id)."""
    root = input_path.rstrip("/")
    if glob.has_magic(root):
        root = root[: min(root.index(c) for c in "*?[" if c in root)].rsplit("/", 1)[0]
    elif root == path:
        return path.rsplit("/", 1)[-1]
    return path[len(root):].lstrip("/") if path.startswith(root + "/") else path.rsplit("/", 1)[-1]


#: names a folder or wildcard input reads as plain text without being told: prose, markup and source code
TEXT_SUFFIXES = (
    ".txt", ".text", ".md", ".markdown", ".rst", ".tex", ".org", ".adoc", ".htm", ".html", ".xml",
    ".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".cxx", ".hh", ".hpp", ".cs", ".java", ".kt", ".scala", ".go",
    ".rs", ".swift", ".m", ".js", ".jsx", ".ts", ".tsx", ".css", ".php", ".rb", ".pl", ".lua", ".r", ".jl",
    ".hs", ".ml", ".ex", ".erl", ".clj", ".sh", ".bash", ".sql", ".yaml", ".yml", ".toml", ".ini", ".cfg",
)
#: how much of a file without a suffix is looked at to call it text (no NUL, valid UTF-8)
SNIFF_BYTES = 8192


def detect_format(path: str, declared: str, named: bool = True) -> str:
    """The declared format, or for ``auto`` the one the file name says.

    A file the input names itself (``named``: its own path, or a glob ending in a literal suffix such as
    ``*.log``) is read as text when its name says nothing else. A file found in a folder or by a bare
    wildcard (``data/``, ``**``, ``part-*``) is read only when its name is a known format (JSONL, WARC,
    Parquet, :data:`TEXT_SUFFIXES`) or it has no suffix at all; anything else is ``unknown``: a staging
    file (``b.jsonl.next``) or a binary (``notes.bin``) left beside the data is counted, not read as a
    document. ``format: text`` on the input reads every file as text.
    """
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
    if named or base.endswith(TEXT_SUFFIXES) or not os.path.splitext(base)[1]:
        return "text"
    return "unknown"


def named_by(input_path: str, path: str) -> bool:
    """True when the input names ``path`` itself: its own path, or a glob whose last part ends in a literal
    suffix (``*.log``, ``**/*.md``); False for a file found in a folder or by a bare wildcard."""
    if storage.is_remote(input_path):
        pattern, same = input_path.rstrip("/"), input_path == path
    else:
        pattern = storage.local_path(input_path)
        same = os.path.normpath(pattern) == os.path.normpath(path)
    if same:
        return True
    last = pattern.rsplit("/", 1)[-1]
    if not glob.has_magic(last):
        return False  # a folder: read whole, by known formats only
    stem, dot, suffix = last.rpartition(".")
    return bool(dot and stem and suffix and not glob.has_magic(suffix))
