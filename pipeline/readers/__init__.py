"""Input readers: turn the files a job names into documents, and malformed records into drops.

Each format has its own small module; :func:`read_file` picks one and guarantees that a bad file
never raises: what cannot be read becomes a :class:`~pipeline.stages.base.Drop` with a reason. Every reader bounds
what one record may cost (``inputs[].max_record_bytes``, :mod:`pipeline.readers.bounded`).
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterator
from typing import TypeVar

from pipeline import storage
from pipeline.documents import Drop, ReaderDocument
from pipeline.output.documents_reader import read_documents
from pipeline.readers.compression import TruncatedInput, open_binary
from pipeline.readers.docs import RECORD_BITS, drop, error_text
from pipeline.readers.jsonl import read_jsonl
from pipeline.readers.parquet import read_parquet
from pipeline.readers.paths import SNIFF_BYTES, detect_format, expand_inputs, named_by, source_name
from pipeline.readers.sft import read_sft
from pipeline.readers.text import read_text
from pipeline.readers.warc import read_warc
from pipeline.spec import InputSpec

__all__ = ["detect_format", "expand_inputs", "first_documents", "read_file"]

RECORD_MASK = (1 << RECORD_BITS) - 1
T = TypeVar("T")


def read_file(file_index: int, path: str, spec: InputSpec) -> Iterator[ReaderDocument | Drop]:
    """Documents of one file, in file order; an I/O error ends the file with one ``unreadable_file``.

    ``spec`` is the input that named ``path``: ids made up for records without one are
    ``name:record_index``, ``name`` being the path relative to that input (:func:`source_name`), which is
    also every document's ``source``. A folder here is one :func:`expand_inputs` could not list: it
    becomes one ``unreadable_folder`` drop, so the documents it holds are counted as lost, not forgotten.
    ``spec.limit``: at most that many documents of this file, read no further
    (:func:`pipeline.readers.limit.limit_files` gives each file its share of an input's limit).
    """
    named = named_by(spec.path, path)
    fmt = detect_format(path, spec.format, named)
    name = source_name(spec.path, path)
    if fmt == "text" and not named and spec.format == "auto" and not os.path.splitext(name)[1]:
        fmt = _sniff(path)
    if fmt == "unknown":
        yield drop(name, file_index, 0, "unknown_format", suffix=os.path.splitext(name)[1] or None,
                   hint="not a format a folder is read by; name the file, or say format: text on the input")
        return
    if not storage.is_remote(path) and os.path.isdir(path):
        try:
            with os.scandir(path):
                pass
        except OSError as exc:
            yield drop(name, file_index, 0, "unreadable_folder", error=error_text(exc))
            return
    next_index = 0
    try:
        for item in first_documents(_reader(file_index, path, name, spec, fmt), spec.limit):
            doc = item.doc if isinstance(item, Drop) else item
            next_index = (doc["ord"] & RECORD_MASK) + 1
            yield item
    except OSError as exc:
        yield drop(name, file_index, next_index, "unreadable_file", error=error_text(exc))


def first_documents(items: Iterator[T], limit: int | None) -> Iterator[T]:
    """``items`` up to and including the ``limit``-th document (a :class:`Drop` does not count); the reader
    behind them is closed there, so the rest of its file is never read. All of them when ``limit`` is None."""
    if limit is None:
        yield from items
        return
    seen = 0
    try:
        for item in items:
            yield item
            seen += not isinstance(item, Drop)
            if seen >= limit:
                return
    finally:  # a reader is a generator: closing it closes its file
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _sniff(path: str) -> str:
    """``text`` for a file without a suffix whose first bytes are UTF-8 without NUL, else ``unknown``
    (a binary such as ``.DS_Store``); an unreadable file is left to the text reader to report."""
    try:
        with open_binary(path) as fh:
            head = fh.read(SNIFF_BYTES)
    except (OSError, TruncatedInput):
        return "text"
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return "unknown"
    return "unknown" if b"\0" in head else "text"


def _reader(file_index: int, path: str, name: str, spec: InputSpec, fmt: str) -> Iterator[ReaderDocument | Drop]:
    if fmt == "jsonl":
        return read_jsonl(file_index, path, name, spec)
    if fmt in ("instruction", "chat"):
        return read_sft(file_index, path, name, spec, fmt)
    if fmt == "parquet":
        return read_parquet(file_index, path, name, spec)
    if fmt == "documents":
        return read_documents(file_index, path, name, spec)
    if fmt == "warc":
        return read_warc(file_index, path, name, spec.max_record_bytes)
    if fmt == "text":
        return read_text(file_index, path, name, spec.max_record_bytes)
    raise ValueError(f"unknown input format {fmt!r}")
