"""Issue 9, the loader half: cases 9-12 (training/data.py, pipeline/shard_source.py, pipeline/shard_reader.py,
`tokenmill inspect`)
and the fuzz test of the manifest parser and the shard reader.

- case 9: credentials never cross to another origin on a redirect; errors name the URL actually fetched;
- case 10: every read is bounded (an endless HTTP body, a device in place of a shard, an oversized file);
- case 11: shard names stay inside ``shards/``; errors never echo file bytes;
- case 12: one strict manifest schema; ``.npy`` headers and JSON depth checked before anything is allocated.

Tests that would exhaust memory or hang on a loader without these bounds run in a subprocess with a 4 GiB
address-space limit and a timeout, so they fail cleanly instead of taking the machine down.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.output.shard_set import write_shard_set
from pipeline.shard_format import (
    MAX_MANIFEST_BYTES,
    Manifest,
    ShardFormatError,
    ShardInfo,
    encode_sample,
    iter_tar_samples,
    sha256_bytes,
)
from pipeline.shard_reader import read_shard_samples
from pipeline.shard_source import ShardSource, decode_shard
from training.data import LoaderError, ShardLoader, collate_flat
from training.synthetic import SYNTHETIC, QuietHandler, random_packed, serve_directory

REPO = Path(__file__).resolve().parent.parent
SEQ, VOCAB = 32, 300
SHARD0 = "shards/shard-000000.tar"
SECRET = b"".join(f"user{i}:x:{1000 + i}:{1000 + i}:Secret Person {i}:/home/user{i}:/bin/bash\n".encode()
                  for i in range(40))
# run a loader or `tokenmill inspect` with at most 4 GiB of address space: an unbounded read ends in a
# MemoryError there instead of swapping the test machine
BOUNDED = "import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
LOADER = BOUNDED + """
import sys
from training.data import LoaderError, ShardLoader
try:
    for _ in ShardLoader(sys.argv[1], 2, num_workers=0, shuffle=False).epoch_batches():
        pass
except LoaderError as exc:
    print(exc)
    sys.exit(3)
"""
INSPECT = BOUNDED + "import sys; from service.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def shardset(tmp_path_factory) -> Path:
    """11 samples in shards of 4: two full shards and a partial one."""
    out = tmp_path_factory.mktemp("set")
    write_shard_set(out, random_packed(11, SEQ, VOCAB, seed=5, max_doc=12), seq_len=SEQ, vocab_size=VOCAB,
                    samples_per_shard=4, **SYNTHETIC)
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))  # for `tokenmill inspect --decode`
    return out


@pytest.fixture()
def copyset(shardset, tmp_path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(shardset, out)
    return out


def epoch(location: str, batch: int = 2, **kw) -> list[dict]:
    return list(ShardLoader(location, batch, num_workers=0, shuffle=False, **kw).epoch_batches())


def keys(batches: list[dict]) -> list[str]:
    return [k for b in batches for k in b["keys"]]


def manifest_dict(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def write_manifest_dict(directory: Path, data: dict) -> None:
    (directory / "manifest.json").write_text(json.dumps(data))


def run_py(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


# ------------------------------------------------------------------------------------------ case 9


def recording(seen: list[dict[str, str]]) -> type[QuietHandler]:
    class Recording(QuietHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            super().do_GET()

    return Recording


def redirecting(target: str, seen: list[dict[str, str]]) -> type[QuietHandler]:
    class Redirecting(QuietHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(302)
            self.send_header("Location", target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Redirecting


CREDENTIALS = {"Authorization": "Bearer s3cret-token", "X-API-Key": "k3y-material"}


def test_cross_origin_redirect_never_carries_the_credentials(shardset):
    """Case 9: a shard server redirecting everything to another origin (another loopback port). The
    redirects are followed (the set loads), and the second server never sees Authorization or the API key."""
    first, second = [], []
    with serve_directory(shardset, recording(second)) as other, \
            serve_directory(shardset, redirecting(other, first)) as url:
        remote = epoch(url, headers=CREDENTIALS)
    assert keys(remote) == keys(epoch(str(shardset)))
    assert first and all(h.get("authorization") == CREDENTIALS["Authorization"] for h in first)
    assert len(second) == len(first)  # every request was redirected and followed
    for headers in second:
        assert "authorization" not in headers and "x-api-key" not in headers
        assert not any("s3cret" in v or "k3y" in v for v in headers.values())


def test_same_origin_redirect_keeps_the_credentials(shardset):
    """Case 9 (the other side of the policy): a redirect within the same origin keeps the headers, so a
    server that moves its files and checks the key still works."""
    class Moved(QuietHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/old/"):
                self.send_response(301)
                self.send_header("Location", "/new/" + self.path[len("/old/"):])
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.headers.get("Authorization") != CREDENTIALS["Authorization"]:
                self.send_error(401)
            else:
                self.path = self.path[len("/new"):]
                super().do_GET()

    with serve_directory(shardset, Moved) as url:
        assert keys(epoch(url + "/old", headers=CREDENTIALS)) == keys(epoch(str(shardset)))
        with pytest.raises(LoaderError, match="HTTP 401"):
            epoch(url + "/old")


def test_errors_name_the_url_actually_fetched(shardset, tmp_path):
    """Case 9: a redirect to a server that has nothing: the error names where the 404 came from."""
    with serve_directory(tmp_path, recording([])) as other, \
            serve_directory(shardset, redirecting(other + "/moved", [])) as url:
        with pytest.raises(LoaderError) as err:
            epoch(url)
    assert f"HTTP 404 File not found from {other}/moved/manifest.json" in str(err.value)


def test_redirect_to_another_scheme_is_refused(shardset):
    """Case 9: only http(s) redirects are followed (urllib would also follow one to ftp://)."""
    with serve_directory(shardset, redirecting("ftp://127.0.0.1:9", [])) as url:
        with pytest.raises(LoaderError, match=r"manifest.json: HTTP 302 redirect to a non-HTTP URL ftp://127.0.0.1:9"):
            ShardSource(url, retries=0).manifest()


def test_a_server_that_never_answers_times_out():
    """Case 9 (timeouts): a listening socket that never answers: the read times out, with the URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(LoaderError, match=rf"manifest.json: cannot fetch {url}/manifest.json after 1 tries: "
                                              r".*timed out"):
            ShardSource(url, timeout=0.5, retries=0).manifest()


# ----------------------------------------------------------------------------------------- case 10


def endless(sent: list[int], what: str, mode: str) -> type[QuietHandler]:
    """Serves the set, but ``what`` (a shard or the manifest) as a body that never ends (up to 256 MiB):
    with no length, declaring 1 TiB, or chunked under a small (ignored) Content-Length."""
    class Endless(QuietHandler):
        def do_GET(self) -> None:
            if not self.path.endswith(what):
                return super().do_GET()
            self.send_response(200)
            if mode == "huge-length":
                self.send_header("Content-Length", str(1 << 40))
            if mode == "chunked":
                self.send_header("Content-Length", "10")
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            block = b"\0" * (1 << 16)
            if mode == "chunked":
                block = f"{len(block):x}\r\n".encode() + block + b"\r\n"
            with contextlib.suppress(OSError):
                while sent[0] < 256 << 20:
                    self.wfile.write(block)
                    sent[0] += len(block)
            self.close_connection = True

    return Endless


@pytest.mark.parametrize("mode", ["no-length", "huge-length", "chunked"])
@pytest.mark.parametrize("what", [".tar", "manifest.json"])
def test_an_endless_http_body_is_cut_at_its_bound(shardset, what, mode):
    """Case 10: an endless body (with no length, declaring 1 TiB, or chunked) is refused once it passes the
    manifest's ``bytes`` for a shard, or 64 MiB for the manifest: the server is never read further."""
    sent = [0]
    with serve_directory(shardset, endless(sent, what, mode)) as url:
        with pytest.raises(LoaderError) as err:
            epoch(url)
    msg = str(err.value)
    if what == ".tar":
        limit = Manifest.load(shardset).shards[0].bytes
        assert msg.startswith(f"{SHARD0}: {url}/{SHARD0} ")
        assert sent[0] < 32 << 20
    else:
        limit = MAX_MANIFEST_BYTES
        assert msg.startswith(f"manifest.json: {url}/manifest.json ")
        assert sent[0] < limit + (32 << 20)
    huge = mode == "huge-length"
    expected = f"declares {1 << 40} bytes, more than the {limit}" if huge else f"more than the {limit} bytes"
    assert expected in msg


def test_a_device_in_place_of_a_shard_is_refused(copyset):
    """Case 10: a shard that is /dev/zero (a symlink: the name itself is valid) gives a LoaderError naming
    it, at once, in the loader (bounded subprocess: an unbounded read would end in MemoryError)."""
    (copyset / SHARD0).unlink()
    (copyset / SHARD0).symlink_to("/dev/zero")
    proc = run_py(LOADER, str(copyset))
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stdout.strip() == f"{SHARD0}: cannot read {copyset / SHARD0}: not a regular file"


def test_tokenmill_inspect_does_not_hang_on_a_device(copyset):
    """Case 10: `tokenmill inspect` on the same set ends (it hung forever hashing /dev/zero): the check
    reports the shard, exit 1; decoding without the check is one error line naming the shard, exit 2."""
    (copyset / SHARD0).unlink()
    (copyset / SHARD0).symlink_to("/dev/zero")
    proc = run_py(INSPECT, "inspect", str(copyset), timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"BAD {SHARD0}: not a regular file" in proc.stdout.splitlines()
    assert "checksums   2/3 OK" in proc.stdout
    proc = run_py(INSPECT, "inspect", str(copyset), "--no-verify", "--decode", "2", timeout=60)
    assert_one_line_error(proc, f"shard {SHARD0}: not a regular file")


def test_a_file_longer_than_its_manifest_entry_is_not_read(copyset):
    """Case 10: a local shard replaced by a 256 MiB (sparse) file: refused from its size, naming the shard,
    in the loader and in `inspect`."""
    path = copyset / SHARD0
    limit = path.stat().st_size
    path.unlink()
    with open(path, "wb") as f:
        f.truncate(256 << 20)
    with pytest.raises(LoaderError, match=rf"^{SHARD0}: cannot read .*: {256 << 20} bytes, more than the {limit} "):
        epoch(str(copyset))
    proc = run_py(INSPECT, "inspect", str(copyset), timeout=60)
    assert proc.returncode == 1 and f"BAD {SHARD0}: {256 << 20} bytes, manifest says {limit}" in proc.stdout


def test_an_oversized_manifest_is_refused(tmp_path):
    """Case 10: the manifest itself is bounded (64 MiB)."""
    with open(tmp_path / "manifest.json", "wb") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)
    with pytest.raises(LoaderError, match=f"manifest.json: cannot read .*: {MAX_MANIFEST_BYTES + 1} bytes, more than"):
        ShardLoader(str(tmp_path), 2)


# ----------------------------------------------------------------------------------------- case 11


@pytest.mark.parametrize("name", [
    "/etc/passwd", "shards/../../../../etc/passwd", "../manifest.json", "shards/../manifest.json",
    "shards\\shard-000000.tar", "shards//shard-000000.tar", "shards/./shard-000000.tar", "shard-000000.tar",
    "shards/", "", "shards/shard 000000.tar", "shards/shard-000000.tar?x=1",
])
def test_shard_names_must_be_plain_paths_inside_shards(copyset, name):
    """Case 11: absolute names, `..`, backslashes, empty parts, names outside shards/: the manifest is
    refused before anything is read, naming the field."""
    data = manifest_dict(copyset)
    data["shards"][0]["name"] = name
    write_manifest_dict(copyset, data)
    with pytest.raises(LoaderError, match=r"/manifest.json: malformed manifest: shards\.0\.name: "):
        ShardLoader(str(copyset), 2)
    proc = run_py(INSPECT, "inspect", str(copyset), timeout=60)
    assert_one_line_error(proc, "no readable manifest.json (malformed manifest: shards.0.name: ")


def test_errors_never_echo_the_bytes_of_a_file(copyset, tmp_path):
    """Case 11: a 'shard' that is another file (an absolute name, then a symlink), with the right size
    and sha256 in the manifest: no error message holds any of that file's bytes."""
    secret = tmp_path / "passwd"
    secret.write_bytes(SECRET)
    data = manifest_dict(copyset)
    data["shards"] = [{"name": str(secret), "samples": 1, "tokens": 1, "sha256": sha256_bytes(SECRET),
                       "bytes": len(SECRET), "partial": True}]
    data.update(samples_per_shard=4, total_samples=1, total_tokens=1)
    write_manifest_dict(copyset, data)
    messages = []
    with pytest.raises(LoaderError) as err:
        epoch(str(copyset), batch=1)
    messages.append(str(err.value))
    data["shards"][0]["name"] = SHARD0
    write_manifest_dict(copyset, data)
    (copyset / SHARD0).unlink()
    (copyset / SHARD0).symlink_to(secret)
    with pytest.raises(LoaderError) as err:
        epoch(str(copyset), batch=1)
    messages.append(str(err.value))
    assert messages[1].startswith(f"shard {SHARD0}: cannot decode: ")
    with pytest.raises(ShardFormatError) as err:
        list(iter_tar_samples(io.BytesIO(SECRET)))  # what `inspect` decodes with
    messages.append(str(err.value))
    for msg in messages:
        for fragment in ("user", ":x:10", "Secret", "/home/", "bin/bash"):
            assert fragment not in msg, msg


# ----------------------------------------------------------------------------------------- case 12


def _set(data: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for p in parents:
        data = data[int(p)] if p.isdigit() else data[p]
    data[int(last) if last.isdigit() else last] = value


MANIFEST_CASES = {  # what is changed in a valid manifest -> what the error says
    "negative samples": (lambda d: _set(d, "shards.0.samples", -5),
                         r"shards\.0 \(shards/shard-000000\.tar\)\.samples: -5 is outside \[1, 4\]"),
    "samples as a string": (lambda d: _set(d, "shards.0.samples", "4"),
                            r"shards\.0 .*\.samples: must be an integer, got str"),
    "samples as a bool": (lambda d: _set(d, "shards.0.samples", True),
                          r"shards\.0 .*\.samples: must be an integer, got bool"),
    "seq_len as a string": (lambda d: _set(d, "seq_len", "16"), r"seq_len: must be an integer, got str"),
    "tokens as a float": (lambda d: _set(d, "shards.1.tokens", 7.5),
                          r"shards\.1 .*\.tokens: must be an integer, got float"),
    "the same entry twice": (lambda d: d["shards"].insert(1, copy.deepcopy(d["shards"][0])),
                             r"shards\.1\.name: shards/shard-000000\.tar is listed twice"),
    "the same data under another name": (
        lambda d: d["shards"].insert(1, {**d["shards"][0], "name": "shards/again.tar"}),
        r"shards\.1 \(shards/again\.tar\)\.sha256: same checksum as another shard"),
    "a partial shard first": (lambda d: d["shards"].reverse(),
                              r"shards\.0 .*: only the last shard may be partial, this one holds 3 of 4"),
    "short last shard not partial": (lambda d: _set(d, "shards.2.partial", False),
                                     r"shards\.2 .*\.partial: False but it holds 3 of 4 samples"),
    "zero bytes": (lambda d: _set(d, "shards.0.bytes", 0), r"shards\.0 .*\.bytes: 0 is outside"),
    "bytes too small for the tokens": (lambda d: _set(d, "shards.0.bytes", 10),
                                       r"shards\.0 .*\.bytes: 10 cannot hold"),
    "sha256 not hex": (lambda d: _set(d, "shards.0.sha256", "ABC"),
                       r"shards\.0 .*\.sha256: must be 64 lowercase hex digits"),
    "total_samples wrong": (lambda d: _set(d, "total_samples", 12), r"total_samples: 12 but the shards add up to 11"),
    "total_tokens missing": (lambda d: d.pop("total_tokens"), r"total_tokens: must be an integer, got null"),
    "huge seq_len": (lambda d: _set(d, "seq_len", 1 << 40), r"seq_len: 1099511627776 is outside"),
    "zero samples_per_shard": (lambda d: _set(d, "samples_per_shard", 0), r"samples_per_shard: 0 is outside"),
    "pad_id outside the vocabulary": (lambda d: _set(d, "pad_id", VOCAB),
                                      rf"pad_id: {VOCAB} is outside \[0, {VOCAB - 1}\]"),
    "dtype not the vocabulary's": (lambda d: _set(d, "dtype", "float32"),
                                   r"dtype: <other> but a vocabulary of 300 is stored as uint16"),
    "format_version 2": (lambda d: _set(d, "format_version", 2), r"format_version: unsupported shard format version 2"),
    "unknown field": (lambda d: _set(d, "surprise", 1), r"surprise: unknown field"),
    "missing sha256": (lambda d: d["shards"][0].pop("sha256"), r"shards\.0\.sha256: missing"),
    "shards not a list": (lambda d: _set(d, "shards", {"a": 1}), r"shards: must be list, got dict"),
    "shard entry not an object": (lambda d: _set(d, "shards.0", "shards/shard-000000.tar"),
                                  r"shards\.0: must be an object, got str"),
}


@pytest.mark.parametrize("case", list(MANIFEST_CASES))
def test_manifest_values_are_validated(copyset, case):
    """Case 12: wrong types (a string, a bool, a float for an int), negative or huge values, repeated
    entries or data, a partial shard in the middle, inconsistent totals: the loader refuses the manifest
    with one line naming the field, and `tokenmill inspect` prints the same line, exit 2."""
    change, message = MANIFEST_CASES[case]
    data = manifest_dict(copyset)
    change(data)
    write_manifest_dict(copyset, data)
    with pytest.raises(LoaderError, match=f"^{re.escape(str(copyset))}/manifest.json: malformed manifest: " + message):
        ShardLoader(str(copyset), 2)
    proc = run_py(INSPECT, "inspect", str(copyset), timeout=60)
    assert_one_line_error(proc, "no readable manifest.json (malformed manifest: ")


def test_deeply_nested_manifest_is_refused(copyset):
    """Case 12: 100k nested lists in the manifest's `extra`: a LoaderError, not a RecursionError."""
    text = (copyset / "manifest.json").read_text()
    depth = 100_000
    text = text.replace('"extra": {}', '"extra": {"x": ' + "[" * depth + "]" * depth + "}")
    (copyset / "manifest.json").write_text(text)
    with pytest.raises(LoaderError, match="JSON nested deeper than 32 levels"):
        ShardLoader(str(copyset), 2)


def test_duplicate_json_keys_are_refused(copyset):
    """Case 12: a second "shards" key would silently replace the first."""
    text = (copyset / "manifest.json").read_text().replace('"dtype":', '"shards": [], "dtype":', 1)
    (copyset / "manifest.json").write_text(text)
    with pytest.raises(LoaderError, match="key shards appears twice"):
        ShardLoader(str(copyset), 2)


def test_the_writer_and_a_manifest_built_in_code_get_the_same_schema(shardset):
    """Case 12: one schema shared by writer and loader: `to_json` (what the shard writer publishes with)
    refuses what the loader would, and the loader checks a Manifest object it is handed."""
    m = Manifest.load(shardset)
    bad = copy.deepcopy(m)
    bad.shards[0].samples = -5
    with pytest.raises(ShardFormatError, match=r"shards\.0 .*\.samples: -5 is outside"):
        bad.to_json()
    with pytest.raises(LoaderError, match=r"invalid manifest: shards\.0 .*\.samples: -5 is outside"):
        ShardLoader(str(shardset), 2, manifest=bad)
    assert Manifest.from_json(m.to_json()) == m


def tar_of(members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def sample_members(index: int, n: int = 5, meta: dict | None = None) -> list[tuple[str, bytes]]:
    sample = encode_sample(index, np.arange(n, dtype=np.uint16), np.array([n]), None, meta or {"i": index})
    key = sample.pop("__key__")
    return [(f"{key}.{ext}", payload) for ext, payload in sample.items()]


def npy_with_header(header: str, body: bytes = b"\0" * 16) -> bytes:
    text = header.encode("latin1")
    text += b" " * (63 - (10 + len(text)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + body


def one_shard_set(directory: Path, members: list[tuple[str, bytes]], samples: int = 1) -> Path:
    data = tar_of(members)
    (directory / "shards").mkdir(parents=True, exist_ok=True)
    (directory / SHARD0).write_bytes(data)
    m = Manifest(spec_hash="t", tokenizer_hash="t", seq_len=SEQ, dtype="uint16", vocab_size=VOCAB,
                 samples_per_shard=samples, bos_id=None, eos_id=None, pad_id=0, has_loss_mask=False,
                 shards=[ShardInfo(SHARD0, samples, samples, sha256_bytes(data), len(data), False)])
    (directory / "manifest.json").write_text(m.to_json())
    return directory


def _replace(members: list[tuple[str, bytes]], ext: str, payload: bytes) -> list[tuple[str, bytes]]:
    return [(n, payload if n.endswith(ext) else p) for n, p in members]


HUGE_2D = "{'descr': '<u2', 'fortran_order': False, 'shape': (1048576, 1048576), }"
SHARD_CASES = {
    "2-D huge shape": (_replace(sample_members(0), "input_ids.npy", npy_with_header(HUGE_2D)),
                       "input_ids.npy: .npy array is not 1-D"),
    "1-D huge shape": (_replace(sample_members(0), "input_ids.npy", npy_with_header(
        "{'descr': '<u2', 'fortran_order': False, 'shape': (1099511627776,), }")),
        "input_ids.npy: .npy header declares 1099511627776 x uint16 but 16 bytes follow"),
    "float dtype": (_replace(sample_members(0), "input_ids.npy", npy_with_header(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }")), "input_ids.npy: dtype <f8 not allowed"),
    "object dtype": (_replace(sample_members(0), "doc_lens.npy", npy_with_header(
        "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }")), "doc_lens.npy: dtype |O not allowed"),
    "garbage header": (_replace(sample_members(0), "doc_lens.npy", npy_with_header("{'descr': __import__('os')}")),
                       "doc_lens.npy: unreadable .npy header"),
    "deep meta.json": (_replace(sample_members(0), "meta.json", b"[" * 100_000 + b"]" * 100_000),
                       "meta.json: JSON nested deeper than 32 levels"),
    "meta.json not an object": (_replace(sample_members(0), "meta.json", b"[1, 2]"),
                                "meta.json is not a JSON object"),
    "meta.json not UTF-8": (_replace(sample_members(0), "meta.json", b'{"a": "\xff"}'),
                            "meta.json: not UTF-8 text"),
    "negative doc_lens": (_replace(sample_members(0), "doc_lens.npy", encode_sample(
        0, np.arange(5, dtype=np.uint16), np.array([10, -5]))["doc_lens.npy"]),
        "doc_lens must be >= 0 and sum to the 5 tokens"),
    "no doc_lens": ([m for m in sample_members(0) if not m[0].endswith("doc_lens.npy")], "no doc_lens.npy member"),
    "pickle member": (sample_members(0) + [("0000000000.payload.pickle", b"\x80\x04.")],
                      "refusing to decode members ['payload.pickle']"),
    "a key repeated": (sample_members(0) + sample_members(1) + sample_members(0)[:1],
                       "sample 0000000000: its members are not adjacent (key repeated)"),
}


@pytest.mark.parametrize("case", list(SHARD_CASES))
def test_shard_members_are_checked_before_anything_is_allocated(tmp_path, case):
    """Case 12: a shard whose checksum matches but whose members lie (2-D or huge .npy shapes, disallowed
    dtypes, a 100k-deep meta.json...): a LoaderError naming the shard, never MemoryError/RecursionError; the
    reference decoder `inspect` uses says the same."""
    members, message = SHARD_CASES[case]
    samples = 3 if case == "a key repeated" else 1
    directory = one_shard_set(tmp_path, members, samples)
    with pytest.raises(LoaderError) as err:
        epoch(str(directory), batch=1)
    assert str(err.value).startswith(f"shard {SHARD0}: cannot decode: ") and message in str(err.value)
    with pytest.raises(ShardFormatError) as ref_err:
        list(iter_tar_samples(io.BytesIO((directory / SHARD0).read_bytes())))
    assert message in str(ref_err.value)


def test_a_sound_crafted_shard_still_loads(tmp_path):
    """The counterpart of the case-12 shard checks: the same construction with honest members loads."""
    directory = one_shard_set(tmp_path, sample_members(0) + sample_members(1), samples=2)
    batches = epoch(str(directory), batch=1)
    assert keys(batches) == [f"{SHARD0}/0000000000", f"{SHARD0}/0000000001"]


# ------------------------------------------------------------------------------------------- fuzz


class Hang(BaseException):
    """An example ran past its time bound (BaseException: no handler under test may swallow it)."""


@contextlib.contextmanager
def time_bound(seconds: float):
    def alarm(*_args) -> None:
        raise Hang(f"example ran over {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


FUZZ = settings(deadline=timedelta(seconds=5), derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
PATH_TRICKS = ["/etc/passwd", "shards/../../etc/passwd", "..", "shards/..", "shards\\x.tar", "shards//x.tar",
               "shards/./x.tar", "", "shards/", "C:\\x.tar", "shards/x.tar\0", "shards/%2e%2e/x", "~/x.tar",
               "shards/" + "a" * 300, "file:///etc/passwd", "http://127.0.0.1:9/x"]
RAW_JSON = st.one_of(
    st.integers(1, 200_000).map(lambda d: "[" * d + "]" * d),
    st.integers(1, 50_000).map(lambda d: '{"a":' * d + "1" + "}" * d),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, "-0", "1.0", '"\\ud800"', "[]", "{}"]),
)
VALUES = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2, 3, 4, 5, 31, 32, 33, 299, 300, 65536, 2**31, 2**32, 2**63, 2**64]),
    st.booleans(), st.none(), st.floats(), st.text(max_size=30), st.sampled_from(PATH_TRICKS),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    RAW_JSON.map(lambda raw: ("raw", raw)),
)
TOP_KEYS = ["spec_hash", "tokenizer_hash", "seq_len", "dtype", "vocab_size", "samples_per_shard", "bos_id", "eos_id",
            "pad_id", "has_loss_mask", "shards", "format_version", "extra", "total_samples", "total_tokens", "bogus"]
SHARD_KEYS = ["name", "samples", "tokens", "sha256", "bytes", "partial", "bogus"]
OPS = ["top", "shard", "del_top", "del_shard", "dup", "drop", "swap", "name", "shard_value"]


@st.composite
def mutated_manifests(draw, base: dict) -> str:
    data = copy.deepcopy(base)
    raws: dict[str, str] = {}

    def value():
        v = draw(VALUES)
        if isinstance(v, tuple):  # raw JSON text, spliced in after json.dumps
            marker = f"@@raw{len(raws)}@@"
            raws[f'"{marker}"'] = v[1]
            return marker
        return v

    for _ in range(draw(st.integers(1, 3))):
        shards = data.get("shards") if isinstance(data.get("shards"), list) else []
        op = draw(st.sampled_from(OPS))
        i = draw(st.integers(0, max(0, len(shards) - 1)))
        entry = shards[i] if shards and isinstance(shards[i], dict) else None
        if op == "top":
            data[draw(st.sampled_from(TOP_KEYS))] = value()
        elif op == "shard" and entry is not None:
            entry[draw(st.sampled_from(SHARD_KEYS))] = value()
        elif op == "del_top":
            data.pop(draw(st.sampled_from(TOP_KEYS)), None)
        elif op == "del_shard" and entry is not None:
            entry.pop(draw(st.sampled_from(SHARD_KEYS)), None)
        elif op == "dup" and shards:
            shards.insert(draw(st.integers(0, len(shards))), copy.deepcopy(shards[i]))
        elif op == "drop" and shards:
            shards.pop(i)
        elif op == "swap" and len(shards) > 1:
            j = draw(st.integers(0, len(shards) - 1))
            shards[i], shards[j] = shards[j], shards[i]
        elif op == "name" and entry is not None:
            entry["name"] = draw(st.sampled_from(PATH_TRICKS + [s["name"] for s in base["shards"]]))
        elif op == "shard_value" and shards:
            shards[i] = value()
    text = json.dumps(data)
    for marker, raw in raws.items():
        text = text.replace(marker, raw)
    cut = draw(st.one_of(st.none(), st.integers(0, len(text))))
    if cut is not None:  # a truncated or byte-flipped file
        text = text[:cut] + draw(st.text(max_size=3))
    return text


@pytest.fixture(scope="module")
def fuzz_set(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fuzzset")
    write_shard_set(out, random_packed(7, 16, 50, seed=2, max_doc=6), seq_len=16, vocab_size=50, samples_per_shard=3,
                    **SYNTHETIC)
    return out


def test_fuzz_manifests_only_ever_raise_loader_error(fuzz_set):
    """Fuzz (issue 9): 1,500 manifests mutated from a valid one (wrong types, negative and huge numbers,
    duplicated, dropped and swapped entries, path tricks, deep nesting, truncation): loading the set and
    reading one epoch raises LoaderError or nothing, never MemoryError, RecursionError, TypeError, KeyError;
    and each example ends within its time bound."""
    base = manifest_dict(fuzz_set)
    path = fuzz_set / "manifest.json"
    original = path.read_bytes()

    @settings(FUZZ, max_examples=1500)
    @given(text=mutated_manifests(base))
    def check(text: str) -> None:
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        with time_bound(20):
            try:
                for _ in ShardLoader(str(fuzz_set), 2, num_workers=0, shuffle_window=3).epoch_batches():
                    pass
            except LoaderError:
                pass

    try:
        check()
    finally:
        path.write_bytes(original)


SEED = st.integers(0, 2**32 - 1)
NAME_CHARS = list("abcxyz0123456789._-/\\:* \t\né漢\u202e")


def random_bytes(max_size: int) -> st.SearchStrategy[bytes]:
    """Bulk bytes from a drawn seed: hypothesis drawing them byte by byte made the fuzz test 5x slower."""
    return st.builds(lambda seed, n: np.random.default_rng(seed).bytes(n), SEED, st.integers(0, max_size))


def random_text(max_size: int) -> st.SearchStrategy[str]:
    return st.builds(lambda seed, n: "".join(np.random.default_rng(seed).choice(NAME_CHARS, n)), SEED,
                     st.integers(1, max_size))


def npy_headers() -> st.SearchStrategy[bytes]:
    descr = st.sampled_from(["<u2", "<u4", "<i4", "<i8", "|u1", "|b1", "<f8", "|O", ">u2", "<U5", "|V8", "<c16",
                             "xx", "", "<i0", "[('a', '<i4')]"])
    dim = st.integers(-5, 2**64)
    shape = st.one_of(st.tuples(dim), st.tuples(dim, dim), st.just(()), st.tuples(dim, dim, dim), st.just("(1,"))
    header = st.one_of(
        st.builds(lambda d, f, s: f"{{'descr': {d!r}, 'fortran_order': {f}, 'shape': {s!r}, }}", descr, st.booleans(),
                  shape),
        random_text(120),
        st.integers(1, 5000).map(lambda d: "{'descr': " + "(" * d + ")" * d + "}"),
    )
    return st.builds(
        lambda h, version, hlen, body: (b"\x93NUMPY" + bytes([version, 0]) + (hlen if hlen is not None else len(
            h.encode())).to_bytes(2 if version == 1 else 4, "little") + h.encode() + body),
        header, st.sampled_from([1, 2, 3, 0, 9]), st.one_of(st.none(), st.integers(0, 65535)), random_bytes(40))


def valid_npy() -> st.SearchStrategy[bytes]:
    dtype = st.sampled_from(["<u2", "<u4", "<i4", "<i8", "|u1", "<f4"])
    return st.builds(lambda d, n: encode_sample(0, np.zeros(n, dtype=np.dtype(d)), np.array([n]))["input_ids.npy"],
                     dtype, st.integers(0, 40))


PAYLOADS = st.one_of(
    npy_headers(), valid_npy(), random_bytes(200),
    st.builds(lambda b, k: b[:k], valid_npy(), st.integers(0, 300)),  # truncated
    RAW_JSON.map(str.encode), st.just(b'{"doc_ids": ["a"], "ords": [0]}'), random_text(50).map(str.encode),
)
NAMES = st.one_of(
    st.builds(lambda k, ext: f"{k:010d}.{ext}", st.integers(0, 3), st.sampled_from(
        ["input_ids.npy", "doc_lens.npy", "loss_mask.npy", "meta.json", "pickle", "npy", ""])),
    random_text(120),
)


@st.composite
def shard_bytes(draw) -> tuple[bytes, int]:
    members = draw(st.lists(st.tuples(NAMES, PAYLOADS), max_size=8))
    honest = draw(st.lists(st.integers(0, 3), max_size=3))  # some real samples mixed in
    for k in honest:
        members[draw(st.integers(0, len(members))):0] = sample_members(k, n=draw(st.integers(1, 20)))
    fmt = draw(st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]))
    data = tar_of(members, fmt)
    mutation = draw(st.sampled_from(["none", "truncate", "flip", "random"]))
    if mutation == "truncate":
        data = data[:draw(st.integers(0, len(data)))]
    elif mutation == "flip" and data:
        buf = bytearray(data)
        rng = np.random.default_rng(draw(SEED))
        for _ in range(draw(st.integers(1, 8))):
            buf[rng.integers(len(buf))] = rng.integers(256)
        data = bytes(buf)
    elif mutation == "random":
        data = draw(random_bytes(3000))
    keys = {m[0].partition(".")[0] for m in members}
    return data, max(1, len(keys))


@settings(FUZZ, max_examples=2500)
@given(shard=shard_bytes())
def test_fuzz_shard_members_only_ever_raise_loader_error(shard):
    """Fuzz (issue 9): 2,500 shards of generated tar members (random bytes, truncated and bogus .npy headers,
    huge and 2-D shapes, odd dtypes, deep JSON, random names, pax/GNU records, truncated and byte-flipped
    archives) whose size and sha256 match the manifest entry: `decode_shard` and the batch collation raise
    LoaderError or nothing; the fast reader and `inspect`'s reference decoder raise ShardFormatError or
    nothing; each example ends within its time bound."""
    data, samples = shard
    info = ShardInfo(SHARD0, samples, samples, sha256_bytes(data), len(data), False)
    with time_bound(20):
        try:
            decoded = decode_shard(info, data)
            collate_flat(decoded, SEQ, 0, VOCAB, [s.key for s in decoded])
        except LoaderError:
            pass
        for decoder in (read_shard_samples, lambda b: list(iter_tar_samples(io.BytesIO(b)))):
            try:
                decoder(data)
            except ShardFormatError:
                pass


def test_the_fuzz_time_bound_stops_a_hang():
    """The fuzz tests' per-example bound is real: besides hypothesis' deadline (which only judges an example
    that ends), the alarm ends one that never would."""
    with pytest.raises(Hang), time_bound(0.05):
        while True:
            os.sched_yield()
