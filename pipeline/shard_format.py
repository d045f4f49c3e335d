"""The shard contract shared by the shard writer, the trainer's loader and ``tokenmill inspect``.

One WebDataset sample is one packed sequence: ``input_ids.npy`` (uint16 when the vocabulary fits,
else uint32; unpadded, so its length is the sum of ``doc_lens``), ``doc_lens.npy`` (int32),
optionally ``loss_mask.npy`` (uint8, 0 on prompt tokens) and a small ``meta.json``.
Only ``.npy`` (1-D integer arrays, header checked before anything is allocated) and ``.json``
(nesting bounded) are ever decoded: no pickle anywhere.

A manifest or a shard may come from anywhere (a copied folder, an HTTP server), so everything read
here is treated as hostile: :meth:`Manifest.validate` is the one strict schema the writer (through
:meth:`Manifest.to_json`), the loader and ``inspect`` all apply, every read is bounded (the manifest
by :data:`MAX_MANIFEST_BYTES`, a shard by its own ``bytes`` entry), and every problem is a
:class:`ShardFormatError` whose one-line message names the field or member and never echoes file bytes.
This module imports nothing of ours, so the trainer can use it alone.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
from numpy.lib import format as npy_format

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATS = "stats.json"
TOKENIZER = "tokenizer.json"
SHARD_DIR = "shards"
ALLOWED_EXTENSIONS = ("input_ids.npy", "doc_lens.npy", "loss_mask.npy", "meta.json")

MAX_MANIFEST_BYTES = 64 << 20  # ~400k shard entries: far beyond any real set, small enough to hold
MAX_SHARD_BYTES = 1 << 32  # the loader holds a whole shard in memory; WebDataset advises ~0.1-1 GB
MAX_SEQ_LEN = 1 << 22  # a batch row is allocated from seq_len before any sample is read
MAX_SAMPLES_PER_SHARD = 1 << 31
MAX_VOCAB = 1 << 32  # ids are uint32 at most
MAX_JSON_DEPTH = 32  # meta.json and the manifest's ``extra``; real ones nest 2-3 deep
MAX_NPY_HEADER = 10_000  # numpy's own default limit for an .npy header
TOKEN_DTYPES = ("uint16", "uint32")


class ShardFormatError(ValueError):
    """A manifest or shard that breaks the contract: the message names the field or member and why."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 halves the shard size whenever every id fits in it."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def shard_name(index: int) -> str:
    return f"{SHARD_DIR}/shard-{index:06d}.tar"


def sample_key(index: int) -> str:
    return f"{index:010d}"


# ------------------------------------------------------------------------------- safe decoders

_SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def shown(name: str) -> str:
    """A name read from a shard, fit for an error message: tar names come from the file, so anything
    but a short plain name is not echoed (a garbage 'tar' may be a secret file's bytes)."""
    return name if _SAFE_NAME.fullmatch(name) else "<unprintable name>"


# what np.save writes for a C-ordered 1-D array: parsed by a regex, numpy's own header reader otherwise
_NPY_MAGIC = b"\x93NUMPY"
_NPY_FAST = re.compile(rb"\{'descr': '([<|][biu]\d)', 'fortran_order': False, 'shape': \((\d{1,19}),\), \}\s*")
NPY_DTYPES = {d: np.dtype(d) for d in ("|b1", "|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8")}
MEMBER_DTYPES: dict[str, frozenset[str]] = {
    "input_ids.npy": frozenset({"<u2", "<u4"}),
    "doc_lens.npy": frozenset({"<i4", "<i8"}),
    "loss_mask.npy": frozenset({"|u1", "|b1"}),
}


def _npy_header_slow(header: bytes, major: int, what: str) -> tuple[str, int]:
    """Any other valid header, through numpy's reader (literal_eval of at most MAX_NPY_HEADER bytes)."""
    size = len(header).to_bytes(2 if major == 1 else 4, "little")
    reader = npy_format.read_array_header_1_0 if major == 1 else npy_format.read_array_header_2_0
    try:
        shape, _fortran, dtype = reader(io.BytesIO(size + header), max_header_size=MAX_NPY_HEADER)
    except Exception:  # noqa: BLE001 - numpy raises many types on a hostile header (its text is not echoed)
        raise ShardFormatError(f"{what}: unreadable .npy header") from None
    if not isinstance(shape, tuple) or len(shape) != 1:
        raise ShardFormatError(f"{what}: .npy array is not 1-D")
    return dtype.str, shape[0]


def npy_array(data: bytes | memoryview, what: str = ".npy member",
              dtypes: Iterable[str] = NPY_DTYPES) -> np.ndarray:
    """A zero-copy 1-D view of an ``.npy`` payload, after checking its header: dtype in ``dtypes``,
    and a shape that the payload actually holds (so nothing is allocated from a declared shape)."""
    buf = memoryview(data).cast("B")
    if len(buf) < 10 or bytes(buf[:6]) != _NPY_MAGIC:
        raise ShardFormatError(f"{what}: not an .npy array")
    major = buf[6]
    if major == 1:
        hlen, start = int.from_bytes(buf[8:10], "little"), 10
    elif major in (2, 3) and len(buf) >= 12:
        hlen, start = int.from_bytes(buf[8:12], "little"), 12
    else:
        raise ShardFormatError(f"{what}: unsupported .npy version {major}")
    if hlen > MAX_NPY_HEADER or start + hlen > len(buf):
        raise ShardFormatError(f"{what}: .npy header of {hlen} bytes in a {len(buf)}-byte member")
    header = bytes(buf[start:start + hlen])
    m = _NPY_FAST.fullmatch(header)
    descr, count = (m.group(1).decode(), int(m.group(2))) if m else _npy_header_slow(header, major, what)
    if descr not in dtypes or descr not in NPY_DTYPES:
        raise ShardFormatError(f"{what}: dtype {descr} not allowed (allowed: {', '.join(sorted(dtypes))})")
    dtype = NPY_DTYPES[descr]
    offset = start + hlen
    if type(count) is not int or count < 0 or len(buf) - offset != count * dtype.itemsize:
        raise ShardFormatError(f"{what}: .npy header declares {count} x {dtype} but {len(buf) - offset} "
                               "bytes follow")
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset)


#: .npy headers by (dtype, shape): np.save's header costs far more than the copy of a sample's ids
_NPY_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}


def npy_bytes(array: np.ndarray) -> bytes:
    """``np.save``'s bytes for ``array``; the header of a numeric array is reused for the same dtype and shape."""
    array = np.ascontiguousarray(array)
    if array.dtype.kind not in "biuf":
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        return buf.getvalue()
    key = (array.dtype.str, array.shape)
    header = _NPY_HEADERS.get(key)
    if header is None:
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        data = buf.getvalue()
        if len(_NPY_HEADERS) >= 4096:
            _NPY_HEADERS.clear()
        _NPY_HEADERS[key] = data[:len(data) - array.nbytes]
        return data
    return header + array.tobytes()


def npy_load(data: bytes) -> np.ndarray:
    """A checked 1-D integer array (see :func:`npy_array`); never unpickles, never trusts the shape."""
    return npy_array(data)


def _too_deep(value: Any, limit: int) -> bool:
    """Iterative, so a deep value cannot exhaust the stack here either."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        items = v.values() if isinstance(v, dict) else v
        stack.extend((x, depth + 1) for x in items if isinstance(x, dict | list))
    return False


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ShardFormatError(f"key {shown(key)} appears twice")
            seen.add(key)
    return out


def json_value(data: bytes | memoryview | str, what: str = "", strict_keys: bool = False) -> Any:
    """``json.loads`` with its failures as ShardFormatError (prefixed with ``what``), the nesting bounded
    by MAX_JSON_DEPTH and, with ``strict_keys``, a key given twice in one object refused."""
    raw = bytes(data) if isinstance(data, memoryview) else data
    at = f"{what}: " if what else ""
    try:
        value = json.loads(raw, object_pairs_hook=_no_duplicate_keys if strict_keys else None)
    except ShardFormatError as exc:
        raise ShardFormatError(f"{at}{exc}") from None
    except RecursionError:
        raise ShardFormatError(f"{at}JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except UnicodeDecodeError as exc:
        raise ShardFormatError(f"{at}not UTF-8 text (at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ShardFormatError(f"{at}not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ShardFormatError(f"{at}not valid JSON ({exc})") from None
    counter = raw.count(b"[") + raw.count(b"{") if isinstance(raw, bytes) else raw.count("[") + raw.count("{")
    if counter > MAX_JSON_DEPTH and isinstance(value, dict | list) and _too_deep(value, MAX_JSON_DEPTH):
        raise ShardFormatError(f"{at}JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


# ---------------------------------------------------------------------------------------- samples


def encode_sample(
    index: int,
    input_ids: np.ndarray,
    doc_lens: np.ndarray,
    loss_mask: np.ndarray | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, bytes | str]:
    """Build the tar members of one sample; the caller fixes the dtype of ``input_ids``."""
    doc_lens = np.asarray(doc_lens, dtype=np.int32)
    if int(doc_lens.sum()) != len(input_ids):
        raise ValueError(f"doc_lens sum {int(doc_lens.sum())} != {len(input_ids)} tokens")
    sample: dict[str, bytes | str] = {
        "__key__": sample_key(index),
        "input_ids.npy": npy_bytes(input_ids),
        "doc_lens.npy": npy_bytes(doc_lens),
        "meta.json": json.dumps(meta or {}, sort_keys=True, separators=(",", ":")).encode(),
    }
    if loss_mask is not None:
        if len(loss_mask) != len(input_ids):
            raise ValueError("loss_mask and input_ids differ in length")
        sample["loss_mask.npy"] = npy_bytes(np.asarray(loss_mask, dtype=np.uint8))
    return sample


def tar_bytes(samples: list[dict[str, bytes | str]]) -> bytes:
    """One shard's bytes: the samples' members in a tar with fixed metadata (mtime 0, fixed owner and
    mode), so the same samples always give the same bytes. The one tar writer of the pipeline's shard
    writer (:mod:`pipeline.output.shard_set`).

    The bytes are webdataset's ``TarWriter`` (Python's ``tarfile``) output; the usual members (short
    ASCII names, bytes values) are laid out here directly, without ``tarfile``'s TarInfo object and generic
    header encoding per member.
    """
    fast = _tar_bytes_direct(samples)
    return fast if fast is not None else _tar_bytes_wds(samples)


_TAR_BLOCK, _TAR_RECORD = 512, 20 * 512
_TAR_OWNER = b"tokenmill".ljust(32, b"\0")
#: ustar header fields after the size: mtime 0, checksum placeholder, regular file, no link, ustar magic,
#: owner/group names, no device numbers (a regular file), no prefix (what tarfile writes for TarWriter's TarInfo)
_TAR_AFTER_SIZE = (b"00000000000\0" + b" " * 8 + b"0" + b"\0" * 100 + b"ustar\x0000" + _TAR_OWNER + _TAR_OWNER
                   + b"\0" * 16 + b"\0" * 155 + b"\0" * 12)


def _tar_bytes_direct(samples: list[dict[str, bytes | str]]) -> bytes | None:
    """tarfile's ustar layout for TarWriter(user/group "tokenmill", mode 0o444, mtime 0); None when a member
    would need more than a plain ustar header (long or non-ASCII name, huge size) or is not bytes."""
    out: list[bytes] = []
    for sample in samples:
        key = sample.get("__key__")
        if not isinstance(key, str):
            return None
        for k in sorted(sample):
            if k[0] == "_":
                continue
            v = sample[k]
            if not isinstance(v, bytes | bytearray):
                return None
            name = f"{key}.{k}"
            size = len(v)
            if len(name) > 100 or not name.isascii() or size >= 8 ** 11:
                return None
            head = b"%s0000444\x000000000\x000000000\x00%011o\x00%s" % (name.encode().ljust(100, b"\0"), size,
                                                                       _TAR_AFTER_SIZE)
            out.append(head[:148] + b"%06o\0" % sum(head) + head[155:])
            out.append(v)
            if size % _TAR_BLOCK:
                out.append(b"\0" * (_TAR_BLOCK - size % _TAR_BLOCK))
    data = b"".join(out)
    end = len(data) + 2 * _TAR_BLOCK
    return data + b"\0" * (2 * _TAR_BLOCK + (-end) % _TAR_RECORD)


def _tar_bytes_wds(samples: list[dict[str, bytes | str]]) -> bytes:
    """The reference writer (and the one for members :func:`_tar_bytes_direct` leaves to it)."""
    import webdataset as wds  # lazy: imports torch when it is installed (1 s), only for the reference writer

    buf = io.BytesIO()
    writer = wds.TarWriter(buf, user="tokenmill", group="tokenmill", mode=0o444, encoder=False, mtime=0)
    for sample in samples:
        writer.write(sample)
    writer.close()
    return buf.getvalue()


@dataclass
class Sample:
    key: str
    input_ids: np.ndarray
    doc_lens: np.ndarray
    loss_mask: np.ndarray | None
    meta: dict[str, Any]


def decode_sample(key: str, members: dict[str, bytes | memoryview]) -> Sample:
    """Decode the members of one sample (extension -> bytes); refuses anything but .npy/.json and any
    sample whose arrays disagree (doc_lens must be non-negative and sum to the number of tokens)."""
    name = f"sample {shown(key)}"
    unknown = set(members) - set(ALLOWED_EXTENSIONS)
    if unknown:
        raise ShardFormatError(f"{name}: refusing to decode members {sorted(shown(u) for u in unknown)}")
    for required in ("input_ids.npy", "doc_lens.npy"):
        if required not in members:
            raise ShardFormatError(f"{name}: no {required} member")
    ids = npy_array(members["input_ids.npy"], f"{name}: input_ids.npy", MEMBER_DTYPES["input_ids.npy"])
    lens = npy_array(members["doc_lens.npy"], f"{name}: doc_lens.npy", MEMBER_DTYPES["doc_lens.npy"])
    n = len(ids)
    if len(lens) and (int(lens.min()) < 0 or int(lens.max()) > n or int(lens.sum()) != n):
        raise ShardFormatError(f"{name}: doc_lens must be >= 0 and sum to the {n} tokens")
    if not len(lens) and n:
        raise ShardFormatError(f"{name}: doc_lens is empty for {n} tokens")
    mask = None
    if "loss_mask.npy" in members:
        mask = npy_array(members["loss_mask.npy"], f"{name}: loss_mask.npy", MEMBER_DTYPES["loss_mask.npy"])
        if len(mask) != n:
            raise ShardFormatError(f"{name}: loss_mask has {len(mask)} entries for {n} tokens")
    meta: Any = {}
    if "meta.json" in members:
        meta = json_value(members["meta.json"], f"{name}: meta.json")
        if not isinstance(meta, dict):
            raise ShardFormatError(f"{name}: meta.json is not a JSON object")
    return Sample(key=key, input_ids=ids, doc_lens=lens, loss_mask=mask, meta=meta)


def group_samples(members: Iterable[tuple[str, bytes | memoryview]]) -> Iterator[Sample]:
    """Tar members (name, payload) in order -> samples: ``KEY.EXT`` members with the same key,
    adjacent. A key that comes back later or a member given twice is refused (it would repeat data)."""
    current: str | None = None
    group: dict[str, bytes | memoryview] = {}
    seen: set[str] = set()
    for name, payload in members:
        key, _, ext = name.partition(".")
        if key != current:
            if current is not None:
                yield decode_sample(current, group)
                group = {}
            if key in seen:
                raise ShardFormatError(f"sample {shown(key)}: its members are not adjacent (key repeated)")
            seen.add(key)
            current = key
        if ext in group:
            raise ShardFormatError(f"sample {shown(key)}: member {shown(ext)} appears twice")
        group[ext] = payload
    if current is not None:
        yield decode_sample(current, group)


def iter_tar_samples(fileobj: BinaryIO, max_member: int | None = None) -> Iterator[Sample]:
    """Yield decoded samples from an (uncompressed) tar stream: the reference decoder.

    Every failure is a ShardFormatError. ``max_member`` bounds a member's size (default: what a
    seekable ``fileobj`` holds) so that no header can make it allocate more than the shard itself."""
    if max_member is None and isinstance(fileobj, io.BytesIO):
        max_member = fileobj.getbuffer().nbytes

    def members(tar: tarfile.TarFile) -> Iterator[tuple[str, bytes]]:
        for info in tar:
            if not info.isfile():
                continue
            if info.issparse() or (max_member is not None and info.size > max_member):
                raise ShardFormatError(f"member {shown(info.name)}: {info.size} bytes in a shard of {max_member}")
            f = tar.extractfile(info)
            if f is None:
                continue
            yield info.name, f.read()

    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as tar:
            yield from group_samples(members(tar))
    except ShardFormatError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, OverflowError, KeyError, IndexError) as exc:
        # tarfile's messages hold no payload bytes, but name only the kind of failure
        raise ShardFormatError(f"not a readable tar archive ({type(exc).__name__})") from None


# --------------------------------------------------------------------------------------- manifest

_HEX64 = re.compile(r"[0-9a-f]{64}")
_PRINTABLE = re.compile(r"[ -~]{0,256}")
_PATH_PART = re.compile(r"[A-Za-z0-9_.-]+")


def check_shard_name(name: str) -> str:
    """A shard name is a relative path inside ``shards/``: plain parts only (no absolute path, no
    ``..`` or ``.``, no backslash, no empty part), so it can only ever name a file of the shard set,
    locally and as a URL path."""
    parts = name.split("/")
    if len(name) > 255 or len(parts) < 2 or parts[0] != SHARD_DIR:
        return f"must be a relative path inside {SHARD_DIR}/"
    for part in parts[1:]:
        if part in ("", ".", "..") or not _PATH_PART.fullmatch(part):
            return f"part {part!r} is not allowed (letters, digits, '_', '.', '-'; no '..', no empty parts)"
    return ""


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _int(value: Any, where: str, lo: int, hi: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if type(value) is not int:  # bool is an int subclass, "16" is not an int: both refused
        raise ShardFormatError(f"{where}: must be an integer, got {_kind(value)}")
    if not lo <= value <= hi:
        raise ShardFormatError(f"{where}: {value} is outside [{lo}, {hi}]")


def _typed(value: Any, where: str, kind: type) -> None:
    if type(value) is not kind:
        raise ShardFormatError(f"{where}: must be {kind.__name__}, got {_kind(value)}")


@dataclass
class ShardInfo:
    name: str
    samples: int
    tokens: int
    sha256: str
    bytes: int
    partial: bool = False


_SHARD_FIELDS = {f.name for f in fields(ShardInfo)}
_VALIDATION_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


@dataclass
class Manifest:
    """What a shard set is: enough for a trainer to plan epochs and verify every byte."""

    spec_hash: str
    tokenizer_hash: str
    seq_len: int
    dtype: str
    vocab_size: int
    samples_per_shard: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int
    has_loss_mask: bool
    shards: list[ShardInfo] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    #: ``{"path": "validation", "documents", "samples", "tokens"}``: the output's validation split, a shard set
    #: of its own in that folder (``output.validation``); absent from the file when None
    validation: dict[str, Any] | None = None

    @property
    def total_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def validate(self) -> Manifest:
        """The one schema of a shard set (writer, loader and inspect): raises ShardFormatError naming
        the first field that breaks it. Integers are ints (not bool, not str) within bounds; every
        shard but the last holds exactly ``samples_per_shard`` samples and the last is ``partial``
        exactly when it holds fewer; names and checksums are unique; each shard's ``bytes`` can hold
        its tokens and is what every read of that shard is bounded by."""
        self._validate_fields()
        _typed(self.shards, "shards", list)
        names: set[str] = set()
        digests: set[str] = set()
        for i, s in enumerate(self.shards):
            self._validate_shard(i, s, names, digests)
        return self

    def _validate_fields(self) -> None:
        """Every field but ``shards``, in the order :meth:`validate` reports them."""
        _int(self.format_version, "format_version", FORMAT_VERSION, FORMAT_VERSION)
        for key in ("spec_hash", "tokenizer_hash"):
            value = getattr(self, key)
            _typed(value, key, str)
            if not _PRINTABLE.fullmatch(value):
                raise ShardFormatError(f"{key}: must be at most 256 printable ASCII characters")
        _int(self.seq_len, "seq_len", 1, MAX_SEQ_LEN)
        _int(self.vocab_size, "vocab_size", 1, MAX_VOCAB)
        _typed(self.dtype, "dtype", str)
        if self.dtype != token_dtype(self.vocab_size).name:
            shown_dtype = self.dtype if self.dtype in TOKEN_DTYPES else "<other>"
            raise ShardFormatError(f"dtype: {shown_dtype} but a vocabulary of {self.vocab_size} is stored as "
                                   f"{token_dtype(self.vocab_size).name}")
        _int(self.samples_per_shard, "samples_per_shard", 1, MAX_SAMPLES_PER_SHARD)
        for key in ("bos_id", "eos_id", "pad_id"):
            _int(getattr(self, key), key, 0, self.vocab_size - 1, optional=key != "pad_id")
        _typed(self.has_loss_mask, "has_loss_mask", bool)
        _typed(self.extra, "extra", dict)
        if _too_deep(self.extra, MAX_JSON_DEPTH):
            raise ShardFormatError(f"extra: nested deeper than {MAX_JSON_DEPTH} levels")
        if self.validation is not None:
            self._validate_validation(self.validation)

    @staticmethod
    def _validate_validation(entry: object) -> None:
        """``validation``: a folder name beside the manifest and three counts."""
        _typed(entry, "validation", dict)
        assert isinstance(entry, dict)
        _keys(entry, {"path", "documents", "samples", "tokens"}, set(), "validation.")
        _typed(entry["path"], "validation.path", str)
        if not _VALIDATION_PATH.fullmatch(entry["path"]):
            raise ShardFormatError("validation.path: must be a folder name beside the manifest")
        for key in ("documents", "samples", "tokens"):
            _int(entry[key], f"validation.{key}", 0, 1 << 62)

    def _validate_shard(self, i: int, s: object, names: set[str], digests: set[str]) -> None:
        """Shard entry ``i``; ``names`` and ``digests`` (those of the entries before it) get its own."""
        where = f"shards.{i}"
        if not isinstance(s, ShardInfo):
            raise ShardFormatError(f"{where}: must be a shard entry, got {_kind(s)}")
        _typed(s.name, f"{where}.name", str)
        problem = check_shard_name(s.name)
        if problem:
            raise ShardFormatError(f"{where}.name: {problem}")
        if s.name in names:
            raise ShardFormatError(f"{where}.name: {s.name} is listed twice")
        names.add(s.name)
        where = f"shards.{i} ({s.name})"
        _int(s.samples, f"{where}.samples", 1, self.samples_per_shard)
        _int(s.tokens, f"{where}.tokens", s.samples, s.samples * self.seq_len)
        _typed(s.sha256, f"{where}.sha256", str)
        if not _HEX64.fullmatch(s.sha256):
            raise ShardFormatError(f"{where}.sha256: must be 64 lowercase hex digits")
        if s.sha256 in digests:
            raise ShardFormatError(f"{where}.sha256: same checksum as another shard (repeated data)")
        digests.add(s.sha256)
        _int(s.bytes, f"{where}.bytes", 1, MAX_SHARD_BYTES)
        if s.bytes <= s.tokens * token_dtype(self.vocab_size).itemsize:
            raise ShardFormatError(f"{where}.bytes: {s.bytes} cannot hold {s.tokens} {self.dtype} tokens")
        _typed(s.partial, f"{where}.partial", bool)
        last = i == len(self.shards) - 1
        if not last and (s.partial or s.samples != self.samples_per_shard):
            raise ShardFormatError(f"{where}: only the last shard may be partial, this one holds {s.samples} "
                                   f"of {self.samples_per_shard} samples")
        if last and s.partial != (s.samples < self.samples_per_shard):
            raise ShardFormatError(f"{where}.partial: {s.partial} but it holds {s.samples} of "
                                   f"{self.samples_per_shard} samples")

    def to_json(self) -> str:
        """Validated first: the writer can never publish a manifest the loader would refuse."""
        return counted_json(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Parse and validate; every failure is a ShardFormatError 'malformed manifest: FIELD: why'."""
        return parse_counted(cls._parse, text, "manifest")

    @classmethod
    def _parse(cls, text: str | bytes) -> Manifest:
        data = json_object(text, MAX_MANIFEST_BYTES, "not a manifest: not a JSON object")
        if data.get("format_version") != FORMAT_VERSION:
            version = data.get("format_version")
            raise ShardFormatError(f"format_version: unsupported shard format version "
                                   f"{version if type(version) is int else _kind(version)}")
        totals = {k: data.pop(k, None) for k in TOTALS}
        _keys(data, {f.name for f in fields(cls)}, {"format_version", "extra", "validation"}, "")
        data["shards"] = entries(data["shards"], "shards", ShardInfo, _SHARD_FIELDS, {"partial"})
        manifest = cls(**data).validate()
        check_totals(manifest, totals, "shards")
        return manifest

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Manifest:
        """The manifest of a shard-set folder, read with a bound (it may be a device or a FIFO)."""
        return cls.from_json(read_regular(Path(directory) / MANIFEST, MAX_MANIFEST_BYTES))


def _keys(data: dict[str, Any], known: set[str], optional: set[str], prefix: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ShardFormatError(f"{prefix}{shown(unknown[0])}: unknown field")
    missing = sorted(known - optional - set(data))
    if missing:
        raise ShardFormatError(f"{prefix}{missing[0]}: missing")


# ------------------------------------------------------------------------------------------ counted files
# A manifest and a mixture file (pipeline.mixture_format) are written and read alike: a validated dataclass as
# sorted JSON with the totals its parts (shards, sources) add up to, read back bounded, strict, and checked.

#: the fields a counted file states beside its own
TOTALS = ("total_samples", "total_tokens")
#: fields a counted file has only when set (a manifest's ``validation``)
OMITTED_WHEN_NONE = ("validation",)
_R = TypeVar("_R")
_E = TypeVar("_E")


def counted_json(record: Any) -> str:
    """``record`` (a dataclass with ``validate()`` and the :data:`TOTALS` properties), validated, as its file; an
    optional field added later (:data:`OMITTED_WHEN_NONE`) is left out when None, so earlier files keep their bytes."""
    record.validate()
    data = asdict(record)
    for key in OMITTED_WHEN_NONE:
        if key in data and data[key] is None:
            del data[key]
    for key in TOTALS:
        data[key] = getattr(record, key)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def parse_counted(parse: Callable[[str | bytes], _R], text: str | bytes, what: str,
                  error: type[ShardFormatError] = ShardFormatError) -> _R:
    """``parse(text)``; any failure raised as ``error`` 'malformed WHAT: FIELD: why'."""
    try:
        return parse(text)
    except ShardFormatError as exc:
        raise error(f"malformed {what}: {exc}") from None


def json_object(text: str | bytes, limit: int, not_object: str) -> dict[str, Any]:
    """The JSON object ``text`` holds (at most ``limit`` bytes, no key twice); ``not_object`` if it is none."""
    if len(text) > limit:
        raise ShardFormatError(f"larger than {limit} bytes")
    data = json_value(text, strict_keys=True)
    if not isinstance(data, dict):
        raise ShardFormatError(not_object)
    return data


def entries(items: Any, field: str, entry: Callable[..., _E], known: set[str], optional: set[str]) -> list[_E]:
    """The list ``field`` (shards, sources) as ``entry`` records, each an object of exactly the ``known`` keys
    (those of ``optional`` may be left out)."""
    _typed(items, field, list)
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ShardFormatError(f"{field}.{i}: must be an object, got {_kind(item)}")
        _keys(item, known, optional, f"{field}.{i}.")
        out.append(entry(**item))
    return out


def check_totals(record: Any, totals: dict[str, Any], parts: str) -> None:
    """The :data:`TOTALS` a file stated are what its ``parts`` add up to."""
    for key, value in totals.items():
        _int(value, key, 0, 1 << 62)
        if value != getattr(record, key):
            raise ShardFormatError(f"{key}: {value} but the {parts} add up to {getattr(record, key)}")


# ------------------------------------------------------------------------------------------ files


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _open_regular(path: str | os.PathLike) -> BinaryIO:
    """Open for reading, refusing anything but a regular file (``/dev/zero`` never ends, and opening
    a FIFO would block: O_NONBLOCK makes that open return so it can be refused)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ShardFormatError("not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them: ShardFormatError if it holds more."""
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ShardFormatError(f"{size} bytes, more than the {limit} expected")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ShardFormatError(f"more than the {limit} bytes expected")
    return data


def hash_regular(path: str | os.PathLike, limit: int, chunk: int = 1 << 20) -> tuple[int, str]:
    """(size, sha256) of a regular file, reading at most ``limit + 1`` bytes."""
    h = hashlib.sha256()
    total = 0
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            return size, ""
        while total <= limit and (block := f.read(min(chunk, limit + 1 - total))):
            h.update(block)
            total += len(block)
    return total, h.hexdigest()

