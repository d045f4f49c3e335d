"""Read a shard set by its location, as the writer published it: the shard contract's reading side.

A shard set is read from a local folder, an object-store URI (``s3://bucket/set``, through
:mod:`pipeline.storage`) or an http(s) base URL (a tokenmill service's artifacts URL), by the trainer's loader,
``tokenmill mix`` (which pins each source's manifest) and a mixture's ``--materialize`` alike: so this module
imports nothing of ours beyond the contract (:mod:`pipeline.shard_format`, :mod:`pipeline.storage`,
:mod:`pipeline.shard_reader`) and no torch.

Nothing read is trusted: the manifest goes through the one strict schema the writer also applies
(``Manifest.from_json``), every read is bounded (the manifest by a fixed cap, a shard by its own ``bytes``),
a shard is checked against the manifest's size and sha256 before a sample is decoded (:func:`decode_shard`),
and HTTP credentials never follow a redirect to another origin (:class:`ShardSource`). Every failure is a
:class:`ShardReadError`.
"""

from __future__ import annotations

import http.client
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pipeline import storage
from pipeline.shard_format import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Manifest,
    Sample,
    ShardFormatError,
    ShardInfo,
    read_regular,
    sha256_bytes,
)
from pipeline.shard_reader import read_shard_samples

#: the tokenmill service's API key, sent as ``Authorization: Bearer`` to an http(s) shard set when no
#: ``Authorization`` header is configured (so a key never has to appear in a config file or a command line)
API_KEY_ENV = "TOKENMILL_API_KEY"


class ShardReadError(RuntimeError):
    """The shard set cannot be read as planned; the message names the shard (or setting) and why."""


def is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


class _CredentialSafeRedirects(urllib.request.HTTPRedirectHandler):
    """Follows http(s) redirects, but one to another origin (scheme, host, port) carries none of the
    caller's headers: they hold credentials meant for the shard server alone (a redirect to a CDN or
    an object store still works when the URL itself authorizes the download). Records the last URL
    so that every error names the URL actually fetched."""

    max_redirections = 5

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        scheme = urllib.parse.urlsplit(newurl).scheme.lower()
        if scheme not in ("http", "https"):
            raise urllib.error.HTTPError(req.full_url, code, f"redirect to a non-HTTP URL {newurl} refused",
                                         headers, fp)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            self.url = new.full_url
            try:
                same = _origin(new.full_url) == _origin(req.full_url)
            except ValueError:  # an unparsable port
                same = False
            if not same:
                new.headers.clear()  # urllib copies the caller's headers to the new request: drop them all
        return new


class ShardSource:
    """Reads the manifest and shard bytes from a local directory, an object-store URI (``s3://bucket/set``,
    through :mod:`pipeline.storage`) or an HTTP(S) base URL.

    Every read is bounded: the manifest by ``MAX_MANIFEST_BYTES``, a shard by its ``bytes`` in the
    manifest (a longer body or file is refused after ``limit + 1`` bytes, a device or FIFO at once).
    ``timeout`` bounds the HTTP connection and each read from the socket. ``headers`` (an API key)
    go to the base URL's origin only: redirects to another origin are followed without them.

    Over HTTP, ``bearer_token`` (else the ``TOKENMILL_API_KEY`` environment variable) becomes
    ``Authorization: Bearer ...`` unless ``headers`` already hold an ``Authorization``. When the manifest's
    URL redirects within the same origin (the service's ``versions/latest`` to ``versions/7``), the source
    re-bases on where the manifest was read, so every shard comes from the version that manifest describes."""

    def __init__(self, location: str, headers: dict[str, str] | None = None, timeout: float = 60.0,
                 retries: int = 3, bearer_token: str | None = None) -> None:
        self.location = str(location).rstrip("/") if is_url(str(location)) else str(location)
        self.headers = dict(headers or {})
        self.timeout = timeout
        self.retries = retries
        token = bearer_token or os.environ.get(API_KEY_ENV)
        if self.is_http and token and not any(k.lower() == "authorization" for k in self.headers):
            self.headers["Authorization"] = f"Bearer {token.strip()}"

    @property
    def is_http(self) -> bool:
        return is_url(self.location)

    def describe(self, relpath: str) -> str:
        if self.is_http or storage.is_remote(self.location):
            return f"{self.location.rstrip('/')}/{relpath}"
        return str(Path(self.location) / relpath)

    def read(self, relpath: str, limit: int) -> bytes:
        return self.fetch(relpath, limit)[0]

    def fetch(self, relpath: str, limit: int) -> tuple[bytes, str]:
        """(at most ``limit`` bytes of ``relpath``, where they were actually read from)."""
        if self.is_http:
            return self._http_get(relpath, limit)
        where = self.describe(relpath)
        if storage.is_remote(where):  # an object store (s3://...): pyarrow's filesystem, bounded like a file
            try:
                return storage.read_bytes(where, limit), where
            except ValueError as exc:
                raise ShardReadError(f"{relpath}: {exc}") from None
            except OSError as exc:
                raise ShardReadError(f"{relpath}: cannot read {where}: {exc}") from None
        try:
            return read_regular(where, limit), where
        except OSError as exc:
            raise ShardReadError(f"{relpath}: cannot read {where}: {exc.strerror or exc}") from None
        except ShardFormatError as exc:
            raise ShardReadError(f"{relpath}: cannot read {where}: {exc}") from None

    def _http_get(self, relpath: str, limit: int) -> tuple[bytes, str]:
        last = ""
        for attempt in range(self.retries + 1):
            redirects = _CredentialSafeRedirects(self.describe(relpath))
            opener = urllib.request.build_opener(redirects)
            try:
                req = urllib.request.Request(redirects.url, headers=self.headers)
                with opener.open(req, timeout=self.timeout) as resp:
                    url = resp.geturl()
                    return _bounded_body(resp, relpath, url, limit), url
            except urllib.error.HTTPError as exc:
                url = exc.geturl() or redirects.url
                if exc.code < 500:  # 404, 401, a refused redirect...: retrying will not help
                    raise ShardReadError(f"{relpath}: HTTP {exc.code} {exc.reason} from {url}") from None
                last = f"HTTP {exc.code} {exc.reason} from {url}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, http.client.HTTPException) as exc:
                last = f"{getattr(exc, 'reason', exc) or type(exc).__name__} ({redirects.url})"
            if attempt < self.retries:
                time.sleep(min(0.5 * 2**attempt, 5.0))
        raise ShardReadError(f"{relpath}: cannot fetch {self.describe(relpath)} after {self.retries + 1} tries: {last}")

    def manifest(self) -> Manifest:
        data, where = self.fetch(MANIFEST, MAX_MANIFEST_BYTES)
        try:
            manifest = Manifest.from_json(data)
        except ShardFormatError as exc:
            raise ShardReadError(f"{where}: {exc}") from None
        self._pin(where)
        self.manifest_sha256 = sha256_bytes(data)  # what a mixture pins its sources by
        return manifest

    def _pin(self, where: str) -> None:
        """Read the shards from the folder the manifest came from, when a same-origin redirect moved it."""
        suffix = "/" + MANIFEST
        if not self.is_http or where == self.describe(MANIFEST) or not where.endswith(suffix):
            return
        try:
            same = _origin(where) == _origin(self.location)
        except ValueError:
            same = False
        if same and not urllib.parse.urlsplit(where).query:
            self.location = where[: -len(suffix)]


def _bounded_body(resp: http.client.HTTPResponse, relpath: str, url: str, limit: int) -> bytes:
    """The response body, refused as soon as it passes ``limit`` bytes (an endless body ends here)."""
    declared = resp.length  # Content-Length as http.client will honour it (None when chunked or absent)
    if declared is not None:
        if declared > limit:
            raise ShardReadError(f"{relpath}: {url} declares {declared} bytes, more than the {limit} expected")
        return resp.read()  # exactly Content-Length bytes (a short body raises IncompleteRead: retried)
    chunks: list[bytes] = []
    total = 0
    while block := resp.read(min(1 << 20, limit + 1 - total)):
        chunks.append(block)
        total += len(block)
        if total > limit:
            raise ShardReadError(f"{relpath}: {url} sent more than the {limit} bytes expected")
    return b"".join(chunks)


def decode_shard(info: ShardInfo, data: bytes, where: str | None = None) -> list[Sample]:
    """Verify a shard's bytes against the manifest, then decode its samples (npy/json only)."""
    origin = f" (read from {where})" if where else ""
    if len(data) != info.bytes:
        raise ShardReadError(f"shard {info.name}: {len(data)} bytes but the manifest says {info.bytes} "
                          f"(truncated or replaced){origin}")
    digest = sha256_bytes(data)
    if digest != info.sha256:
        raise ShardReadError(f"shard {info.name}: sha256 mismatch (manifest {info.sha256[:16]}..., "
                          f"got {digest[:16]}...): the shard is corrupted or was replaced{origin}")
    try:
        samples = read_shard_samples(data)
    except ShardFormatError as exc:
        raise ShardReadError(f"shard {info.name}: cannot decode: {exc}{origin}") from None
    if len(samples) != info.samples:
        raise ShardReadError(f"shard {info.name}: {len(samples)} samples but the manifest says {info.samples}{origin}")
    return samples


def read_runs(source: ShardSource, shards: list[ShardInfo], segments: list[tuple[int, int, int]],
              prefetch: int, prefix: str = "") -> Iterator[tuple[str, Sample]]:
    """(key, sample) of the runs ``(shard index, first, end)`` in order; shard bytes are fetched ahead in a
    thread (I/O overlaps decoding) and checked against the manifest, each shard once per run."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        def fetch(s: int) -> Any:
            return pool.submit(source.fetch, shards[s].name, shards[s].bytes)

        futures = [fetch(s) for s, _, _ in segments[:prefetch]]
        for n, (s, a, b) in enumerate(segments):
            data, where = futures[n].result()
            if n + prefetch < len(segments):
                futures.append(fetch(segments[n + prefetch][0]))
            futures[n] = None  # free the bytes once decoded
            samples = decode_shard(shards[s], data, where if source.is_http else None)
            del data
            name = shards[s].name
            for sample in samples[a:b]:
                yield f"{prefix}{name}/{sample.key}", sample
