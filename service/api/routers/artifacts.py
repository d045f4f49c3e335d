"""The files of a finished job's output and of a schedule's versions, over HTTP: what a trainer streams.

``GET /v1/jobs/{job_id}/artifacts`` lists them (name, bytes, sha256); ``GET|HEAD .../artifacts/{name}`` serves
one. ``/v1/schedules/{id}/versions/{n}/artifacts[/{name}]`` does the same for version ``n``, and
``versions/latest/...`` redirects (307) to the numbered version, so a client that reads the manifest through
``latest`` and the shards relative to where it landed never mixes two versions (``training/data.py`` pins so).
A trainer's ``--data`` is the artifacts URL; its API key goes in ``Authorization: Bearer``. A deleted schedule's
versions stay served at their URLs (:func:`service.store.repo.get_version` reads what it kept).

What is served: only what the output's last commit published (the names its ``.tokenmill/marker.json``
lists) and of those only what a trainer reads: ``manifest.json``, ``stats.json``, ``tokenizer.json``, the
shards the manifest lists, ``documents.json`` (an older output's ``documents/index.json``) and the parts
it lists, an ``output.split_by`` group's manifest, tokenizer and shards, and the dataset card (``README.md``, an
older output's ``CARD.md``,
``card/*.svg|png`` and ``card/spec.yaml``, whose secrets are redacted). Never ``rejected/`` (the dropped
documents' text: what a PII or quality stage took out), ``index/`` (dedup internals) or ``.tokenmill/``.

Refusals: a name that is not a plain relative path (absolute, ``..``, ``.``, an empty or hidden part, a
backslash, a character outside ``[A-Za-z0-9_.-]``) is 400; a well-formed name that is not served is 404; a
file whose resolved path leaves the output folder (a symlink) is 403, and so is an output folder that does not
resolve inside one of the service's output roots (a root removed from the configuration stops serving what
was written there); a job that has not SUCCEEDED is 409; a job whose folder now holds another spec's shard set
(a later job overwrote it) is 410.

HTTP: the ETag is the file's sha256 (a shard's from the manifest, a documents part's from its index, a small
file's computed once per inode, size and mtime), so ``If-None-Match`` gives 304 and a trainer can check each
body against its ETag. Ranges (``Range``, ``If-Range``, 206 with ``Content-Range``, ``multipart/byteranges``
for several, 416 with ``Content-Range: bytes */size`` when unsatisfiable) are starlette's ``FileResponse``.
A numbered version never changes, so it is sent with ``Cache-Control: private, max-age=31536000, immutable``;
a job's output may be replaced by a later job, so ``private, no-cache`` (revalidate with the ETag).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool
from starlette.responses import MalformedRangeHeader, RangeNotSatisfiable

from pipeline.output.inspect import DOCUMENTS_INDEXES, load_documents_index
from pipeline.output.layout import PUBLISHED
from pipeline.output.local_store import OutputDir
from pipeline.shard_format import MANIFEST, STATS, TOKENIZER, Manifest, ShardFormatError
from pipeline.storage import is_remote
from service.api import access, schemas
from service.api.deps import DbDep, KeyDep, SettingsDep
from service.api.schemas import ArtifactName, JobId, ScheduleId
from service.settings import Settings
from service.store import repo
from service.store.db import Database
from service.store.models import JobState

router = APIRouter(tags=["artifacts"])

_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: files served whole, hashed on demand (small): the shard set's and a group's
_SMALL = frozenset({MANIFEST, STATS, TOKENIZER, *DOCUMENTS_INDEXES, "README.md", "CARD.md"})
#: the dataset card's figures and spec (``card/``, pipeline/card): served beside ``README.md``
_CARD_FILE = re.compile(r"card/[A-Za-z0-9_-]+\.(svg|png|yaml)")
_GROUP_SMALL = frozenset({MANIFEST, TOKENIZER})
#: entries kept in each cache (catalogs per output folder; digests per file)
_CACHE_SIZE = 256
IMMUTABLE = "private, max-age=31536000, immutable"
REVALIDATE = "private, no-cache"
_FILE: dict[int | str, dict[str, Any]] = {400: {"model": schemas.Message, "description": "not a plain relative name"},
         403: {"model": schemas.Message, "description": "outside the output folder or the output roots"},
         404: {"model": schemas.Message, "description": "no such job, version or published file"},
         409: {"model": schemas.Message, "description": "the job has not succeeded"},
         410: {"model": schemas.Message, "description": "a later job replaced this output"}}
#: a served file's answers: its bytes (the media type its name gives), a range of them, not modified, a range
#: outside it (its JSON error: :func:`_range_refusal`)
_BYTES = {"content": {"*/*": {"schema": {"type": "string", "format": "binary"}}}}
_SERVED: dict[int | str, dict[str, Any]] = {
    **_FILE, 200: {**_BYTES, "description": "the file (ETag: its sha256)"},
    206: {**_BYTES, "description": "the ranges `Range` asked for (multipart/byteranges for several)"},
    304: {"description": "If-None-Match matched its ETag"},
    400: {"model": schemas.Message, "description": "not a plain relative name, or a malformed Range"},
    416: {"model": schemas.Message, "description": "no range of `Range` starts inside the file"}}
Version = Annotated[str, PathParam(pattern=r"^(latest|[1-9][0-9]{0,8})$", description="a number, or latest")]


@dataclass(frozen=True)
class Entry:
    """A servable file: its size and sha256 when a manifest or index gives them (else computed)."""

    bytes: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Catalog:
    entries: dict[str, Entry]
    #: the spec hashes its manifests name (a job's own must be among them)
    spec_hashes: frozenset[str]
    #: ``(path, (inode, size, mtime_ns))`` of the files it was built from: a change rebuilds it
    deps: tuple[tuple[str, tuple[int, int, int] | None], ...]


class _LRU(OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size, self.lock = size, threading.Lock()

    def get_item(self, key: object) -> object:
        with self.lock:
            if key in self:
                self.move_to_end(key)
                return self[key]
        return None

    def put(self, key: object, value: object) -> None:
        with self.lock:
            self[key] = value
            self.move_to_end(key)
            while len(self) > self.size:
                self.popitem(last=False)


_catalogs = _LRU(_CACHE_SIZE)
_digests = _LRU(_CACHE_SIZE * 16)


def _stat_key(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def check_name(name: str) -> list[str]:
    """The parts of a plain relative name, else 400."""
    parts = name.split("/")
    if len(name) > 512 or len(parts) > 4 or not all(_PART.fullmatch(p) for p in parts):
        raise HTTPException(status.HTTP_400_BAD_REQUEST,
                            "artifact names are plain relative paths: parts of letters, digits, '_', '.', '-' "
                            "not starting with '.', no '..', no leading '/'")
    return parts


def _group(parts: list[str]) -> str | None:
    """The ``output.split_by`` group a published name belongs to, if any."""
    return parts[0] if len(parts) >= 2 and parts[0] not in PUBLISHED else None


def build_catalog(folder: str) -> Catalog:
    """What of ``folder``'s last commit is served, with the sizes and digests its manifests and index give."""
    out = OutputDir(folder)
    deps: list[tuple[str, tuple[int, int, int] | None]] = [(str(out.marker_path), _stat_key(str(out.marker_path)))]
    marker = out.read_marker()
    files = list(marker["files"]) if marker else []
    known: dict[str, Entry] = {}
    hashes: set[str] = set()
    for prefix in [""] + sorted({f"{p[0]}/" for f in files if (p := f.split("/")) and _group(p)}):
        if f"{prefix}{MANIFEST}" not in files:
            continue
        where = os.path.join(folder, prefix)
        deps.append((os.path.join(where, MANIFEST), _stat_key(os.path.join(where, MANIFEST))))
        try:
            manifest = Manifest.load(where)
        except (OSError, ShardFormatError):
            continue  # a damaged manifest: none of its shards is served
        hashes.add(manifest.spec_hash)
        known.update({f"{prefix}{s.name}": Entry(s.bytes, s.sha256) for s in manifest.shards})
    index = next((n for n in DOCUMENTS_INDEXES if n in files), None)
    if index is not None:
        deps.append((os.path.join(folder, index), _stat_key(os.path.join(folder, index))))
        try:
            known.update({p["name"]: Entry(p["bytes"], p["sha256"]) for p in load_documents_index(folder, index).parts})
        except (OSError, ShardFormatError):
            pass
    entries: dict[str, Entry] = {}
    for name in files:
        parts = name.split("/")
        group = _group(parts)
        rest = parts[1:] if group else parts
        if (not group and (name in _SMALL or _CARD_FILE.fullmatch(name))) or (
                group and len(rest) == 1 and rest[0] in _GROUP_SMALL):
            entries[name] = Entry()
        elif name in known and rest[0] in ("shards", "documents"):
            entries[name] = known[name]
    return Catalog(entries, frozenset(hashes), tuple(deps))


def catalog(folder: str) -> Catalog:
    cached = _catalogs.get_item(folder)
    if isinstance(cached, Catalog) and all(_stat_key(p) == key for p, key in cached.deps):
        return cached
    built = build_catalog(folder)
    _catalogs.put(folder, built)
    return built


def file_sha256(path: str, st: os.stat_result) -> str:
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
    cached = _digests.get_item(key)
    if isinstance(cached, str):
        return cached
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    digest = h.hexdigest()
    _digests.put(key, digest)
    return digest


# ---- where a request's files are ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    folder: str  # resolved
    spec_hash: str
    cache_control: str


def _inside_roots(folder: str, settings: Settings) -> str:
    if is_remote(folder):  # the service serves files it can reach on its disk; a store is read directly
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"this output is in object storage ({folder}); read it "
                                                       "from there (training/data.py's loader takes the URI)")
    real = os.path.realpath(folder)
    if not any(Path(real).is_relative_to(r) and Path(real) != r for r in settings.roots().write):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this output lies outside the service's output roots")
    return real


def job_source(db: Database, settings: Settings, job_id: str, team: str | None) -> Source:
    """Where job ``job_id``'s files are (``team``: the caller's scope, :func:`service.api.access.team_scope`)."""
    with db.read() as s:
        job = repo.get_job(s, job_id, team)
        state, folder, spec_hash = JobState(job.state), job.output_path, job.spec_hash
    if state != JobState.SUCCEEDED:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is {state}; its output is served once it "
                                                      "has SUCCEEDED")
    return Source(_inside_roots(folder, settings), spec_hash, REVALIDATE)


def version_number(db: Database, schedule_id: str, version: str, team: str | None) -> int:
    with db.read() as s:
        return repo.get_version(s, schedule_id, None if version == "latest" else int(version), team).number


def version_source(db: Database, settings: Settings, schedule_id: str, number: int, team: str | None) -> Source:
    with db.read() as s:
        v = repo.get_version(s, schedule_id, number, team)
        folder, spec_hash = v.path, repo.get_job(s, v.job_id).spec_hash
    return Source(_inside_roots(folder, settings), spec_hash, IMMUTABLE)


def _checked_catalog(src: Source) -> Catalog:
    cat = catalog(src.folder)
    if cat.spec_hashes and src.spec_hash not in cat.spec_hashes:
        raise HTTPException(status.HTTP_410_GONE, "a later job replaced this output with another spec's")
    return cat


def _listing(src: Source) -> schemas.ArtifactList:
    cat = _checked_catalog(src)
    files = []
    for name, entry in sorted(cat.entries.items()):
        real = os.path.join(src.folder, name)
        try:
            st = os.stat(real)
        except OSError:
            continue
        sha = entry.sha256 or file_sha256(real, st)
        files.append(schemas.ArtifactOut(name=name, bytes=st.st_size, sha256=sha))
    return schemas.ArtifactList(files=files)


def _prepare(src: Source, name: str) -> tuple[str, os.stat_result, str]:
    """(resolved path, its stat, its sha256) of a served name, or the HTTP error saying why not."""
    check_name(name)
    entry = _checked_catalog(src).entries.get(name)
    if entry is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{name!r} is not a published artifact of this output")
    real = os.path.realpath(os.path.join(src.folder, name))
    if not Path(real).is_relative_to(src.folder) or real == src.folder:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"{name!r} resolves outside the output folder")
    try:
        st = os.stat(real)
    except OSError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{name!r} is listed but missing") from None
    if not stat.S_ISREG(st.st_mode):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{name!r} is not a regular file")
    if entry.bytes is not None and st.st_size != entry.bytes:
        raise HTTPException(status.HTTP_409_CONFLICT, f"{name!r} does not match the size its manifest gives "
                                                      "(being replaced, or damaged)")
    return real, st, entry.sha256 or file_sha256(real, st)


def _etag_matches(header: str | None, sha: str) -> bool:
    """``If-None-Match``: weak comparison (RFC 9110, 13.1.2), ``*`` matches any."""
    if header is None:
        return False
    tags = [t.strip() for t in header.split(",")]
    return any(t == "*" or t.removeprefix("W/") == f'"{sha}"' for t in tags)


async def _serve(request: Request, src: Source, name: str) -> Response:
    real, st, sha = await run_in_threadpool(_prepare, src, name)
    headers = {"ETag": f'"{sha}"', "Cache-Control": src.cache_control}
    if name.endswith(".svg"):  # a card figure opened at the API's origin: an image, never a page that runs anything
        headers["Content-Security-Policy"] = "default-src 'none'; style-src 'unsafe-inline'; sandbox"
    if _etag_matches(request.headers.get("if-none-match"), sha):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    response = FileResponse(real, stat_result=st, headers=headers)
    return _range_refusal(request, response, st.st_size) or response


def _range_refusal(request: Request, response: FileResponse, size: int) -> JSONResponse | None:
    """The 400 (malformed) or 416 (no byte inside the file) ``response`` would answer ``Range`` with, as JSON
    like every error of the API: starlette answers them in plain text. Same rules, its own parser: a ``Range``
    that ``If-Range`` cancels is no error."""
    http_range, if_range = request.headers.get("range"), request.headers.get("if-range")
    if http_range is None or (if_range is not None and not response._should_use_range(if_range)):
        return None
    try:
        FileResponse._parse_range_header(http_range, size)
    except MalformedRangeHeader as exc:
        return JSONResponse({"detail": f"Range: {exc.content.removeprefix('Range header: ')}"},
                            status.HTTP_400_BAD_REQUEST)
    except RangeNotSatisfiable:
        return JSONResponse({"detail": f"Range: no range starts inside the file ({size} bytes)"},
                            status.HTTP_416_RANGE_NOT_SATISFIABLE, headers={"Content-Range": f"bytes */{size}"})
    return None


def _to_latest(request: Request, number: int) -> RedirectResponse:
    path = request.url.path.replace("/versions/latest/artifacts", f"/versions/{number}/artifacts", 1)
    return RedirectResponse(str(request.url.replace(path=path)), status_code=status.HTTP_307_TEMPORARY_REDIRECT,
                            headers={"Cache-Control": "no-store"})


# ---- routes ---------------------------------------------------------------------------------------------------


@router.get("/v1/jobs/{job_id}/artifacts", response_model=schemas.ArtifactList, responses=_FILE)
async def list_job_artifacts(job_id: JobId, key: KeyDep, db: DbDep, settings: SettingsDep) -> schemas.ArtifactList:
    """The files a trainer can fetch from the job's output, with their sizes and sha256 (= ETag)."""
    src = await run_in_threadpool(job_source, db, settings, job_id, access.team_scope(key))
    return await run_in_threadpool(_listing, src)


@router.get("/v1/jobs/{job_id}/artifacts/{name:path}", responses=_SERVED, response_class=FileResponse)
@router.head("/v1/jobs/{job_id}/artifacts/{name:path}", include_in_schema=False)
async def get_job_artifact(request: Request, job_id: JobId, name: ArtifactName, key: KeyDep, db: DbDep,
                           settings: SettingsDep) -> Response:
    """One published file of the job's output (Range, If-Range and If-None-Match honoured; ETag = sha256)."""
    src = await run_in_threadpool(job_source, db, settings, job_id, access.team_scope(key))
    return await _serve(request, src, name)


@router.get("/v1/schedules/{schedule_id}/versions/{version}/artifacts", response_model=schemas.ArtifactList,
            responses={**_FILE, 307: {"description": "latest: the numbered version"}})
async def list_version_artifacts(request: Request, schedule_id: ScheduleId, version: Version, key: KeyDep, db: DbDep,
                                 settings: SettingsDep) -> Response | schemas.ArtifactList:
    """The files of a published version (``latest`` redirects to the newest number)."""
    number = await run_in_threadpool(version_number, db, schedule_id, version, access.team_scope(key))
    if version == "latest":
        return _to_latest(request, number)
    src = await run_in_threadpool(version_source, db, settings, schedule_id, number, access.team_scope(key))
    return await run_in_threadpool(_listing, src)


@router.get("/v1/schedules/{schedule_id}/versions/{version}/artifacts/{name:path}", response_class=FileResponse,
            responses={**_SERVED, 307: {"description": "latest: the numbered version"}})
@router.head("/v1/schedules/{schedule_id}/versions/{version}/artifacts/{name:path}", include_in_schema=False)
async def get_version_artifact(request: Request, schedule_id: ScheduleId, version: Version, name: ArtifactName,
                               key: KeyDep, db: DbDep, settings: SettingsDep) -> Response:
    """One file of a published version; a numbered version never changes (cached as immutable)."""
    check_name(name)
    number = await run_in_threadpool(version_number, db, schedule_id, version, access.team_scope(key))
    if version == "latest":
        return _to_latest(request, number)
    src = await run_in_threadpool(version_source, db, settings, schedule_id, number, access.team_scope(key))
    return await _serve(request, src, name)
