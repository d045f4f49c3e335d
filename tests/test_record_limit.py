"""Issue 37, hostile inputs: readers bound what one record may cost (``inputs[].max_record_bytes``).

A line, a text file, a WARC record or a Parquet value over the limit is one counted ``record_too_large`` drop, a
stub (id when known, source, offset, size; never the text), and is read past in bounded memory: a gzip bomb of one
huge line costs a small multiple of the limit, not the line's size. The job-level case (a 1.2 MB ``.jsonl.gz`` of
one 1.2 GB line) is ``tests/test_hardening_inputs.py::test_gzip_bomb_job_keeps_workers_small``.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.documents import Drop
from pipeline.problems import SpecError
from pipeline.readers import read_file
from pipeline.readers.bounded import TooLarge, lines
from pipeline.spec import DEFAULT_MAX_RECORD_BYTES, InputSpec, parse_spec

MB = 1 << 20
LIMIT = MB
BIG = 64 * MB  # the huge record of the bomb tests: 64x the limit
#: what reading past a 64 MiB record may cost in Python allocations (tracemalloc's peak): a few times the limit
PEAK_BOUND = 8 * LIMIT


def read_all(path: Path, **spec: Any) -> tuple[list[dict], list[Drop], int]:
    """The file's documents and drops, and the peak of Python's allocations while reading it."""
    docs: list[dict] = []
    drops: list[Drop] = []
    tracemalloc.start()
    try:
        for item in read_file(0, str(path), InputSpec(path=str(path), **spec)):
            (drops if isinstance(item, Drop) else docs).append(item)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return docs, drops, peak


def gzip_run(size: int, byte: bytes = b"a") -> bytes:
    """``size`` bytes of ``byte`` (a multiple of 1 MiB) as gzip members, ~1 KB each: a bomb built in milliseconds."""
    member = gzip.compress(byte * MB, 9, mtime=0)
    return member * (size // MB)


def bomb(path: Path, before: list[dict], size: int, after: list[dict]) -> tuple[int, int]:
    """A ``.jsonl.gz`` of ``before``, one record line of ``size`` bytes (``{"id":"big","text":"aaa..."}``) and
    ``after``; returns the big line's offset in the decompressed stream and its length without the newline."""
    head = "".join(json.dumps(r) + "\n" for r in before).encode()
    opening, closing = b'{"id": "big", "text": "', b'"}'
    tail = closing + b"\n" + "".join(json.dumps(r) + "\n" for r in after).encode()
    path.write_bytes(gzip.compress(head + opening, mtime=0) + gzip_run(size) + gzip.compress(tail, mtime=0))
    return len(head), len(opening) + size + len(closing)


def stub(item: Drop) -> tuple[str, str, int, dict[str, Any]]:
    return item.reason, item.doc["text"], item.doc["ord"], item.detail


# ---------------------------------------------------------------- the spec field


def test_max_record_bytes_is_validated_and_keeps_earlier_specs_hashes() -> None:
    spec = {"name": "t", "inputs": [{"path": "in/*.jsonl"}], "output": {"path": "out"}}
    before = "dd1d68fc4ad347e5e403c4af6612575fb242d765e50f683ed3ea317e8da9dae4"  # as in tests/test_spec.py
    parsed = parse_spec(spec)
    assert parsed.inputs[0].max_record_bytes == DEFAULT_MAX_RECORD_BYTES >= 50_000_000
    assert parsed.content_hash() == before, "the default changed every spec's hash"
    limited = parse_spec({**spec, "inputs": [{"path": "in/*.jsonl", "max_record_bytes": MB}]})
    assert limited.inputs[0].max_record_bytes == MB and limited.content_hash() != before
    for bad in (0, -1, "big"):
        with pytest.raises(SpecError) as err:
            parse_spec({**spec, "inputs": [{"path": "in/*.jsonl", "max_record_bytes": bad}]})
        assert str(err.value).startswith("inputs.0.max_record_bytes:"), str(err.value)


# ---------------------------------------------------------------- JSONL (and the formats read as JSONL lines)


def test_jsonl_gzip_bomb_is_one_stub_drop_read_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "bomb.jsonl.gz"
    offset, size = bomb(path, [{"id": "a", "text": "before"}], BIG, [{"id": "b", "text": "after"}])
    docs, drops, peak = read_all(path, max_record_bytes=LIMIT)
    assert [(d["id"], d["text"], d["ord"]) for d in docs] == [("a", "before", 0), ("b", "after", 2)]
    assert [stub(d) for d in drops] == [("record_too_large", "", 1, {"offset": offset, "size": size, "limit": LIMIT})]
    assert drops[0].doc["id"] == "bomb.jsonl.gz:1" and drops[0].doc["source"] == "bomb.jsonl.gz"
    assert peak < PEAK_BOUND, f"reading past a {BIG >> 20} MiB line took {peak / MB:.0f} MiB"


def test_lines_match_a_plain_split_at_every_length_around_the_limit() -> None:
    """:func:`lines` on random lines of the limit's length give or take a few bytes, ``\\n`` or ``\\r\\n``, the
    last one with or without its end, read through a buffer smaller than a line: what a plain split says."""
    rng = random.Random(7)
    limit = 40
    for _ in range(300):
        parts = [b"x" * rng.randint(limit - 3, limit + 3) + rng.choice([b"\n", b"\r\n", b"\r\r\n"])
                 for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.5:
            parts[-1] = parts[-1].rstrip(b"\r\n") + rng.choice([b"", b"\r"])
        data = b"".join(parts)
        want: list[bytes | TooLarge] = []
        offset = 0
        for part in parts:
            body = part[:-2] if part.endswith(b"\r\n") else part[:-1] if part.endswith(b"\n") else part
            want.append(TooLarge(offset, len(body)) if len(body) > limit else part)
            offset += len(part)
        got = list(lines(io.BufferedReader(io.BytesIO(data), buffer_size=16), limit))  # type: ignore[arg-type]
        assert got == want, data


def _padded(record: dict[str, Any], field: Callable[[dict[str, Any]], dict[str, Any]], size: int) -> bytes:
    """``record`` as one JSON line of exactly ``size`` bytes (no newline), ``field(record)`` padded with ``x``."""
    short = len(json.dumps(record).encode())
    field(record)["pad"] = ""
    field(record)["pad"] = "x" * (size - len(json.dumps(record).encode()))
    line = json.dumps(record).encode()
    assert len(line) == size > short
    return line


RECORDS: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "jsonl": ({"id": "r", "text": "kept text"}, lambda r: r),
    "documents": ({"id": "r", "text": "kept text", "meta": {}}, lambda r: r["meta"]),
    "instruction": ({"id": "r", "instruction": "say", "output": "kept text"}, lambda r: r),
    "chat": ({"id": "r", "messages": [{"role": "user", "content": "say"},
                                      {"role": "assistant", "content": "kept text"}]}, lambda r: r["messages"][1]),
}


@pytest.mark.parametrize("fmt", sorted(RECORDS))
def test_a_line_of_the_limit_passes_and_one_byte_more_is_dropped(tmp_path: Path, fmt: str) -> None:
    """Every reader of JSON lines (plain, documents, SFT) bounds a line at ``max_record_bytes`` (its newline and a
    CR before it not counted), at the byte, in a plain file too."""
    limit = 300
    record, field = RECORDS[fmt]
    exact = _padded(json.loads(json.dumps(record)), field, limit)
    over = _padded(json.loads(json.dumps(record)), field, limit + 1)
    path = tmp_path / "part.jsonl"
    path.write_bytes(exact + b"\r\n" + over + b"\n" + exact)
    docs, drops, _ = read_all(path, format=fmt, max_record_bytes=limit)
    assert [d["ord"] for d in docs] == [0, 2] and all("kept text" in d["text"] for d in docs)
    assert [stub(d) for d in drops] == [
        ("record_too_large", "", 1, {"offset": limit + 2, "size": limit + 1, "limit": limit})]


# ---------------------------------------------------------------- plain text


def test_text_file_over_the_limit_is_one_stub_drop_read_in_bounded_memory(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "big.txt.gz").write_bytes(gzip_run(BIG))
    (tmp_path / "in" / "exact.txt").write_bytes(b"b" * LIMIT)
    docs, drops, peak = read_all(tmp_path / "in" / "big.txt.gz", max_record_bytes=LIMIT)
    assert docs == [] and [stub(d) for d in drops] == [
        ("record_too_large", "", 0, {"offset": 0, "size": BIG, "limit": LIMIT})]
    assert peak < PEAK_BOUND, f"reading past a {BIG >> 20} MiB text took {peak / MB:.0f} MiB"
    docs, drops, _ = read_all(tmp_path / "in" / "exact.txt", max_record_bytes=LIMIT)
    assert [len(d["text"]) for d in docs] == [LIMIT] and drops == []


# ---------------------------------------------------------------- WARC


def warc_head(n: int, length: int, rec_type: str = "conversion") -> bytes:
    ctype = "application/http; msgtype=response" if rec_type == "response" else "text/plain"
    return (f"WARC/1.0\r\nWARC-Type: {rec_type}\r\nWARC-Record-ID: <urn:uuid:{n}>\r\n"
            f"WARC-Target-URI: https://e.org/{n}\r\nContent-Type: {ctype}\r\nContent-Length: {length}\r\n\r\n").encode()


def warc_record(n: int, body: bytes) -> bytes:
    return warc_head(n, len(body)) + body + b"\r\n\r\n"


def test_warc_record_over_the_limit_is_one_stub_drop_read_in_bounded_memory(tmp_path: Path) -> None:
    first, last = warc_record(1, b"first document"), warc_record(3, b"third document")
    head = warc_head(2, BIG)
    path = tmp_path / "pages.warc.gz"
    path.write_bytes(gzip.compress(first + head, mtime=0) + gzip_run(BIG) + gzip.compress(b"\r\n\r\n" + last))
    docs, drops, peak = read_all(path, max_record_bytes=LIMIT)
    assert [(d["text"], d["ord"]) for d in docs] == [("first document", 0), ("third document", 2)]
    assert [stub(d) for d in drops] == [
        ("record_too_large", "", 1, {"offset": len(first), "size": len(head) + BIG, "limit": LIMIT})]
    assert drops[0].doc["id"] == "<urn:uuid:2>"
    assert peak < PEAK_BOUND, f"reading past a {BIG >> 20} MiB record took {peak / MB:.0f} MiB"


@pytest.mark.parametrize("chunked", [False, True], ids=["gzip", "chunked-gzip"])
def test_warc_payload_that_inflates_past_the_limit_is_dropped(tmp_path: Path, chunked: bool) -> None:
    """A small response record whose HTTP ``Content-Encoding: gzip`` payload inflates past the limit: warcio would
    decode it whole for trafilatura (a chunk at once when chunked). Its stored size is under the limit (the stub's
    ``size``), what it decodes to is not (the stub names the encoding)."""
    payload = gzip.compress(b"<html><body><p>" + b"a" * (BIG - 100) + b"</p></body></html>", 9, mtime=0)
    framing = b"Content-Length: " + str(len(payload)).encode()
    if chunked:
        payload = f"{len(payload):x}\r\n".encode() + payload + b"\r\n0\r\n\r\n"
        framing = b"Transfer-Encoding: chunked"
    http = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n" + framing + b"\r\n\r\n"
            + payload)
    first = warc_record(1, b"first document")
    record = warc_head(2, len(http), "response") + http + b"\r\n\r\n"
    path = tmp_path / "pages.warc"
    path.write_bytes(first + record + warc_record(3, b"third document"))
    docs, drops, peak = read_all(path, max_record_bytes=LIMIT)
    assert [d["text"] for d in docs] == ["first document", "third document"]
    assert [(d.reason, d.doc["id"], d.doc["text"]) for d in drops] == [("record_too_large", "<urn:uuid:2>", "")]
    assert drops[0].detail == {"offset": len(first), "size": len(record) - 4, "limit": LIMIT,
                               "content_encoding": "gzip"}
    assert peak < PEAK_BOUND, f"reading past a {BIG >> 20} MiB payload took {peak / MB:.0f} MiB"


def test_warc_header_block_over_the_limit_is_dropped(tmp_path: Path) -> None:
    """A record whose header block never ends within the limit (one endless header line) is a drop too, and the
    next record is read."""
    first = warc_record(1, b"first document")
    endless = b"WARC/1.0\r\nWARC-Type: conversion\r\nX-Junk: " + b"j" * (4 * LIMIT) + b"\r\n\r\n"
    path = tmp_path / "pages.warc"
    path.write_bytes(first + endless + warc_record(3, b"third document"))
    docs, drops, _ = read_all(path, max_record_bytes=LIMIT)
    assert [d["text"] for d in docs] == ["first document", "third document"]
    assert [stub(d) for d in drops] == [
        ("record_too_large", "", 1, {"offset": len(first), "size": len(endless), "limit": LIMIT})]


# ---------------------------------------------------------------- Parquet


def test_parquet_value_over_the_limit_is_a_stub_drop(tmp_path: Path) -> None:
    """Parquet is read a row group at a time (that bounds it); a value over the limit is the same drop, the row's
    id kept, before the row becomes Python objects."""
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"id": ["a", "big", "c"], "text": ["first", "x" * (2 * LIMIT), "third"],
                             "label": ["l1", "l2", "l3"]}), path)
    docs, drops, _ = read_all(path, max_record_bytes=LIMIT)
    assert [(d["id"], d["text"], d["ord"]) for d in docs] == [("a", "first", 0), ("c", "third", 2)]
    assert [(d.doc["id"], *stub(d)) for d in drops] == [
        ("big", "record_too_large", "", 1, {"field": "text", "size": 2 * LIMIT, "limit": LIMIT})]
