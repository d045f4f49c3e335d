"""Open a file as a binary stream, decompressing gzip or zstandard by their magic bytes.

Truncated or corrupt compressed input must surface as an error, never as a silently short stream:
``gzip`` raises on its own; zstandard's ``stream_reader`` returns short data for a cut file, so
:class:`ZstdFrames` checks that every frame ended. Every such error reaches the reader as
:class:`TruncatedInput`, which is neither an EOFError nor an OSError, so that no library between the
stream and the reader (warcio swallows EOFError) mistakes it for a clean end of file.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import IO, TYPE_CHECKING, BinaryIO, Protocol

import zstandard

from pipeline import storage
from pipeline.error_line import error_line

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
READ_SIZE = 1 << 20
#: what a cut or damaged compressed stream raises (gzip.BadGzipFile is an OSError: listed apart)
DECOMPRESSION_ERRORS: tuple[type[BaseException], ...] = (
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    zstandard.ZstdError,
)


class TruncatedInput(Exception):
    """A compressed file that ends early or is corrupt."""


class _Chunked(Protocol):
    """A decompressing stream that reads one step at a time (``GzipFile``, :class:`ZstdFrames`)."""

    def read1(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class _Guarded(io.RawIOBase):
    """Turns the decompressor's errors into :class:`TruncatedInput`, raised one read late.

    ``io.BufferedReader`` discards what it gathered in a read when the raw stream raises, so a
    failure first reads as end of file (the buffered reader hands out everything decoded before
    it), and the next read raises. Readers call :func:`check_complete` at the end of the data.
    """

    def __init__(self, inner: _Chunked):
        self._inner = inner
        self._error: TruncatedInput | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        if self._error is not None:
            raise self._error
        view = memoryview(b)
        try:
            # read1: one decompression step at a time, so a failure loses nothing decoded before it
            data = self._inner.read1(len(view))
        except DECOMPRESSION_ERRORS as exc:
            self._error = TruncatedInput(error_line(exc))
            return 0
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._inner.close()
        super().close()


def check_complete(fh: BinaryIO) -> None:
    """At what looks like the end of the data: raise TruncatedInput if it ended because of an error."""
    fh.read(1)


class ZstdFrames(io.BufferedIOBase):
    """A stream over one or more zstandard frames that raises EOFError if the input ends mid-frame."""

    def __init__(self, fh: IO[bytes], chunk_size: int = 1 << 16):
        self._fh = fh
        self._chunk_size = chunk_size
        self._dctx = zstandard.ZstdDecompressor()
        self._obj: zstandard.ZstdDecompressionObj | None = None
        self._buf = b""
        self._pos = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b)
        data = self.read1(len(view))
        view[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        size = -1 if size is None else size
        parts, got = [], 0
        while size < 0 or got < size:
            part = self.read1(-1 if size < 0 else size - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def read1(self, size: int = -1) -> bytes:
        while self._pos >= len(self._buf):
            if self._done:
                return b""
            self._fill()
        end = len(self._buf) if size < 0 else min(len(self._buf), self._pos + size)
        data = self._buf[self._pos : end]
        self._pos = end
        return data

    def _fill(self) -> None:
        data = self._fh.read(self._chunk_size)
        if not data:
            if self._obj is not None and not self._obj.eof:
                raise EOFError("zstandard stream ended before the end of a frame")
            self._done = True
            return
        out = []
        while data:
            if self._obj is None or self._obj.eof:
                self._obj = self._dctx.decompressobj()
            out.append(self._obj.decompress(data))
            data = self._obj.unused_data if self._obj.eof else b""
        self._buf = b"".join(out)
        self._pos = 0

    def close(self) -> None:
        self._fh.close()
        super().close()


def compression_of(path: str) -> str | None:
    """``"gzip"``, ``"zstd"`` or None, from the first bytes (the suffix may lie)."""
    with storage.open_input(path) as fh:
        magic = fh.read(4)
    if magic.startswith(GZIP_MAGIC):
        return "gzip"
    if magic == ZSTD_MAGIC:
        return "zstd"
    return None


def open_binary(path: str) -> io.BufferedReader:
    """A buffered binary reader of the file's decompressed bytes; raises TruncatedInput when cut."""
    kind = compression_of(path)
    if storage.is_remote(path):  # an object-store file: pyarrow's reader, the same decompression on top
        raw = storage.open_input(path)
        if kind == "gzip":
            return io.BufferedReader(_Guarded(gzip.GzipFile(fileobj=raw, mode="rb")), READ_SIZE)
        if kind == "zstd":
            return io.BufferedReader(_Guarded(ZstdFrames(raw)), READ_SIZE)
        # a pyarrow NativeFile (raw-stream methods, readinto included): pyarrow ships no type information
        return io.BufferedReader(raw, READ_SIZE)  # type: ignore[arg-type]
    if kind == "gzip":
        return io.BufferedReader(_Guarded(gzip.GzipFile(path, "rb")), READ_SIZE)
    if kind == "zstd":
        return io.BufferedReader(_Guarded(ZstdFrames(open(path, "rb"))), READ_SIZE)
    return io.BufferedReader(io.FileIO(path, "rb"), READ_SIZE)  # what open(path, "rb", buffering=READ_SIZE) builds
