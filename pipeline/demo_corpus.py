"""A demo corpus of real text that every machine with Python already has, built on the spot.

Sources, all from the running interpreter's installation (nothing is downloaded or imported):
- ``metadata``: each installed distribution's METADATA header (name, summary, author, author e-mail...)
  and long description. Real e-mail addresses, for the PII stage.
- ``licenses``: LICENSE*/LICENCE*/COPYING*/NOTICE* files listed by the distributions' RECORDs. Many
  MIT/BSD/Apache texts differ only by a name or a year: real near-duplicates, for near dedup.
- ``docstrings``: module, class and function docstrings of the standard library and site-packages,
  read with ``ast`` (modules are parsed, never imported).

Deterministic for a given set of installed packages: everything is traversed in sorted order and the
gzip headers carry no time stamp. Run it with ``python -m pipeline.demo_corpus OUT [--max-bytes N]``.
"""

from __future__ import annotations

import argparse
import ast
import email.message
import gc
import gzip
import importlib.metadata as md
import json
import multiprocessing
import os
import re
import site
import sys
import sysconfig
import threading
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path, PurePosixPath
from typing import cast

KINDS = ("metadata", "licenses", "docstrings")
#: share of max_bytes each kind may take; what one leaves unused goes to the next
SHARES = {"metadata": 0.2, "licenses": 0.2, "docstrings": 0.6}
LICENSE_PREFIXES = ("LICENSE", "LICENCE", "COPYING", "NOTICE")
HEADER_FIELDS = (
    "Name", "Version", "Summary", "Home-page", "Author", "Author-email", "Maintainer", "Maintainer-email",
)
MAX_FILE_BYTES = 1 << 20  # bigger licence/source files are generated tables, not prose
MAX_DOC_CHARS = 100_000
MIN_DOC_CHARS = 200
#: docstring parsing runs in this many processes at most (the goal: 20 MB in < 20 s on 2 cores)
MAX_WORKERS = 4
SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", "test", "tests", "idle_test"}

#: one corpus record: ``id``, ``text``, ``source``, ``kind``
CorpusDoc = dict[str, str]
#: a kind's records, closed early once its budget is spent
CorpusDocs = Generator[CorpusDoc, None, None]


def build_demo_corpus(out_dir: str | Path, max_bytes: int = 20_000_000) -> list[Path]:
    """Write ``metadata.jsonl.gz``, ``licenses.jsonl.gz`` and ``docstrings.jsonl.gz`` into ``out_dir``.

    At most ``max_bytes`` of UTF-8 text in all; returns the three paths.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sites, stdlib = _site_dirs(out), _stdlib_dir(out)
    dists = _distributions(sites)
    sources: dict[str, CorpusDocs] = {
        "metadata": _metadata_docs(dists),
        "licenses": _license_docs(dists, out),
        "docstrings": _docstring_docs([("stdlib", stdlib)] if stdlib else [], sites, out),
    }
    paths, left = [], 0
    for kind in KINDS:
        budget = int(max_bytes * SHARES[kind]) + left
        path = out / f"{kind}.jsonl.gz"
        used = _write_jsonl_gz(path, _take(sources[kind], budget))
        sources[kind].close()  # stops the docstring workers as soon as the budget is spent
        left = budget - used
        paths.append(path)
    return paths


# ---------------------------------------------------------------- where to look


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _site_dirs(out: Path) -> list[Path]:
    """The interpreter's site-packages folders (the venv's, when in one), each once."""
    candidates = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    candidates += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    seen: list[Path] = []
    for c in candidates:
        p = Path(c).resolve()
        if p.is_dir() and p not in seen and not _inside(p, out):
            seen.append(p)
    return sorted(seen)


def _stdlib_dir(out: Path) -> Path | None:
    p = Path(sysconfig.get_paths()["stdlib"]).resolve()
    return p if p.is_dir() and not _inside(p, out) else None


def _distributions(sites: list[Path]) -> list[md.Distribution]:
    """Installed distributions on the site folders only (not the current folder), by name, each once."""
    found: dict[tuple[str, str], md.Distribution] = {}
    for dist in md.distributions(path=[str(s) for s in sites]):
        meta = _metadata(dist)
        name = meta.get("Name") or ""
        key = (re.sub(r"[-_.]+", "-", name).lower(), meta.get("Version") or "")
        if key[0] and key not in found:
            found[key] = dist
    return [found[k] for k in sorted(found)]


# ---------------------------------------------------------------- the three kinds


def _metadata(dist: md.Distribution) -> email.message.Message:
    """A distribution's METADATA as the email message it is (``importlib.metadata``'s declared type, a
    Protocol, has no ``get`` before Python 3.12)."""
    return cast(email.message.Message, dist.metadata)


def _metadata_docs(dists: list[md.Distribution]) -> CorpusDocs:
    for dist in dists:
        meta = _metadata(dist)
        header = [f"{f}: {meta[f]}" for f in HEADER_FIELDS if meta.get(f) and meta[f] != "UNKNOWN"]
        description = str(meta.get_payload() or meta.get("Description") or "").strip()
        text = "\n".join(header) + ("\n\n" + description if description else "") + "\n"
        if len(text) >= MIN_DOC_CHARS:
            name, version = meta["Name"], meta.get("Version") or ""
            yield {"id": f"metadata:{name}=={version}", "text": text, "source": f"pypi:{name}", "kind": "metadata"}


def _license_docs(dists: list[md.Distribution], out: Path) -> CorpusDocs:
    seen: set[Path] = set()
    for dist in dists:
        name = dist.metadata["Name"]
        for rel in sorted(dist.files or [], key=str):
            base = PurePosixPath(str(rel)).name
            if not base.upper().startswith(LICENSE_PREFIXES) or base.endswith((".py", ".pyc", ".so")):
                continue
            path = Path(str(dist.locate_file(rel))).resolve()
            if path in seen or _inside(path, out):
                continue
            seen.add(path)
            text = _read_text(path)
            if text is not None and len(text.strip()) >= MIN_DOC_CHARS:
                yield {"id": f"license:{name}:{rel}", "text": text, "source": f"{name}/{rel}", "kind": "license"}


def _docstring_docs(stdlib: list[tuple[str, Path]], sites: list[Path], out: Path) -> CorpusDocs:
    """Parsed in worker processes (parsing is the cost), handed out in sorted file order."""
    roots = stdlib + [("site-packages", s) for s in sites]
    tasks = [(label, str(root), str(path)) for label, root in roots for path in _python_files(root, out)]
    workers = max(1, min(MAX_WORKERS, os.cpu_count() or 1))
    if workers == 1:
        yield from filter(None, map(_docstring_doc, tasks))
        return
    pool = ProcessPoolExecutor(workers, mp_context=_mp_context(), initializer=gc.disable)
    done = 0
    try:
        for doc in pool.map(_docstring_doc, tasks, chunksize=32):
            done += 1
            if doc is not None:
                yield doc
    except BrokenProcessPool:
        # workers could not start (e.g. spawn from a script without a __main__ guard): go on here
        yield from filter(None, map(_docstring_doc, tasks[done:]))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _mp_context() -> multiprocessing.context.BaseContext:
    """fork when it is safe (one thread): it does not re-run the caller's main script as spawn does;
    spawn when threads are running (a Ray driver), since forking them can deadlock."""
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _docstring_doc(task: tuple[str, str, str]) -> CorpusDoc | None:
    label, root, path = task
    text = _module_docstrings(Path(path), Path(root))
    if text is None:
        return None
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    return {"id": f"docstring:{label}/{rel}", "text": text, "source": f"{label}/{rel}", "kind": "docstring"}


def _python_files(root: Path, out: Path) -> Iterator[Path]:
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")
                         and not _inside(here / d, out))
        for name in sorted(names):
            if name.endswith(".py"):
                yield here / name


def _module_docstrings(path: Path, root: Path) -> str | None:
    """The module's docstring, then each class's and function's, headed by its qualified name."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        source = path.read_bytes()
    except OSError:
        return None
    if b'"""' not in source and b"'''" not in source:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # Python 2 files, templates, files with NUL bytes
    module = os.path.relpath(path, root)[: -len(".py")].replace(os.sep, ".").removesuffix(".__init__")
    blocks = []
    doc = ast.get_docstring(tree)
    if doc:
        blocks.append(f"Module {module}\n\n{doc}")
    _collect(tree.body, module, blocks)
    text = "\n\n".join(blocks)
    if len(text) < MIN_DOC_CHARS:
        return None
    return text[:MAX_DOC_CHARS] + "\n"


def _collect(body: Iterable[ast.stmt], prefix: str, blocks: list[str]) -> None:
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}.{node.name}"
            doc = ast.get_docstring(node)
            if doc:
                kind = "class" if isinstance(node, ast.ClassDef) else "def"
                blocks.append(f"{kind} {name}\n\n{doc}")
            _collect(node.body, name, blocks)


def _read_text(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


# ---------------------------------------------------------------- budget and output


def _take(docs: Iterator[CorpusDoc], budget: int) -> Iterator[CorpusDoc]:
    """Documents in order while they fit the byte budget (one that does not fit is skipped)."""
    used = 0
    # parsing makes millions of short-lived AST nodes: the cyclic GC would spend more time than ast
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for doc in docs:
            if budget - used < MIN_DOC_CHARS:
                return
            size = len(doc["text"].encode("utf-8", "replace"))
            if used + size <= budget:
                used += size
                yield doc
    finally:
        if was_enabled:
            gc.enable()


def _write_jsonl_gz(path: Path, docs: Iterable[dict]) -> int:
    """Write deterministically (no time stamp, no file name in the gzip header), atomically; text bytes."""
    tmp = path.with_name(path.name + ".tmp")
    used = 0
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) as gz:
        for doc in docs:
            used += len(doc["text"].encode("utf-8", "replace"))
            gz.write(json.dumps(doc, ensure_ascii=False, sort_keys=True).encode("utf-8", "replace") + b"\n")
    os.replace(tmp, path)
    return used


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.demo_corpus",
        description="Build a demo corpus from the text of this Python installation.",
    )
    parser.add_argument("out", help="output folder")
    parser.add_argument("--max-bytes", type=int, default=20_000_000, help="text bytes in all (default 20 MB)")
    args = parser.parse_args(argv)
    if args.max_bytes <= 0:
        parser.error("--max-bytes must be positive")
    try:
        paths = build_demo_corpus(args.out, args.max_bytes)
    except OSError as exc:
        print(f"error: cannot write the demo corpus to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for p in paths:
        with gzip.open(p, "rt", encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        print(f"{p}  {n} documents  {p.stat().st_size} bytes compressed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
