"""Input readers on small generated fixtures: every format, every drop reason, exact counts."""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from pipeline.documents import Drop
from pipeline.readers import detect_format, expand_inputs, read_file
from pipeline.readers.docs import MAX_RAW_BYTES
from pipeline.spec import InputSpec

RECORD_MASK = (1 << 40) - 1


def read_all(path: Path | str, fmt: str = "auto", file_index: int = 0, **kw) -> tuple[list[dict], list[Drop]]:
    spec = InputSpec(path=str(path), format=fmt, **kw)
    docs, drops = [], []
    for item in read_file(file_index, str(path), spec):
        (drops if isinstance(item, Drop) else docs).append(item)
    return docs, drops


def reasons(drops: list[Drop]) -> dict[str, int]:
    return dict(Counter(d.reason for d in drops))


def check_ords(docs: list[dict], drops: list[Drop], file_index: int = 0) -> None:
    """Ords of docs and drops together are unique, in file order, and carry the file index."""
    ords = sorted([d["ord"] for d in docs] + [d.doc["ord"] for d in drops])
    assert len(ords) == len(set(ords))
    assert all(o >> 40 == file_index for o in ords)
    assert [d["ord"] for d in docs] == sorted(d["ord"] for d in docs)


def jsonl_lines(records: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


# ---------------------------------------------------------------- JSONL


@pytest.fixture
def mixed_jsonl(tmp_path: Path) -> Path:
    big = "word " * 1_000_000  # a 5 MB line
    lines = [
        json.dumps({"id": "a", "text": "alpha", "lang": "en"}).encode(),  # 0 doc id=a
        json.dumps({"text": "beta"}).encode(),  # 1 doc id=mixed.jsonl:1
        b'{"text": "broken',  # 2 bad_json
        b'{"text": "caf\xe9 latin-1"}',  # 3 invalid_utf8
        json.dumps({"id": "e", "text": " \n\t "}).encode(),  # 4 empty_text
        b"[1, 2, 3]",  # 5 not_an_object
        json.dumps({"id": 7, "body": "no text field"}).encode(),  # 6 missing_text
        json.dumps({"text": 5}).encode(),  # 7 missing_text (not a string)
        b"",  # 8 blank line: counted, yields nothing
        json.dumps({"id": True, "text": "gamma", "huge": "x" * 5000, "small": {"k": 1}}).encode(),  # 9
        json.dumps({"id": 10, "text": big}).encode(),  # 10 doc id="10"
        b'{"text": "lone \\ud800 surrogate"}',  # 11 invalid_utf8 (cannot be stored)
        b"{" + b"x" * 20_000,  # 12 bad_json, raw kept to 10 KB
        json.dumps({"text": "last, no newline"}).encode(),  # 13
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines))
    return path


def test_jsonl_counts_reasons_and_texts(mixed_jsonl: Path) -> None:
    docs, drops = read_all(mixed_jsonl)
    assert [d["text"] for d in docs] == ["alpha", "beta", "gamma", "word " * 1_000_000, "last, no newline"]
    assert [d["id"] for d in docs] == ["a", "mixed.jsonl:1", "mixed.jsonl:9", "10", "mixed.jsonl:13"]
    assert reasons(drops) == {
        "bad_json": 2,
        "invalid_utf8": 2,
        "empty_text": 1,
        "not_an_object": 1,
        "missing_text": 2,
    }
    assert [d["ord"] & RECORD_MASK for d in docs] == [0, 1, 9, 10, 13]
    assert sorted(d.doc["ord"] & RECORD_MASK for d in drops) == [2, 3, 4, 5, 6, 7, 11, 12]
    check_ords(docs, drops)
    assert all(d["source"] == "mixed.jsonl" and d["segments"] is None for d in docs)  # the path below the input


def test_jsonl_meta_and_drop_docs(mixed_jsonl: Path) -> None:
    docs, drops = read_all(mixed_jsonl)
    assert json.loads(docs[0]["meta"]) == {"lang": "en"}
    assert json.loads(docs[1]["meta"]) == {}
    assert json.loads(docs[2]["meta"]) == {"small": {"k": 1}}  # the id field and the >4 KB field are out
    by_index = {d.doc["ord"] & RECORD_MASK: d for d in drops}
    assert by_index[2].doc["text"] == '{"text": "broken'
    assert by_index[3].doc["text"] == '{"text": "caf\ufffd latin-1"}'
    assert by_index[6].doc["id"] == "7"
    assert by_index[4].doc["id"] == "e"
    assert by_index[12].doc["text"] == "{" + "x" * (MAX_RAW_BYTES - 1)
    for d in drops:
        assert {"id", "source", "ord", "text"} <= d.doc.keys()
        assert d.doc["source"] == "mixed.jsonl"


def test_jsonl_text_and_id_fields(tmp_path: Path) -> None:
    path = tmp_path / "custom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + jsonl_lines([{"key": "k1", "body": "one"}, {"key": 2.5, "body": "two"}]))
    docs, drops = read_all(path, text_field="body", id_field="key")
    assert drops == []
    assert [(d["id"], d["text"], d["meta"]) for d in docs] == [("k1", "one", "{}"), ("custom.jsonl:1", "two", "{}")]


def write_gzip_records(path: Path, n: int) -> list[str]:
    texts = [f"document {i} " + "lorem ipsum dolor sit amet " * (i % 7 + 1) for i in range(n)]
    with gzip.open(path, "wb") as fh:
        fh.write(jsonl_lines([{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]))
    return texts


def test_gzip_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl.gz"
    texts = write_gzip_records(path, 3000)
    docs, drops = read_all(path, file_index=3)
    assert drops == []
    assert [d["text"] for d in docs] == texts
    assert [d["id"] for d in docs] == [f"d{i}" for i in range(3000)]
    assert [d["ord"] for d in docs] == [(3 << 40) | i for i in range(3000)]


@pytest.mark.parametrize("cut", [0.3, 0.75])
def test_truncated_gzip_yields_prefix_then_one_drop(tmp_path: Path, cut: float) -> None:
    full = tmp_path / "full.jsonl.gz"
    texts = write_gzip_records(full, 20_000)
    data = full.read_bytes()
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: int(len(data) * cut)])
    docs, drops = read_all(path)
    assert reasons(drops) == {"truncated_file": 1}
    assert 0 < len(docs) < len(texts)
    assert [d["text"] for d in docs] == texts[: len(docs)]
    # nothing readable is lost: the cut falls within the one record after the last one read
    assert len(docs) > len(texts) * cut * 0.9
    assert drops[0].doc["ord"] == len(docs)
    check_ords(docs, drops)


def test_corrupt_gzip_is_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl.gz"
    texts = write_gzip_records(path, 5000)
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    path.write_bytes(bytes(data))
    docs, drops = read_all(path)
    # deflate has no per-block checksum: garbage between the damage and the CRC check at the end of
    # the member may come out as bad lines, but the file still ends with exactly one truncated_file
    assert drops[-1].reason == "truncated_file"
    assert reasons(drops)["truncated_file"] == 1
    assert len(docs) < 5000
    intact = 0  # the documents before the damage (at about half of the file) come out unchanged
    while intact < len(docs) and docs[intact]["text"] == texts[intact] and docs[intact]["ord"] == intact:
        intact += 1
    assert intact > 2000
    check_ords(docs, drops)


def test_zstd_single_and_multi_frame(tmp_path: Path) -> None:
    records = [{"text": f"zstd document {i}"} for i in range(2000)]
    cctx = zstandard.ZstdCompressor()
    single = tmp_path / "one.jsonl.zst"
    single.write_bytes(cctx.compress(jsonl_lines(records)))
    multi = tmp_path / "multi.jsonl.zst"  # two frames back to back, as pzstd or `cat` makes them
    multi.write_bytes(cctx.compress(jsonl_lines(records[:700])) + cctx.compress(jsonl_lines(records[700:])))
    for path in (single, multi):
        docs, drops = read_all(path)
        assert drops == []
        assert [d["text"] for d in docs] == [r["text"] for r in records]


def test_truncated_zstd(tmp_path: Path) -> None:
    records = [{"text": f"zstd document {i} " + "abc " * (i % 13)} for i in range(20_000)]
    data = zstandard.ZstdCompressor().compress(jsonl_lines(records))
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(data[: len(data) // 2])
    docs, drops = read_all(path)
    assert reasons(drops) == {"truncated_file": 1}
    assert 0 < len(docs) < len(records)
    assert [d["text"] for d in docs] == [r["text"] for r in records[: len(docs)]]


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    docs, drops = read_all(tmp_path / "nope.jsonl")
    assert docs == [] and reasons(drops) == {"unreadable_file": 1}
    docs, drops = read_all(tmp_path, fmt="jsonl")  # a folder given to a file reader
    assert docs == [] and reasons(drops) == {"unreadable_file": 1}


# ---------------------------------------------------------------- Parquet


def test_parquet(tmp_path: Path) -> None:
    n = 2500
    texts = [f"row {i}" for i in range(n)]
    texts[5] = None  # missing_text
    texts[7] = "   "  # empty_text
    table = pa.table({"id": [f"r{i}" for i in range(n)], "text": texts, "score": [i / 2 for i in range(n)]})
    path = tmp_path / "rows.parquet"
    pq.write_table(table, path, row_group_size=700)
    docs, drops = read_all(path)
    assert reasons(drops) == {"missing_text": 1, "empty_text": 1}
    assert len(docs) == n - 2
    assert [d["text"] for d in docs] == [t for i, t in enumerate(texts) if i not in (5, 7)]
    assert docs[0]["id"] == "r0" and json.loads(docs[3]["meta"]) == {"score": 1.5}
    assert {d.doc["id"] for d in drops} == {"r5", "r7"}
    check_ords(docs, drops)
    assert docs[-1]["ord"] == n - 1


def test_parquet_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "fake.parquet"
    path.write_bytes(b"this is not a parquet file at all")
    docs, drops = read_all(path)
    assert docs == [] and reasons(drops) == {"unreadable_file": 1}


# ---------------------------------------------------------------- text files


def test_text_folder(tmp_path: Path) -> None:
    root = tmp_path / "txt"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("first document\nwith two lines\n")
    (root / "sub" / "b.md").write_text("second – unicode ✓")
    (root / "c.txt").write_bytes(b"\xff\xfe not utf-8")
    (root / "d.txt").write_text("  \n")
    (root / "e.txt.gz").write_bytes(gzip.compress(b"compressed text"))
    files = expand_inputs([InputSpec(path=str(root))])
    assert [Path(p).relative_to(root).as_posix() for _, _, p in files] == [
        "a.txt", "c.txt", "d.txt", "e.txt.gz", "sub/b.md",
    ]
    docs, drops = [], []
    for file_index, spec, path in files:
        for item in read_file(file_index, path, spec):
            (drops if isinstance(item, Drop) else docs).append(item)
    assert [d["text"] for d in docs] == ["first document\nwith two lines\n", "compressed text", "second – unicode ✓"]
    assert [d["id"] for d in docs] == ["a.txt:0", "e.txt.gz:0", "sub/b.md:0"]  # path below the input folder
    assert [d["ord"] for d in docs] == [0, 3 << 40, 4 << 40]
    assert reasons(drops) == {"invalid_utf8": 1, "empty_text": 1}


def _ids(inputs: list[InputSpec]) -> list[str]:
    return [item.doc["id"] if isinstance(item, Drop) else item["id"]
            for file_index, spec, path in expand_inputs(inputs) for item in read_file(file_index, path, spec)]


def _same_named_files(root: Path) -> None:
    """``doc.txt`` and ``data.jsonl`` (records without ids) twice each, in two subfolders."""
    for sub in ("a", "b"):
        (root / sub).mkdir(parents=True)
        (root / sub / "doc.txt").write_text(f"text file in {sub}")
        (root / sub / "data.jsonl").write_text(f'{{"text": "record of {sub}"}}\n\n{{"text": "  "}}\n')
        pq.write_table(pa.table({"text": [f"row of {sub}"]}), root / sub / "rows.parquet")


def test_same_named_files_in_subfolders_get_distinct_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids made up for records without one are the path below the input + record index: unique within
    an input, the same on every run, and free of this machine's paths (they end up in shards)."""
    root = tmp_path / "one" / "corpus"
    _same_named_files(root)
    ids = _ids([InputSpec(path=str(root))])
    assert ids == ["a/data.jsonl:0", "a/data.jsonl:2", "a/doc.txt:0", "a/rows.parquet:0",
                   "b/data.jsonl:0", "b/data.jsonl:2", "b/doc.txt:0", "b/rows.parquet:0"]
    assert _ids([InputSpec(path=str(root))]) == ids  # a second run

    # the same corpus elsewhere (another machine, another checkout) gives the same ids
    elsewhere = tmp_path / "two" / "deeper" / "corpus"
    _same_named_files(elsewhere)
    assert _ids([InputSpec(path=str(elsewhere))]) == ids
    monkeypatch.chdir(root.parent)  # a relative input (a spec built in code) too
    assert _ids([InputSpec(path="corpus")]) == _ids([InputSpec(path="./corpus/")]) == ids

    # a glob: the path below its fixed leading folders; a single file: its name
    assert _ids([InputSpec(path=str(root / "*" / "doc.txt"))]) == ["a/doc.txt:0", "b/doc.txt:0"]
    assert _ids([InputSpec(path=str(root / "**" / "*.txt"))]) == ["a/doc.txt:0", "b/doc.txt:0"]
    assert _ids([InputSpec(path=str(root / "b" / "doc.txt"))]) == ["doc.txt:0"]


# ---------------------------------------------------------------- WARC / WET

ARTICLE = (
    "<html><head><title>Mill news</title></head><body><nav><a href='/'>Home</a> <a href='/x'>About</a></nav>"
    "<article><h1>The mill reopens</h1>"
    + "".join(
        f"<p>Paragraph {i}: the old water mill on the river reopened this week after a long restoration, "
        f"and the village gathered to watch the wheel turn again for the first time in decades.</p>"
        for i in range(6)
    )
    + "</article><footer>Copyright footer</footer></body></html>"
)


def write_warc(path: Path) -> dict[str, str]:
    """warcinfo, HTML response, request, PNG response, empty HTML response, WET conversion."""
    ids = {}
    with open(path, "wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        writer.write_record(writer.create_warcinfo_record("test.warc.gz", {"software": "tests"}))

        def response(url: str, body: bytes, ctype: str) -> str:
            http = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
            rec = writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=http)
            writer.write_record(rec)
            return rec.rec_headers.get_header("WARC-Record-ID")

        ids["article"] = response("https://example.org/mill", ARTICLE.encode(), "text/html; charset=utf-8")
        req = StatusAndHeaders("GET /mill HTTP/1.1", [("Host", "example.org")], is_http_request=True)
        writer.write_record(
            writer.create_warc_record("https://example.org/mill", "request", payload=io.BytesIO(b""),
                                      http_headers=req)
        )
        ids["png"] = response("https://example.org/a.png", b"\x89PNG\r\n\x1a\n...", "image/png")
        ids["empty"] = response("https://example.org/empty", b"<html><body></body></html>", "text/html")
        conv = writer.create_warc_record(
            "https://example.org/plain", "conversion",
            payload=io.BytesIO(b"Plain extracted text of a page.\nSecond line."),
            warc_content_type="text/plain",
        )
        writer.write_record(conv)
        ids["wet"] = conv.rec_headers.get_header("WARC-Record-ID")
    return ids


def test_warc(tmp_path: Path) -> None:
    path = tmp_path / "pages.warc.gz"
    ids = write_warc(path)
    docs, drops = read_all(path)
    assert reasons(drops) == {"no_text_extracted": 1}
    assert drops[0].doc["id"] == ids["empty"]
    assert [d["id"] for d in docs] == [ids["article"], ids["wet"]]
    article, wet = docs
    assert "The mill reopens" in article["text"] or "Paragraph 0" in article["text"]
    assert all(f"Paragraph {i}:" in article["text"] for i in range(6))
    assert "Home" not in article["text"] and "Copyright footer" not in article["text"]
    assert wet["text"] == "Plain extracted text of a page.\nSecond line."
    assert json.loads(article["meta"])["url"] == "https://example.org/mill"
    assert json.loads(wet["meta"])["url"] == "https://example.org/plain"
    # every WARC record counts: warcinfo 0, article 1, request 2, png 3, empty 4, conversion 5
    assert [d["ord"] for d in docs] == [1, 5] and drops[0].doc["ord"] == 4


def write_arc(path: Path, pages: dict[str, str]) -> None:
    """An ARC v1 file: the file description record, then one HTML response per page."""
    def record(url: str, body: bytes, ctype: str = "text/html") -> bytes:
        return f"{url} 93.184.216.34 20240101000000 {ctype} {len(body)}\n".encode() + body + b"\n"

    desc = b"1 0 InternetArchive\nURL IP-address Archive-date Content-type Archive-length\n"
    data = record("filedesc://pages.arc", desc, "text/plain")
    for url, text in pages.items():
        html = f"<html><body><article><p>{text}</p></article></body></html>".encode()
        data += record(url, b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n" + html)
    path.write_bytes(data)


def test_arc_records_get_the_same_ids_on_every_read(tmp_path: Path) -> None:
    """warcio gives an ARC record a random WARC-Record-ID on each read; ids must not change between runs
    (they end in shards, the dedup index and rejected/), so ARC documents get ``name:record_index``."""
    path = tmp_path / "pages.arc"
    write_arc(path, {f"http://example.org/{k}": f"Page {k} about the history of web archives and crawls. " * 8
                     for k in ("a", "b")})
    first, drops = read_all(path)
    again, _ = read_all(path)
    assert drops == [] and [d["id"] for d in first] == [d["id"] for d in again] == ["pages.arc:1", "pages.arc:2"]
    assert "Page a about the history" in first[0]["text"]
    assert json.loads(first[1]["meta"])["url"] == "http://example.org/b"


def test_truncated_warc(tmp_path: Path) -> None:
    full = tmp_path / "full.warc.gz"
    write_warc(full)
    data = full.read_bytes()
    path = tmp_path / "cut.warc.gz"
    path.write_bytes(data[: len(data) - 30])  # inside the last (conversion) record
    docs, drops = read_all(path)
    assert reasons(drops) == {"no_text_extracted": 1, "truncated_file": 1}
    assert len(docs) == 1
    plain = tmp_path / "plain.warc"
    plain.write_bytes(gzip.decompress(data)[:-40])  # uncompressed, cut inside the last record
    docs, drops = read_all(plain)
    assert reasons(drops) == {"no_text_extracted": 1, "truncated_file": 1}
    assert len(docs) == 1


def test_not_a_warc(tmp_path: Path) -> None:
    path = tmp_path / "junk.warc"
    path.write_text("hello\nthis is not a warc file\n")
    docs, drops = read_all(path)
    assert docs == [] and reasons(drops) == {"unreadable_file": 1}


# ---------------------------------------------------------------- SFT


def test_instruction_records(tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    path.write_bytes(
        jsonl_lines([
            {"id": "i1", "instruction": "Add 2 and 3.", "input": "", "output": "5", "source_set": "math"},
            {"instruction": "Translate.", "input": "bonjour", "output": "hello"},
            {"instruction": "No answer here."},
            {"instruction": "", "output": "x"},
        ])
    )
    docs, drops = read_all(path, fmt="instruction")
    assert reasons(drops) == {"bad_record:missing_output": 1, "bad_record:missing_instruction": 1}
    assert [d["id"] for d in docs] == ["i1", "sft.jsonl:1"]
    first = docs[0]
    segments = json.loads(first["segments"])
    assert segments == [["### Instruction:\nAdd 2 and 3.\n\n### Response:\n", False], ["5", True]]
    assert first["text"] == "".join(t for t, _ in segments)
    assert json.loads(first["meta"]) == {"source_set": "math"}
    assert "### Input:\nbonjour" in docs[1]["text"] and json.loads(docs[1]["segments"])[-1] == ["hello", True]


def test_instruction_custom_template(tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    path.write_bytes(jsonl_lines([{"instruction": "Say hi", "output": "hi"}]))
    docs, drops = read_all(path, fmt="instruction", template="Q: {instruction}\nA: ")
    assert drops == [] and docs[0]["text"] == "Q: Say hi\nA: hi"


def test_chat_records(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_bytes(
        jsonl_lines([
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
            {"messages": [{"role": "user", "content": "Anyone?"}]},
            {"messages": [{"role": "wizard", "content": "?"}]},
            {"messages": []},
        ])
        + b"not json\n"
    )
    docs, drops = read_all(path, fmt="chat")
    assert reasons(drops) == {
        "bad_record:no_assistant_turn": 1,
        "bad_record:bad_role": 1,
        "bad_record:missing_messages": 1,
        "bad_json": 1,
    }
    assert len(docs) == 1
    segments = json.loads(docs[0]["segments"])
    assert segments == [["<|user|>\n", False], ["Hi\n", False], ["<|assistant|>\n", False], ["Hello!\n", True]]
    assert docs[0]["text"] == "<|user|>\nHi\n<|assistant|>\nHello!\n"
    check_ords(docs, drops)


# ---------------------------------------------------------------- paths and formats


def test_expand_inputs(tmp_path: Path) -> None:
    for name in ["b.jsonl", "a.jsonl", "sub/c.jsonl", "sub/deep/d.jsonl", "x.txt"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}\n")
    inputs = [
        InputSpec(path=str(tmp_path / "**")),  # the folder and every file: each once
        InputSpec(path=str(tmp_path / "*.jsonl")),
        InputSpec(path=str(tmp_path / "missing*.jsonl")),
        InputSpec(path=str(tmp_path / "x.txt")),
    ]
    out = expand_inputs(inputs)
    rel = [(i, inputs.index(spec), Path(p).relative_to(tmp_path).as_posix()) for i, spec, p in out]
    assert rel == [
        (0, 0, "a.jsonl"), (1, 0, "b.jsonl"), (2, 0, "sub/c.jsonl"), (3, 0, "sub/deep/d.jsonl"), (4, 0, "x.txt"),
        (5, 1, "a.jsonl"), (6, 1, "b.jsonl"),
        (7, 3, "x.txt"),
    ]
    assert expand_inputs(inputs) == out
    assert expand_inputs([InputSpec(path=str(tmp_path / "nothing"))]) == []


@pytest.mark.parametrize(
    ("name", "declared", "expected"),
    [
        ("a.jsonl", "auto", "jsonl"),
        ("a.JSON.gz", "auto", "jsonl"),
        ("a.ndjson.zst", "auto", "jsonl"),
        ("a.parquet", "auto", "parquet"),
        ("CC-MAIN-1.warc.gz", "auto", "warc"),
        ("x.wet.gz", "auto", "warc"),
        ("x.warc", "auto", "warc"),
        ("old.arc", "auto", "warc"),
        ("readme.txt", "auto", "text"),
        ("notes", "auto", "text"),
        ("data.csv.gz", "auto", "text"),
        ("a.jsonl", "chat", "chat"),
        ("a.txt", "jsonl", "jsonl"),
    ],
)
def test_detect_format(name: str, declared: str, expected: str) -> None:
    assert detect_format(f"/data/{name}", declared) == expected
