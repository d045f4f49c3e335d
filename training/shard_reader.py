"""Decode a whole shard held in memory, fast: the loader's hot path.

``pipeline.shard_format.iter_tar_samples`` (tarfile + ``np.load``) is the reference decoder; it
spends most of its time parsing tar headers and ``.npy`` header dicts (``ast.literal_eval``). The
loader already holds each verified shard as bytes, so this reads the ustar headers and the simple
``.npy`` headers the shard writer produces directly, with zero-copy ``np.frombuffer`` views, and
hands anything unusual (pax/GNU long-name records, other array layouts) to the reference decoder.
Same rules: only ``.npy`` (never pickled object arrays) and ``.json`` members are decoded.
"""

from __future__ import annotations

import io
import json
import re

import numpy as np

from pipeline.shard_format import ALLOWED_EXTENSIONS, Sample, iter_tar_samples

_BLOCK = 512
_NPY_MAGIC = b"\x93NUMPY"
# what np.save writes for a C-ordered 1-D array of a plain numeric dtype
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|=]?[biuf]\d{1,2})', 'fortran_order': False, 'shape': \((\d+),\), \}\s*")


class _Unusual(Exception):
    """A member the fast path does not handle: decode the whole shard the reference way."""


def _npy(buf: memoryview) -> np.ndarray:
    if bytes(buf[:6]) != _NPY_MAGIC:
        raise ValueError("not a .npy member")
    major = buf[6]
    if major == 1:
        hlen, start = int.from_bytes(buf[8:10], "little"), 10
    elif major in (2, 3):
        hlen, start = int.from_bytes(buf[8:12], "little"), 12
    else:
        raise _Unusual
    m = _NPY_HEADER.fullmatch(bytes(buf[start:start + hlen]))
    if m is None:
        raise _Unusual
    dtype = np.dtype(m.group(1).decode())
    count = int(m.group(2))
    offset = start + hlen
    if len(buf) - offset != count * dtype.itemsize:
        raise ValueError(f".npy member holds {len(buf) - offset} bytes for {count} x {dtype}")
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset)


def _members(data: bytes):
    """(name, payload view) for each regular file of an uncompressed ustar archive."""
    view = memoryview(data)
    off = 0
    end = len(data)
    while off + _BLOCK <= end:
        header = view[off:off + _BLOCK]
        if not any(header):
            return  # end-of-archive blocks
        raw_size = bytes(header[124:136])
        if raw_size[0] & 0x80:
            raise _Unusual  # base-256 size: a member over 8 GiB
        size = int(raw_size.strip(b"\0 ") or b"0", 8)
        kind = bytes(header[156:157])
        body = off + _BLOCK
        if body + size > end:
            raise ValueError("truncated tar member")
        if kind in (b"x", b"g", b"L", b"K"):
            raise _Unusual  # pax or GNU long-name records
        if kind in (b"0", b"\0"):
            name = bytes(header[0:100]).split(b"\0", 1)[0].decode()
            if bytes(header[257:262]) == b"ustar":
                prefix = bytes(header[345:500]).split(b"\0", 1)[0].decode()
                if prefix:
                    name = f"{prefix}/{name}"
            yield name, view[body:body + size]
        off = body + (size + _BLOCK - 1) // _BLOCK * _BLOCK


def _fast(data: bytes) -> list[Sample]:
    samples: list[Sample] = []
    current: str | None = None
    members: dict[str, memoryview] = {}

    def flush() -> None:
        unknown = set(members) - set(ALLOWED_EXTENSIONS)
        if unknown:
            raise ValueError(f"sample {current}: refusing to decode members {sorted(unknown)}")
        mask = members.get("loss_mask.npy")
        meta = members.get("meta.json")
        samples.append(Sample(
            key=current,
            input_ids=_npy(members["input_ids.npy"]),
            doc_lens=_npy(members["doc_lens.npy"]),
            loss_mask=None if mask is None else _npy(mask),
            meta=json.loads(bytes(meta)) if meta is not None else {},
        ))

    for name, payload in _members(data):
        key, _, ext = name.partition(".")
        if current is not None and key != current:
            flush()
            members = {}
        current = key
        members[ext] = payload
    if current is not None:
        flush()
    return samples


def read_shard_samples(data: bytes) -> list[Sample]:
    """All samples of one shard's bytes, in order."""
    try:
        return _fast(data)
    except _Unusual:
        return list(iter_tar_samples(io.BytesIO(data)))

