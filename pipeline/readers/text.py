"""Plain text files: each file is one document and must be valid UTF-8 (gzip/zstd are decompressed).

A file over ``max_record_bytes`` (decompressed) is one ``record_too_large`` stub, counted in bounded memory.

The id is ``name:0``, ``name`` being the file's path below its input (``a/doc.txt``, see
:func:`pipeline.readers.paths.source_name`): same-named files in two subfolders get two ids.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeline.documents import Drop, ReaderDocument, is_blank
from pipeline.readers.bounded import TooLarge, read_bounded, too_large
from pipeline.readers.compression import TruncatedInput, check_complete, open_binary
from pipeline.readers.docs import default_id, drop, error_text, make_doc, make_ord

BOM = "\ufeff"


def read_text(file_index: int, path: str, name: str, limit: int) -> Iterator[ReaderDocument | Drop]:
    try:
        with open_binary(path) as fh:
            data = read_bounded(fh, limit)
            check_complete(fh)
    except TruncatedInput as exc:
        yield drop(name, file_index, 0, "truncated_file", error=str(exc))
        return
    if isinstance(data, TooLarge):
        yield too_large(name, file_index, 0, limit, offset=data.offset, size=data.size)
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        yield drop(name, file_index, 0, "invalid_utf8", data, error=error_text(exc))
        return
    text = text.removeprefix(BOM)
    if is_blank(text):
        yield drop(name, file_index, 0, "empty_text", data)
        return
    yield make_doc(default_id(name, 0), text, name, make_ord(file_index, 0))
