"""WARC/WET/ARC files via warcio: HTML ``response`` records -> main text by trafilatura, WET
``conversion`` records -> their text as is. Other records (warcinfo, request, metadata, non-HTML
responses) are skipped without a drop: they are not documents. Every WARC record counts in the
record index, so ``ord`` points at the record's position in the file.

Records are cut apart here with warcio's record loader rather than its ``ArchiveIterator``, which
takes a record without a ``Content-Length`` (a header block ended early by a garbage or blank line)
as running to the end of the file, silently swallowing every record after it. A WARC record without
a ``WARC-Type``, without a valid ``Content-Length``, or not followed by the blank line its length
promises is a ``malformed_warc_record`` drop, and reading goes on at the next ``WARC/x.y`` line.

A record over ``max_record_bytes`` (its headers and ``Content-Length``, or a payload whose HTTP
``Content-Encoding`` decodes past the limit) is one ``record_too_large`` stub (its WARC-Record-ID, offset in the
decompressed file, stored size) and is read past in chunks: its header block is read at most to the limit
(:class:`_Tellable`'s budget), its payload only when it fits.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, BinaryIO, NamedTuple

from warcio.bufferedreaders import BufferedReader as WarcBufferedReader
from warcio.bufferedreaders import ChunkedDataReader
from warcio.exceptions import ArchiveLoadFailed
from warcio.limitreader import LimitReader
from warcio.recordloader import ArcWarcRecordLoader

from pipeline.documents import Drop, ReaderDocument, is_blank
from pipeline.readers.bounded import too_large
from pipeline.readers.compression import TruncatedInput, check_complete, open_binary
from pipeline.readers.docs import (
    MAX_RAW_BYTES,
    default_id,
    drop,
    encodable,
    error_text,
    make_doc,
    make_ord,
    meta_json,
)

HTML_TYPES = ("text/html", "application/xhtml+xml")
#: options of trafilatura.extract: `fast` skips the backup extractors (readability, jusText), each another
#: parse of the page; comments are not main text
TRAFILATURA_OPTIONS: dict[str, Any] = {
    "fast": True,
    "include_comments": False,
    "include_tables": True,
    "deduplicate": False,
    "output_format": "txt",
}
#: the first line of a WARC record
WARC_VERSION = re.compile(rb"WARC/\d+\.\d+\r?\n")
#: lines are read at most this long while looking for the next record (a line without an end is no record)
MAX_LINE = 64 * 1024
MALFORMED = "malformed_warc_record"


def read_warc(file_index: int, path: str, name: str, limit: int) -> Iterator[ReaderDocument | Drop]:
    index = 0
    loader = ArcWarcRecordLoader(verify_http=False, arc2warc=True)
    # decompressed here, not by warcio: warcio reads a cut .warc.gz as a shorter file without a word
    with open_binary(path) as raw_fh:
        fh = _Tellable(raw_fh)
        try:
            line, _ = _next_line(fh)
            is_warc = WARC_VERSION.fullmatch(line) is not None  # else ARC (or not an archive at all)
            while line:
                if is_warc and not WARC_VERSION.fullmatch(line):
                    raw, line = _skip_to_record(fh, line)
                    yield drop(name, file_index, index, MALFORMED, raw, error="no WARC/x.y line where a record starts")
                    index += 1
                    continue
                start = fh.tell() - len(line)
                try:
                    record = _parse(loader, fh, line, is_warc, limit)
                except _OverLimit:  # its header block
                    _, line = _skip_to_record(fh, b"")
                    yield too_large(name, file_index, index, limit, offset=start, size=fh.tell() - len(line) - start)
                    index += 1
                    continue
                except ArchiveLoadFailed as exc:  # not an archive at all, or a damaged record header
                    if index == 0:
                        yield drop(name, file_index, 0, "unreadable_file", error=error_text(exc))
                        return
                    raw, line = _skip_to_record(fh, line)
                    yield drop(name, file_index, index, MALFORMED, raw, error=error_text(exc))
                    index += 1
                    continue
                except EOFError:
                    break
                item, line = _record(fh, record, is_warc, file_index, name, index, _Bound(start, limit))
                index += 1
                if item is not None:
                    yield item
            check_complete(raw_fh)
        except TruncatedInput as exc:
            yield drop(name, file_index, index, "truncated_file", error=str(exc))


class _OverLimit(Exception):
    """A record's header block, or its payload as decoded, ran past ``max_record_bytes``."""


class _Bound(NamedTuple):
    """Where the record being read starts (in the decompressed file) and the most it may take."""

    start: int
    limit: int


class _Tellable:
    """The decompressed stream with the ``tell()`` warcio's loader calls (it cannot seek: count bytes).

    While ``budget`` is set (the bytes a record's headers may still take) no read goes past it: warcio reads a
    header line whole, and a header block of one endless line would otherwise be held whole.
    """

    def __init__(self, fh: BinaryIO):
        self._fh = fh
        self._pos = 0
        self.budget: int | None = None
        #: whether the last byte read ended a line (where a skip to the next record may find its first line)
        self.at_line_start = True

    def read(self, size: int | None = -1) -> bytes:
        return self._count(self._fh.read(self._bounded(size)))

    def readline(self, size: int | None = -1) -> bytes:
        return self._count(self._fh.readline(self._bounded(size)))

    def tell(self) -> int:
        return self._pos

    def _bounded(self, size: int | None) -> int:
        size = -1 if size is None else size
        if self.budget is None:
            return size
        return self.budget + 1 if size < 0 else min(size, self.budget + 1)

    def _count(self, data: bytes) -> bytes:
        self._pos += len(data)
        if data:
            self.at_line_start = data.endswith(b"\n")
        if self.budget is not None:
            self.budget -= len(data)
            if self.budget < 0:
                raise _OverLimit
        return data


def _parse(loader: ArcWarcRecordLoader, fh: _Tellable, line: bytes, is_warc: bool, limit: int) -> Any:
    """The record whose first line is ``line``, its header blocks (WARC, then HTTP) read; they may not take more
    than ``limit`` bytes (:class:`_OverLimit`)."""
    fh.budget = limit - len(line)
    try:
        return loader.parse_record_stream(fh, line, "warc" if is_warc else None)
    finally:
        fh.budget = None


def _record(
    fh: _Tellable, record: Any, is_warc: bool, file_index: int, name: str, index: int, bound: _Bound
) -> tuple[ReaderDocument | Drop | None, bytes]:
    """The record's document or drop (None: not a document), and the first line of the next record."""
    problem = _header_problem(record) if is_warc else None
    # an ARC record has no id of its own: warcio makes up a random WARC-Record-ID for it on every read
    doc_id = (record.rec_headers.get_header("WARC-Record-ID") if is_warc else None) or default_id(name, index)
    raw = b""
    size = fh.tell() - bound.start + (record.raw_stream.limit if isinstance(record.raw_stream, LimitReader) else 0)
    if problem is None and size > bound.limit:  # its payload is not read: _cut_short reads past it
        item: ReaderDocument | Drop | None = too_large(name, file_index, index, bound.limit, doc_id,
                                                       offset=bound.start, size=size)
    elif problem is None:
        try:
            item = _record_doc(file_index, name, index, record, doc_id, bound.limit)
        except _OverLimit:  # a payload that decodes past the limit (only an HTTP payload is decoded)
            headers = record.http_headers
            encoding = headers.get_header("Content-Encoding") or headers.get_header("Transfer-Encoding")
            item = too_large(name, file_index, index, bound.limit, doc_id, offset=bound.start, size=size,
                             content_encoding=encoding)
    elif isinstance(record.raw_stream, LimitReader):
        item, raw = None, record.raw_stream.read(MAX_RAW_BYTES)
    else:  # no usable length: the record would run to the end of the file
        raw, line = _skip_to_record(fh, b"")
        return drop(name, file_index, index, MALFORMED, raw, doc_id, error=problem), line
    if _cut_short(record):
        raise TruncatedInput(f"record {index} ends before its Content-Length")
    line, blanks = _next_line(fh)
    if is_warc and line and not blanks:  # the length was wrong: what follows is not where a record starts
        problem = problem or "record not followed by a blank line: its Content-Length is wrong"
        junk, line = _skip_to_record(fh, line)
        raw = raw or junk
    if problem is not None:
        return drop(name, file_index, index, MALFORMED, raw, doc_id, error=problem), line
    return item, line


def _header_problem(record: Any) -> str | None:
    """Why a WARC record's headers cannot be trusted, or None."""
    headers = record.rec_headers
    if not headers.get_header("WARC-Type"):
        return "no WARC-Type header"
    length = headers.get_header("Content-Length")
    if length is None:
        return "no Content-Length header"
    if not re.fullmatch(r"[0-9]+", length.strip()):
        return f"Content-Length {length[:40]!r} is not a number"
    return None


def _next_line(fh: _Tellable) -> tuple[bytes, int]:
    """The next line that is not blank (b"" at the end) and how many blank lines came before it."""
    blanks = 0
    while True:
        line = fh.readline(MAX_LINE)
        if not line or line.strip():
            return line, blanks
        blanks += 1


def _skip_to_record(fh: _Tellable, first: bytes) -> tuple[bytes, bytes]:
    """Read on to the next ``WARC/x.y`` line: ``(what was skipped, at most 10 KB; that line or b"")``."""
    raw = bytearray(first[:MAX_RAW_BYTES])
    at_line_start = first.endswith(b"\n") if first else fh.at_line_start
    while True:
        line = fh.readline(MAX_LINE)
        if not line:
            return bytes(raw), b""
        if at_line_start and WARC_VERSION.fullmatch(line):
            return bytes(raw), line
        raw += line[: MAX_RAW_BYTES - len(raw)]
        at_line_start = line.endswith(b"\n")


def _cut_short(record: Any) -> bool:
    """True when the file ended inside this record (reads what is left of it, as warcio would)."""
    stream = record.raw_stream
    if not isinstance(stream, LimitReader):
        return False
    while stream.limit > 0 and stream.read(min(stream.limit, 1 << 20)):
        pass
    return stream.limit > 0


def _record_doc(
    file_index: int, name: str, record_index: int, record: Any, doc_id: str, limit: int
) -> ReaderDocument | Drop | None:
    """The record's document or drop, None when it is no document; :class:`_OverLimit` when its payload decodes
    (``Content-Encoding: gzip``, chunked) to more than ``limit`` bytes, read no further than that."""
    if record.rec_type == "response":
        ctype = _content_type(record)
        if not ctype.startswith(HTML_TYPES):
            return None
    elif record.rec_type == "conversion":
        ctype = record.rec_headers.get_header("Content-Type") or "text/plain"
    else:
        return None
    headers = record.rec_headers
    url = headers.get_header("WARC-Target-URI")
    payload = _content_stream(record, limit).read(limit + 1)
    if len(payload) > limit:
        raise _OverLimit
    text, reason, error = _record_text(record.rec_type, payload, url)
    if reason is not None:
        return drop(name, file_index, record_index, reason, payload, doc_id, url=url, error=error)
    meta = {"url": url, "date": headers.get_header("WARC-Date"), "content_type": ctype}
    meta["warc_type"] = record.rec_type
    if record.http_headers is not None:
        meta["http_status"] = record.http_headers.get_statuscode()
    meta.update({k.lower(): v for k, v in headers.headers if k.lower().startswith("x-")})
    return make_doc(doc_id, text, name, make_ord(file_index, record_index), meta_json(meta, ()))


def _content_stream(record: Any, limit: int) -> Any:
    """``record.content_stream()`` (its HTTP payload, chunks joined, ``Content-Encoding`` gzip or deflate decoded, as
    warcio does it, fallbacks included) that inflates at most ``limit + 1`` bytes in all: warcio inflates a whole chunk
    or block at once, up to ~1,032x its size, and a record that fits the limit could decode to a thousand times it."""
    headers = record.http_headers
    if not headers:
        return record.raw_stream
    encoding = (headers.get_header("Content-Encoding") or "").lower()
    decoder = encoding if encoding in WarcBufferedReader.get_supported_decompressors() else None
    chunked = headers.get_header("Transfer-Encoding") == "chunked"
    if not chunked and decoder is None:
        return record.raw_stream
    return _CappedReader(record.raw_stream, limit + 1, chunked, decoder)


class _CappedReader(ChunkedDataReader):
    """warcio's chunked reader (a plain decoding one when ``chunked`` is false) whose decompressor stops after ``cap``
    bytes in all, so that reading ``cap`` bytes of a bomb inflates no more than that."""

    #: warcio's decompressor (set by its ``_init_decomp``), wrapped in :class:`_Capped`
    decompressor: Any

    def __init__(self, stream: Any, cap: int, chunked: bool, decoder: str | None):
        self.cap = cap  # before warcio's __init__, which makes the decompressor
        super().__init__(stream, decomp_type=decoder)
        self.not_chunked = not chunked

    def _init_decomp(self, decomp_type: str | None) -> None:
        super()._init_decomp(decomp_type)
        if self.decompressor is not None:
            self.decompressor = _Capped(self.decompressor, self)


class _Capped:
    """A zlib decompressor that inflates no more than what its reader's ``cap`` has left."""

    def __init__(self, inner: Any, reader: _CappedReader):
        self._inner = inner
        self._reader = reader

    def decompress(self, data: bytes) -> bytes:
        if self._reader.cap <= 0:
            return b""
        out = self._inner.decompress(data, self._reader.cap)
        self._reader.cap -= len(out)
        return out

    def __getattr__(self, name: str) -> Any:  # unused_data, flush, eof...
        return getattr(self._inner, name)


def _record_text(rec_type: str, payload: bytes, url: str | None) -> tuple[str, str | None, str | None]:
    """``(text, drop_reason, error)``: HTML goes through trafilatura, WET text is taken as is."""
    if rec_type == "response":
        text = extract_html(payload, url)
        return (text, None, None) if text else ("", "no_text_extracted", None)
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "", "invalid_utf8", error_text(exc)
    if is_blank(text):
        return "", "empty_text", None
    if not encodable(text):
        return "", "invalid_utf8", "lone surrogate"
    return text, None, None


def _content_type(record: Any) -> str:
    ctype = record.http_headers.get_header("Content-Type") if record.http_headers is not None else None
    ctype = ctype or record.rec_headers.get_header("WARC-Identified-Payload-Type") or ""
    return ctype.strip().lower()


def extract_html(html: bytes, url: str | None = None) -> str | None:
    """The page's main text, or None when trafilatura finds none."""
    import trafilatura  # deferred: it pulls lxml and its language data, ~0.5 s

    try:
        text = trafilatura.extract(html, url=url, **TRAFILATURA_OPTIONS)
    except Exception:  # noqa: BLE001 (heuristics over hostile HTML: any failure means "no text")
        return None
    return text if text and not is_blank(text) else None
