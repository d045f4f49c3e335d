"""Read a finished output back: verify checksums, iterate samples, decode documents to text; the same for
the ``documents/`` output.

The shard set may be anyone's copy, so every read is bounded by the manifest's own ``bytes`` for the
shard (a device, a FIFO or an oversized file is reported, never read to the end) and every decoding
failure is a :class:`~pipeline.shard_format.ShardFormatError` naming the shard.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from pipeline.output.documents_meta import DOCUMENTS_INDEX_NAME, LEGACY_INDEX_NAME, MetaRules, meta_value
from pipeline.shard_format import (
    TOKENIZER,
    Manifest,
    Sample,
    ShardFormatError,
    ShardInfo,
    hash_regular,
    iter_tar_samples,
    json_value,
    read_regular,
    sha256_bytes,
    shown,
)

MAX_TOKENIZER_BYTES = 1 << 30  # a 256k-entry BPE tokenizer.json is ~20 MB


@dataclass
class ShardCheck:
    name: str
    ok: bool
    problem: str = ""


def _check(out_dir: Path, shard: ShardInfo) -> ShardCheck:
    try:
        size, digest = hash_regular(out_dir / shard.name, shard.bytes)
    except FileNotFoundError:
        return ShardCheck(shard.name, False, "missing")
    except OSError as exc:
        return ShardCheck(shard.name, False, f"unreadable: {exc.strerror or exc}")
    except ShardFormatError as exc:
        return ShardCheck(shard.name, False, str(exc))
    if size != shard.bytes:
        return ShardCheck(shard.name, False, f"{size} bytes, manifest says {shard.bytes}")
    if digest != shard.sha256:
        return ShardCheck(shard.name, False, f"sha256 {digest[:12]}... != manifest {shard.sha256[:12]}...")
    return ShardCheck(shard.name, True)


def verify_shards(out_dir: str | Path, manifest: Manifest | None = None) -> list[ShardCheck]:
    out_dir = Path(out_dir)
    manifest = manifest or Manifest.load(out_dir)
    return [_check(out_dir, shard) for shard in manifest.shards]


def read_shard(out_dir: Path, shard: ShardInfo) -> list[Sample]:
    """One shard's samples, read with the manifest's size as a bound and checked against its sha256."""
    try:
        data = read_regular(out_dir / shard.name, shard.bytes)
        if len(data) != shard.bytes or sha256_bytes(data) != shard.sha256:
            raise ShardFormatError("does not match its size and sha256 in the manifest")
        samples = list(iter_tar_samples(io.BytesIO(data)))
    except OSError as exc:
        raise ShardFormatError(f"shard {shard.name}: cannot read: {exc.strerror or exc}") from None
    except ShardFormatError as exc:
        raise ShardFormatError(f"shard {shard.name}: {exc}") from None
    if len(samples) != shard.samples:
        raise ShardFormatError(f"shard {shard.name}: {len(samples)} samples but the manifest says {shard.samples}")
    return samples


def iter_samples(out_dir: str | Path, manifest: Manifest | None = None) -> Iterator[Sample]:
    out_dir = Path(out_dir)
    manifest = manifest or Manifest.load(out_dir)
    for shard in manifest.shards:
        yield from read_shard(out_dir, shard)


def split_documents(sample: Sample) -> list[np.ndarray]:
    bounds = np.cumsum(sample.doc_lens)[:-1]
    return np.split(sample.input_ids, bounds)


class Decoder:
    """Token ids back to text, dropping the BOS/EOS the job added."""

    def __init__(self, out_dir: str | Path, manifest: Manifest | None = None):
        out_dir = Path(out_dir)
        self.manifest = manifest or Manifest.load(out_dir)
        try:
            text = read_regular(out_dir / TOKENIZER, MAX_TOKENIZER_BYTES).decode()
            self.tok = Tokenizer.from_str(text)
        except OSError as exc:
            raise ShardFormatError(f"{TOKENIZER}: cannot read: {exc.strerror or exc}") from None
        except ShardFormatError as exc:
            raise ShardFormatError(f"{TOKENIZER}: {exc}") from None
        except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception on a malformed file
            raise ShardFormatError(f"{TOKENIZER}: not a tokenizer file") from None
        self.special = {t for t in (self.manifest.bos_id, self.manifest.eos_id) if t is not None}

    def decode(self, ids: np.ndarray) -> str:
        keep = [int(t) for t in ids if int(t) not in self.special]
        return self.tok.decode(keep, skip_special_tokens=False)


def decode_documents(out_dir: str | Path) -> dict[int, str]:
    """Every document of the shard set, re-assembled across the sequences it was cut into, keyed by
    ``ord``: the whole-corpus round trip that proves nothing was lost or altered."""
    decoder = Decoder(out_dir)
    pieces: dict[int, list[np.ndarray]] = {}
    for sample in iter_samples(out_dir, decoder.manifest):
        ords = sample.meta.get("ords")
        docs = split_documents(sample)
        if not isinstance(ords, list) or len(ords) != len(docs) or any(type(o) is not int for o in ords):
            raise ShardFormatError(f"sample {shown(sample.key)}: meta.json 'ords' is not one integer per document")
        for ord_, ids in zip(ords, docs, strict=True):
            pieces.setdefault(ord_, []).append(ids)
    return {o: decoder.decode(np.concatenate(p)) for o, p in pieces.items()}


# ---- the documents output (output.documents) ---------------------------------------------------------

#: the index of the documents output, and its name in outputs written before it moved out of readers' way
DOCUMENTS_INDEX = DOCUMENTS_INDEX_NAME
LEGACY_DOCUMENTS_INDEX = f"documents/{LEGACY_INDEX_NAME}"
DOCUMENTS_INDEXES = (DOCUMENTS_INDEX, LEGACY_DOCUMENTS_INDEX)
_DOC_PART = re.compile(r"^documents/part-[0-9]{6}\.(parquet|jsonl)$")


@dataclass
class DocumentsIndex:
    format: str
    rows: int
    parts: list[dict]
    #: ``struct``, ``json`` (Parquet meta as JSON text: the fallback, and every output before structs) or ``object``
    meta: str = "json"


def documents_index_name(out_dir: str | Path) -> str | None:
    """The output's documents index (``documents.json``, else an older output's ``documents/index.json``)."""
    return next((n for n in DOCUMENTS_INDEXES if (Path(out_dir) / n).is_file()), None)


def load_documents_index(out_dir: str | Path, name: str | None = None) -> DocumentsIndex:
    """The documents index (``name``, else :func:`documents_index_name`'s), checked: part names inside
    ``documents/``, counts and sizes integers."""
    name = name or documents_index_name(out_dir) or DOCUMENTS_INDEX
    data = json_value(read_regular(Path(out_dir) / name, 64 << 20), name)
    if not isinstance(data, dict) or data.get("documents") not in ("parquet", "jsonl"):
        raise ShardFormatError(f"{name}: not a documents index")
    parts = data.get("parts")
    if not isinstance(parts, list):
        raise ShardFormatError(f"{name}: parts must be a list")
    for i, part in enumerate(parts):
        ok = (isinstance(part, dict) and isinstance(part.get("name"), str) and _DOC_PART.match(part["name"])
              and all(type(part.get(k)) is int and part[k] >= 0 for k in ("rows", "bytes"))
              and isinstance(part.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", part["sha256"]))
        if not ok:
            raise ShardFormatError(f"{name}: parts.{i} is malformed")
    if sum(p["rows"] for p in parts) != data.get("rows"):
        raise ShardFormatError(f"{name}: rows does not match its parts")
    default = "object" if data["documents"] == "jsonl" else "json"
    return DocumentsIndex(data["documents"], data["rows"], parts, str(data.get("meta", default)))


def verify_documents(out_dir: str | Path, index: DocumentsIndex) -> list[ShardCheck]:
    checks = []
    for part in index.parts:
        try:
            size, digest = hash_regular(Path(out_dir) / part["name"], part["bytes"])
            problem = None if (size, digest) == (part["bytes"], part["sha256"]) else "size or sha256 differs"
        except (OSError, ShardFormatError) as exc:
            problem = str(exc)
        checks.append(ShardCheck(part["name"], problem is None, problem or ""))
    return checks


def iter_documents(out_dir: str | Path, index: DocumentsIndex) -> Iterator[dict]:
    """The documents in ``ord`` order, as dicts (``meta`` parsed, or a struct decoded back to the same dict)."""
    for part in index.parts:
        path = Path(out_dir) / part["name"]
        if index.format == "jsonl":
            with open(path, encoding="utf-8") as f:
                for line in f:
                    yield json_value(line, part["name"])
        else:
            f = pq.ParquetFile(path)
            rules = MetaRules.from_metadata(f.schema_arrow.metadata)
            for batch in f.iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    row["meta"] = (json_value(row["meta"] or "{}", part["name"]) if isinstance(row["meta"], str)
                                   else meta_value(row["meta"], rules))
                    yield row
