"""One filesystem layer for every file a job reads or writes: local paths and object-store URIs alike.

A location is a ``str``: a local path (``out/shards``), or a URI with a scheme (``s3://bucket/corpus``).
Local paths keep the exact semantics the rest of tokenmill relies on (atomic rename after fsync, so a
resumed shard keeps its inode and mtime). Everything else goes through :mod:`pyarrow.fs`, which ships
with pyarrow (a dependency already) and speaks S3, GCS, HDFS and Azure natively; a scheme pyarrow does
not know goes through fsspec when it is installed (``PyFileSystem(FSSpecHandler(...))``).

**The one atomic write.** Every file tokenmill writes goes through :func:`open_output` (streams) or
:func:`write_bytes` (a whole buffer, on top of it): readers see the old content or the new, never a part.
Locally the data goes to :func:`temp_name` in the same folder, is fsynced and renamed into place, and the
folder is fsynced; on any failure the temporary file is removed and the target is left as it was (an
``OSError`` then names the target, not the temporary file). A process killed mid-write can still leave a
temporary file: :func:`is_temp_name` is the one rule that recognises it, for whatever cleans up.

Object stores have no rename and no append. So here a remote write is one whole-object PUT (a reader
sees the old object or the new one, never a part: what an atomic rename gives locally; a failed upload is
aborted, so nothing appears), there are no folders to create, and "delete a folder" deletes every object
below a prefix.

S3 credentials come from the usual places (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, instance roles), resolved by the AWS SDK inside pyarrow. The
endpoint of an S3-compatible server (MinIO, moto, Ceph) is ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` (``http://127.0.0.1:9000``), the region ``AWS_REGION``/``AWS_DEFAULT_REGION``.
Ray workers read the same variables, so a cluster's nodes must have them (deploy/ sets them).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import posixpath
import re
import shutil
import threading
from collections.abc import Iterator
from typing import IO, Any

import pyarrow.fs as pafs

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_FS_CACHE: dict[tuple[str, ...], pafs.FileSystem] = {}
_FS_LOCK = threading.Lock()
GLOB_CHARS = "*?["
CHUNK = 1 << 20
#: what :func:`temp_name` makes: ``.<name>.<pid>.<hex>.tmp``
_TEMP_NAME = re.compile(r"\..+\.[0-9]+\.[0-9a-f]+\.tmp")


class StorageError(OSError):
    """A remote location that cannot be used (unknown scheme, no bucket); one line naming it."""


def scheme(path: str) -> str:
    """``s3`` for ``s3://b/k``; ``""`` for a local path (and for ``file://``, which is local)."""
    m = _SCHEME.match(str(path))
    if not m or m.group(1).lower() == "file":
        return ""
    return m.group(1).lower()


def is_remote(path: str | os.PathLike[str]) -> bool:
    return bool(scheme(os.fspath(path)))


def _scheme_end(path: str) -> int:
    """Where the ``scheme://`` of a remote location ends."""
    m = _SCHEME.match(path)
    if m is None:
        raise StorageError(f"{path}: not a URI")
    return m.end()


def local_path(path: str | os.PathLike[str]) -> str:
    """A local path as is (``file://`` stripped, ``~`` expanded)."""
    p = os.fspath(path)
    if p.startswith("file://"):
        p = p[len("file://"):]
    return os.path.expanduser(p)


def join(base: str | os.PathLike[str], *parts: str) -> str:
    base = os.fspath(base)
    if is_remote(base):
        out = base.rstrip("/")
        for part in parts:
            out = f"{out}/{part.strip('/')}" if part else out
        return out
    return os.path.join(base, *parts)


def name(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if is_remote(path) else os.path.basename(path)


def parent(path: str) -> str:
    if is_remote(path):
        head = path.rstrip("/")
        end = _scheme_end(head)
        rest = head[end:]
        return head[:end] + (posixpath.dirname(rest) or rest)
    return os.path.dirname(path)


def _s3(endpoint: str | None, region: str | None) -> pafs.FileSystem:
    kw: dict[str, Any] = {"allow_bucket_creation": True}
    if endpoint:
        m = _SCHEME.match(endpoint)
        if m:
            kw["scheme"] = m.group(1).lower()
            endpoint = endpoint[m.end():]
        kw["endpoint_override"] = endpoint.rstrip("/")
    if region:
        kw["region"] = region
    return pafs.S3FileSystem(**kw)


def filesystem(path: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem of ``path`` and the path inside it (``bucket/key`` for S3)."""
    path = os.fspath(path)
    sch = scheme(path)
    if not sch:
        return pafs.LocalFileSystem(), os.path.abspath(local_path(path))
    inner = path[_scheme_end(path):]
    if sch in ("s3", "s3a"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        key: tuple[str, ...] = ("s3", endpoint or "", region or "")
        make = lambda: _s3(endpoint, region)  # noqa: E731
    else:
        key = (sch, inner.split("/", 1)[0])

        def make() -> pafs.FileSystem:
            try:
                return pafs.FileSystem.from_uri(path)[0]
            except (ValueError, OSError):  # ArrowInvalid is a ValueError: a scheme pyarrow does not know
                pass
            try:
                import fsspec  # optional, not a dependency: only a scheme pyarrow does not know needs it

                return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(sch)))
            except (ImportError, ValueError) as exc:
                raise StorageError(f"{path}: no filesystem for {sch}:// ({exc})") from None

    with _FS_LOCK:
        fs = _FS_CACHE.get(key)
        if fs is None:
            fs = _FS_CACHE[key] = make()
    return fs, inner.rstrip("/")


def _info(path: str) -> pafs.FileInfo:
    fs, p = filesystem(path)
    return fs.get_file_info(p)


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(local_path(path))
    return _info(path).type != pafs.FileType.NotFound


def is_file(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(local_path(path))
    return _info(path).type == pafs.FileType.File


def is_dir(path: str) -> bool:
    if not is_remote(path):
        return os.path.isdir(local_path(path))
    return _info(path).type == pafs.FileType.Directory


def size(path: str) -> int:
    """The file's size in bytes; FileNotFoundError when there is none."""
    if not is_remote(path):
        return os.stat(local_path(path)).st_size
    info = _info(path)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(2, "No such file", path)
    return int(info.size)


def open_input(path: str) -> IO[bytes]:
    """A seekable binary reader (Parquet, tar members, ranges)."""
    if not is_remote(path):
        return open(local_path(path), "rb")  # noqa: SIM115 - the caller closes it
    fs, p = filesystem(path)
    try:
        return fs.open_input_file(p)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if _info(path).type == pafs.FileType.NotFound:
            raise FileNotFoundError(2, "No such file", path) from None
        raise OSError(f"cannot read {path}: {exc}") from None


def read_bytes(path: str, limit: int | None = None) -> bytes:
    """The whole file; ValueError when it is larger than ``limit``."""
    with open_input(path) as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def makedirs(path: str) -> None:
    """Local: ``mkdir -p``. Remote: nothing to do (an object store has prefixes, not folders)."""
    if not is_remote(path):
        os.makedirs(local_path(path), exist_ok=True)


def temp_name(name: str) -> str:
    """The name a file called ``name`` has while it is written: hidden, and unique to this process and call,
    so two writers of one file never share a temporary file. :func:`is_temp_name` recognises it."""
    return f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


def is_temp_name(name: str) -> bool:
    """Whether ``name`` (a file name, no folder) is one :func:`temp_name` made: a write that never finished
    (its process died), never a published file."""
    return _TEMP_NAME.fullmatch(name) is not None


def fsync_dir(folder: str) -> None:
    """Make a rename in ``folder`` durable. Best effort: some filesystems cannot fsync a folder, and the
    rename is done either way."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _naming(exc: OSError, target: str) -> OSError:
    """``exc`` naming the file being written instead of its temporary name (same errno, same subclass)."""
    return OSError(exc.errno, exc.strerror or str(exc) or type(exc).__name__, target)


@contextlib.contextmanager
def _local_output(path: str) -> Iterator[IO[bytes]]:
    """:func:`open_output` for a local path: temporary name, fsync, rename, fsync of the folder."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, temp_name(os.path.basename(path)))
    try:
        f = open(tmp, "xb")  # noqa: SIM115 - closed by _publish, or below on a failure
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        yield f
        _publish(f, tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            f.close()  # the descriptor is closed even when this last flush fails
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def _publish(f: IO[bytes], tmp: str, path: str) -> None:
    """Flush, fsync and close a complete temporary file, and rename it to ``path``."""
    try:
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, path)
    except OSError as exc:
        raise _naming(exc, path) from None


@contextlib.contextmanager
def open_output(path: str) -> Iterator[IO[bytes]]:
    """A binary writer that publishes ``path`` only when the block ends without an error: locally a
    temporary file renamed into place after fsync (removed on any failure), remotely a (multipart) upload
    completed on close (aborted on any failure)."""
    if not is_remote(path):
        with _local_output(local_path(path)) as f:
            yield f
        return
    fs, p = filesystem(path)
    out = fs.open_output_stream(p, compression=None)
    try:
        yield out
    except BaseException:
        # pyarrow completes a multipart upload on close(); abort() drops it so nothing half-written appears
        with contextlib.suppress(Exception):
            out.abort()
        raise
    out.close()


def write_bytes(path: str, data: bytes) -> None:
    """Write the whole of ``data`` to ``path`` atomically (:func:`open_output`): a reader sees the old
    content or the new, never a part; a failure leaves the old content and no temporary file."""
    with open_output(path) as f:
        try:
            f.write(data)
        except OSError as exc:
            raise _naming(exc, path) from None


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def delete_file(path: str) -> None:
    """Remove a file; nothing when it is not there."""
    if not is_remote(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(local_path(path))
        return
    fs, p = filesystem(path)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(p)


def rmtree(path: str) -> None:
    """Remove a folder (local) or every object below a prefix (remote); nothing when it is not there."""
    if not is_remote(path):
        shutil.rmtree(local_path(path), ignore_errors=True)
        return
    fs, p = filesystem(path)
    if fs.get_file_info(p).type == pafs.FileType.NotFound:
        return
    fs.delete_dir_contents(p, missing_dir_ok=True)
    with contextlib.suppress(OSError):
        fs.delete_dir(p)


def copy_file(src: str, dst: str) -> None:
    """Copy one file (a server-side copy when both are in the same object store)."""
    if is_remote(src) and is_remote(dst) and scheme(src) == scheme(dst):
        fs, s = filesystem(src)
        _, d = filesystem(dst)
        fs.copy_file(s, d)
        return
    with open_input(src) as f, open_output(dst) as out:
        shutil.copyfileobj(f, out, CHUNK)


def list_files(path: str) -> list[str]:
    """Every file below the folder / prefix ``path`` (recursive), as full locations, sorted; [] when none."""
    if not is_remote(path):
        root = local_path(path)
        out: list[str] = []
        for folder, _, files in os.walk(root):
            out.extend(os.path.join(folder, f) for f in files)
        return sorted(out)
    fs, p = filesystem(path)
    base = path[: _scheme_end(path)]
    try:
        infos = fs.get_file_info(pafs.FileSelector(p, recursive=True, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(base + i.path for i in infos if i.type == pafs.FileType.File)


def expand_remote(pattern: str) -> list[str]:
    """Files a remote input names: one object, every object below a prefix, or a glob (``*``, ``?``,
    ``[...]`` within one path segment, ``**`` across segments; names starting with ``.`` only when the
    pattern's segment does, as for local globs). Sorted; [] when nothing matches. A store that cannot be asked
    (no network, an endpoint that refuses, a missing repository or credential) is one :class:`StorageError` line
    naming ``pattern`` and the store's reason, whatever the store's client raised."""
    try:
        return _expand_remote(pattern)
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - each store has its own errors: pyarrow's OSError, hf://'s HTTP client's
        first = (str(exc).splitlines() or [""])[0]  # the shard contract imports nothing of ours (pipeline.error_line)
        raise StorageError(f"cannot list {pattern}: {type(exc).__name__}: {first}") from None


def _expand_remote(pattern: str) -> list[str]:
    base = pattern[: _scheme_end(pattern)]
    rest = pattern[len(base):]
    segs = rest.split("/")
    magic = [i for i, s in enumerate(segs) if any(c in s for c in GLOB_CHARS)]
    if not magic:
        info = _info(pattern)
        if info.type == pafs.FileType.File:
            return [pattern]
        return list_files(pattern) if info.type == pafs.FileType.Directory else []
    root = "/".join(segs[: magic[0]])
    want = [s for s in segs[magic[0]:] if s]
    out = []
    for loc in list_files(base + root):
        rel = loc[len(base + root):].lstrip("/").split("/")
        if _match(rel, want):
            out.append(loc)
    return out


def _match(parts: list[str], segs: list[str]) -> bool:
    if not segs:
        return not parts
    if segs[0] == "**":
        if len(segs) == 1:  # a trailing ** names everything below, hidden names included (as locally)
            return True
        return any(_match(parts[i:], segs[1:]) for i in range(len(parts) + 1)
                   if all(not p.startswith(".") for p in parts[:i]))
    if not parts:
        return False
    hidden_ok = segs[0].startswith(".")
    if parts[0].startswith(".") and not hidden_ok:
        return False
    return fnmatch.fnmatchcase(parts[0], segs[0]) and _match(parts[1:], segs[1:])


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open_input(path) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def describe(path: str) -> str:
    """A location for messages: URIs as they are, local paths as given."""
    return os.fspath(path)
