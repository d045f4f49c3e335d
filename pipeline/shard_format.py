"""The shard contract shared by the shard writer and the trainer's loader.

One WebDataset sample is one packed sequence: ``input_ids.npy`` (uint16 when the vocabulary fits,
else uint32; unpadded, so its length is the sum of ``doc_lens``), ``doc_lens.npy`` (int32),
optionally ``loss_mask.npy`` (uint8, 0 on prompt tokens) and a small ``meta.json``.
Only ``.npy`` (with ``allow_pickle=False``) and ``.json`` are ever decoded: no pickle anywhere.
This module imports nothing but the standard library and numpy so the trainer can use it alone.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATS = "stats.json"
TOKENIZER = "tokenizer.json"
SHARD_DIR = "shards"
ALLOWED_EXTENSIONS = ("input_ids.npy", "doc_lens.npy", "loss_mask.npy", "meta.json")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 halves the shard size whenever every id fits in it."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def shard_name(index: int) -> str:
    return f"{SHARD_DIR}/shard-{index:06d}.tar"


def sample_key(index: int) -> str:
    return f"{index:010d}"


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def npy_load(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


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


@dataclass
class Sample:
    key: str
    input_ids: np.ndarray
    doc_lens: np.ndarray
    loss_mask: np.ndarray | None
    meta: dict[str, Any]


def decode_sample(key: str, members: dict[str, bytes]) -> Sample:
    """Decode the members of one sample (extension -> bytes); refuses anything but .npy/.json."""
    unknown = set(members) - set(ALLOWED_EXTENSIONS)
    if unknown:
        raise ValueError(f"sample {key}: refusing to decode members {sorted(unknown)}")
    return Sample(
        key=key,
        input_ids=npy_load(members["input_ids.npy"]),
        doc_lens=npy_load(members["doc_lens.npy"]),
        loss_mask=npy_load(members["loss_mask.npy"]) if "loss_mask.npy" in members else None,
        meta=json.loads(members["meta.json"]) if "meta.json" in members else {},
    )


def iter_tar_samples(fileobj) -> Any:
    """Yield decoded samples from an (uncompressed) tar stream, grouping members by key."""
    import tarfile

    current: str | None = None
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for info in tar:
            if not info.isfile():
                continue
            key, _, ext = info.name.partition(".")
            if current is not None and key != current:
                yield decode_sample(current, members)
                members = {}
            current = key
            members[ext] = tar.extractfile(info).read()
    if current is not None:
        yield decode_sample(current, members)


@dataclass
class ShardInfo:
    name: str
    samples: int
    tokens: int
    sha256: str
    bytes: int
    partial: bool = False


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

    @property
    def total_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def to_json(self) -> str:
        data = asdict(self)
        data["total_samples"] = self.total_samples
        data["total_tokens"] = self.total_tokens
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("malformed manifest: not a JSON object")
        data.pop("total_samples", None)
        data.pop("total_tokens", None)
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported shard format version {data.get('format_version')}")
        try:
            data["shards"] = [ShardInfo(**s) for s in data["shards"]]
            return cls(**data)
        except (TypeError, KeyError) as exc:
            raise ValueError(f"malformed manifest: {exc}") from None

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Manifest:
        return cls.from_json((Path(directory) / MANIFEST).read_text())


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temporary name in the same folder, fsync, then rename into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
