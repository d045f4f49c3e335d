"""Decode a whole shard held in memory, fast: the loader's hot path.

``pipeline.shard_format.iter_tar_samples`` (tarfile) is the reference decoder; it spends most of its
time parsing tar headers. The loader already holds each verified shard as bytes, so this reads the
ustar headers directly and hands the members to the same checked decoders (``group_samples``:
``.npy`` headers checked before a zero-copy ``np.frombuffer`` view, JSON depth bounded). Anything
unusual (pax/GNU long-name records, base-256 sizes) goes to the reference decoder.
Same rules: only ``.npy`` (never pickled object arrays) and ``.json`` members are decoded, and every
failure is a :class:`~pipeline.shard_format.ShardFormatError` whose message never echoes the bytes.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

from pipeline.shard_format import Sample, ShardFormatError, group_samples, iter_tar_samples

_BLOCK = 512


class _Unusual(Exception):
    """A member the fast path does not handle: decode the whole shard the reference way."""


def _members(data: bytes) -> Iterator[tuple[str, memoryview]]:
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
        try:
            size = int(raw_size.strip(b"\0 ") or b"0", 8)
        except ValueError:  # int()'s message would quote the field's bytes
            raise ShardFormatError(f"bad tar header at byte {off}: size field is not octal") from None
        kind = bytes(header[156:157])
        body = off + _BLOCK
        if size < 0 or body + size > end:
            raise ShardFormatError(f"tar member at byte {off} declares {size} bytes, past the end of the shard")
        if kind in (b"x", b"g", b"L", b"K"):
            raise _Unusual  # pax or GNU long-name records
        if kind in (b"0", b"\0"):
            try:
                name = bytes(header[0:100]).split(b"\0", 1)[0].decode()
                if bytes(header[257:262]) == b"ustar":
                    prefix = bytes(header[345:500]).split(b"\0", 1)[0].decode()
                    if prefix:
                        name = f"{prefix}/{name}"
            except UnicodeDecodeError:
                raise ShardFormatError(f"bad tar header at byte {off}: name is not UTF-8") from None
            yield name, view[body:body + size]
        off = body + (size + _BLOCK - 1) // _BLOCK * _BLOCK


def read_shard_samples(data: bytes) -> list[Sample]:
    """All samples of one shard's bytes, in order; raises only ShardFormatError."""
    try:
        return list(group_samples(_members(data)))
    except _Unusual:
        return list(iter_tar_samples(io.BytesIO(data)))
