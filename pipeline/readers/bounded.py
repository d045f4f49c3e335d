"""What one record may cost a reader: a record over ``inputs[].max_record_bytes`` is measured, never held.

A compressed file a thousand times smaller than what it inflates to (a 1.2 MB ``.jsonl.gz`` of one 1.2 GB line)
must cost a reader a few times the limit, not the record: lines are read with ``readline(limit + 2)`` on the
decompressing stream, and what is past the limit is read on in chunks and counted, never kept. Such a record is one
``record_too_large`` drop, a stub: where it is and how big, without its text (:func:`too_large`).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from pipeline.documents import Drop
from pipeline.readers.compression import check_complete
from pipeline.readers.docs import drop

TOO_LARGE = "record_too_large"
#: how much of a record past the limit is read at a time (and thrown away)
CHUNK = 1 << 20


@dataclass(frozen=True)
class TooLarge:
    """A record over the limit: its first byte's offset in the (decompressed) file, and its size in bytes."""

    offset: int
    size: int


def lines(fh: BinaryIO, limit: int) -> Iterator[bytes | TooLarge]:
    """Each line of ``fh`` with its end of line, or a :class:`TooLarge` for a line of more than ``limit`` bytes
    (its ``\\n``, and a ``\\r`` before it, not counted). At a last line without ``\\n``, checks that the stream
    ended cleanly (:func:`check_complete` raises ``TruncatedInput`` for a cut compressed file)."""
    offset, readline = 0, fh.readline
    while True:
        line = readline(limit + 2)  # a line of the limit and its \r\n
        size = len(line)
        if size <= limit + 1 and line.endswith(b"\n"):  # the common case, first
            yield line
            offset += size
            continue
        if not line:
            return
        if size == limit + 2 and not line.endswith(b"\n"):  # over the limit: count the rest, keep none of it
            while line and not line.endswith(b"\n"):
                tail = line[-1:]
                line = readline(CHUNK)
                size += len(line)
            line = tail + line  # what the end of line is judged on
        if not line.endswith(b"\n"):
            check_complete(fh)
        length = size - (2 if line.endswith(b"\r\n") else 1 if line.endswith(b"\n") else 0)
        if length > limit:
            yield TooLarge(offset, length)
        else:
            yield line
        offset += size


def read_bounded(fh: io.BufferedIOBase, limit: int) -> bytes | TooLarge:
    """The rest of ``fh`` (a whole text file), or a :class:`TooLarge` when it is over ``limit`` bytes. Read a chunk at
    a time (``read(limit + 1)`` would allocate the limit for every small file)."""
    parts: list[bytes] = []
    size = 0
    while chunk := fh.read1(CHUNK):
        size += len(chunk)
        if size <= limit:
            parts.append(chunk)
        elif parts:
            parts.clear()
    return TooLarge(0, size) if size > limit else b"".join(parts)


def too_large(name: str, file_index: int, record_index: int, limit: int, doc_id: str | None = None,
              **where: Any) -> Drop:
    """The ``record_too_large`` drop: a stub with the id (when known), the file (``source``) and ``where`` (its
    ``offset`` and ``size``, or the Parquet ``field``), and no text."""
    return drop(name, file_index, record_index, TOO_LARGE, b"", doc_id, **where, limit=limit)
