"""WARC/WET/ARC files via warcio: HTML ``response`` records -> main text by trafilatura, WET
``conversion`` records -> their text as is. Other records (warcinfo, request, metadata, non-HTML
responses) are skipped without a drop: they are not documents. Every WARC record counts in the
record index, so ``ord`` points at the record's position in the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed
from warcio.limitreader import LimitReader

from pipeline.documents import Doc, Drop
from pipeline.readers.compression import TruncatedInput, check_complete, open_binary
from pipeline.readers.docs import default_id, drop, encodable, error_text, make_doc, make_ord, meta_json

HTML_TYPES = ("text/html", "application/xhtml+xml")
#: options of trafilatura.extract: `fast` skips the backup extractors (readability, jusText), about 1.5x
#: faster on the AEB pages; comments are not main text
TRAFILATURA_OPTIONS: dict[str, Any] = {
    "fast": True,
    "include_comments": False,
    "include_tables": True,
    "deduplicate": False,
    "output_format": "txt",
}


def read_warc(file_index: int, path: str, name: str) -> Iterator[Doc | Drop]:
    next_index = 0
    # decompressed here, not by warcio: warcio reads a cut .warc.gz as a shorter file without a word
    with open_binary(path) as fh:
        try:
            for record in ArchiveIterator(fh, arc2warc=True):
                item = _record_doc(file_index, path, name, next_index, record)
                if _cut_short(record):
                    raise TruncatedInput(f"record {next_index} ends before its Content-Length")
                next_index += 1
                if item is not None:
                    yield item
            check_complete(fh)
        except TruncatedInput as exc:
            yield drop(path, name, file_index, next_index, "truncated_file", error=str(exc))
        except ArchiveLoadFailed as exc:  # not a WARC at all, or a damaged record header
            reason = "unreadable_file" if next_index == 0 else "truncated_file"
            yield drop(path, name, file_index, next_index, reason, error=error_text(exc))


def _cut_short(record: Any) -> bool:
    """True when the file ended inside this record (reads what is left of it, as warcio would)."""
    stream = record.raw_stream
    if not isinstance(stream, LimitReader):
        return False
    while stream.limit > 0 and stream.read(min(stream.limit, 1 << 20)):
        pass
    return stream.limit > 0


def _record_doc(file_index: int, path: str, name: str, record_index: int, record: Any) -> Doc | Drop | None:
    if record.rec_type == "response":
        ctype = _content_type(record)
        if not ctype.startswith(HTML_TYPES):
            return None
    elif record.rec_type == "conversion":
        ctype = record.rec_headers.get_header("Content-Type") or "text/plain"
    else:
        return None
    headers = record.rec_headers
    doc_id = headers.get_header("WARC-Record-ID") or default_id(name, record_index)
    url = headers.get_header("WARC-Target-URI")
    payload = record.content_stream().read()
    text, reason, error = _record_text(record.rec_type, payload, url)
    if reason is not None:
        return drop(path, name, file_index, record_index, reason, payload, doc_id, url=url, error=error)
    meta = {"url": url, "date": headers.get_header("WARC-Date"), "content_type": ctype}
    meta["warc_type"] = record.rec_type
    if record.http_headers is not None:
        meta["http_status"] = record.http_headers.get_statuscode()
    meta.update({k.lower(): v for k, v in headers.headers if k.lower().startswith("x-")})
    return make_doc(doc_id, text, path, make_ord(file_index, record_index), meta_json(meta, ()))


def _record_text(rec_type: str, payload: bytes, url: str | None) -> tuple[str, str | None, str | None]:
    """``(text, drop_reason, error)``: HTML goes through trafilatura, WET text is taken as is."""
    if rec_type == "response":
        text = extract_html(payload, url)
        return (text, None, None) if text else ("", "no_text_extracted", None)
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "", "invalid_utf8", error_text(exc)
    if not text.strip():
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
    return text if text and text.strip() else None
