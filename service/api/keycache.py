"""A short-lived cache of API keys, so checking a request's key is not a database read per request.

What is cached is the key's row as the database had it (its id and ``secret_hash``), for at most ``ttl_s``
seconds after the read that fetched it began; every request's secret is still hashed and compared with
the stored hash (constant-time), so a wrong secret for a cached key is refused without a read. A malformed key
is refused without a read. An unknown or revoked key id is remembered as such for ``ttl_s`` (at most
:data:`MAX_UNKNOWN` ids, the oldest forgotten first), so a stranger repeating one costs one read per ``ttl_s``,
not one per request; a stranger inventing a new id per request still costs a read each (the id is 48 random
bits: no cache can tell an unknown one from a real one without asking).

**Staleness bound.** A key revoked by another process (``tokenmill apikey revoke``, another API worker) stops
working here at most ``ttl_s`` seconds (``Settings.auth_cache_s``, default 10 s; 0 turns the cache off) after
the revocation commits. A revocation flushed by this process (``repo.revoke_key`` on any of its sessions) also
drops the key from this process's caches when it is flushed (a read already under way may still put the old row
back, for at most ``ttl_s``). A new key works at once: its id is new (random), so no request named it before it
existed (and a key inserted by this process is dropped from the unknown ids all the same).

**Nobody waits for a refresh.** Once an entry is half its life old, the next request that uses it starts a
read in the background and goes on with the entry; the read replaces it, normally long before it expires. A
request waits for a read only when there is no live entry: a key's first use, or one idle for ``ttl_s``.
This matters under load: the read runs in the thread pool (it may write ``last_used_at``, which can wait for
SQLite's write lock), and a thread that needs the GIL back from a busy event loop waits long for it under
load (bench/api_load.py), which every request waiting on it would add to its latency.
Concurrent misses on one key share one read (one task loads, the others await it). The reads also refresh the
key's ``last_used_at`` when it is older than ``repo.LAST_USED_RESOLUTION`` (a minute), so it lags the last use
by at most that plus ``ttl_s``.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import event, inspect
from starlette.concurrency import run_in_threadpool

from service import auth
from service.settings import AUTH_CACHE_S
from service.store import repo
from service.store.db import Database
from service.store.models import ApiKey, utcnow

#: caches live in this process, so a revocation flushed here reaches them all
_CACHES: weakref.WeakSet[KeyCache] = weakref.WeakSet()
#: unknown or revoked key ids remembered per cache: 10k ids (1.5 MB) outlast any real set of keys, and
#: a flood of invented ids only pushes out other invented ones
MAX_UNKNOWN = 10_000


@dataclass(frozen=True)
class _Entry:
    key: ApiKey  # detached: only its columns are read (key.id)
    secret_hash: str
    refresh: float  # clock(): read it again in the background from then on
    expires: float  # clock(): unusable from then on


class KeyCache:
    """``await cache.authenticate(db, token)``: the live key ``token`` names, else None."""

    def __init__(self, ttl_s: float = AUTH_CACHE_S, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.clock = ttl_s, clock
        self._entries: dict[str, _Entry] = {}
        #: key id -> clock() until which it is known to be unknown or revoked (oldest first)
        self._unknown: OrderedDict[str, float] = OrderedDict()
        self._loading: dict[str, asyncio.Future[_Entry | None]] = {}
        _CACHES.add(self)

    async def authenticate(self, db: Database, token: str) -> ApiKey | None:
        parsed = auth.parse(token)
        if parsed is None:
            return None
        key_id, secret = parsed
        entry, now = self._entries.get(key_id), self.clock()
        if entry is None and self._unknown.get(key_id, now) > now:
            return None  # read within ttl_s: no such live key
        if entry is None or entry.expires <= now:
            entry = await self._load(db, key_id, secret)
        elif entry.refresh <= now and key_id not in self._loading:
            self._start(db, key_id, secret)  # not awaited: this request goes on with the entry it has
        if entry is None or not auth.matches(secret, entry.secret_hash):
            return None
        return entry.key

    def forget(self, key_id: str) -> None:
        self._entries.pop(key_id, None)

    def known(self, key_id: str) -> None:
        """``key_id`` now names a key (inserted by this process): no longer answer it as unknown."""
        self._unknown.pop(key_id, None)

    def __len__(self) -> int:
        return len(self._entries)

    async def _load(self, db: Database, key_id: str, secret: str) -> _Entry | None:
        if self.ttl_s <= 0:
            return await run_in_threadpool(self._read, db, key_id, secret, 0.0)
        pending = self._loading.get(key_id) or self._start(db, key_id, secret)
        return await asyncio.shield(pending)  # a cancelled request leaves the read to the others

    def _start(self, db: Database, key_id: str, secret: str) -> asyncio.Future[_Entry | None]:
        pending = asyncio.ensure_future(run_in_threadpool(self._read, db, key_id, secret, self.clock()))
        self._loading[key_id] = pending
        pending.add_done_callback(lambda f: self._loaded(key_id, f))
        return pending

    def _loaded(self, key_id: str, f: asyncio.Future[_Entry | None]) -> None:
        if self._loading.get(key_id) is f:
            del self._loading[key_id]
        if f.cancelled() or f.exception() is not None:  # retrieved: no "never retrieved" warning (a background
            return                                          # refresh's error shows when the entry expires)
        entry = f.result()
        if entry is not None and self.ttl_s > 0:
            self._entries[key_id] = entry
            self._unknown.pop(key_id, None)
        else:
            self._entries.pop(key_id, None)
            self._remember_unknown(key_id)

    def _remember_unknown(self, key_id: str) -> None:
        if self.ttl_s <= 0:
            return
        self._unknown.pop(key_id, None)
        self._unknown[key_id] = self.clock() + self.ttl_s
        while len(self._unknown) > MAX_UNKNOWN:
            self._unknown.popitem(last=False)

    def _read(self, db: Database, key_id: str, secret: str, started: float) -> _Entry | None:
        """In a worker thread: the key's row (None if unknown or revoked); refreshes ``last_used_at`` when the
        reader's secret is right and the stored time is older than the resolution."""
        with db.read() as s:
            key = repo.find_key(s, key_id)
        if key is None:
            return None
        if auth.matches(secret, key.secret_hash) and (
                key.last_used_at is None or utcnow() - key.last_used_at > repo.LAST_USED_RESOLUTION):
            with db.session() as s:
                repo.touch_key(s, key_id)
        return _Entry(key, key.secret_hash, started + self.ttl_s / 2, started + self.ttl_s)


@event.listens_for(ApiKey, "after_update")
def _revoked_here(mapper: object, connection: object, target: ApiKey) -> None:
    if inspect(target).attrs.revoked_at.history.has_changes():
        for cache in list(_CACHES):
            cache.forget(target.id)


@event.listens_for(ApiKey, "after_insert")
def _created_here(mapper: object, connection: object, target: ApiKey) -> None:
    for cache in list(_CACHES):
        cache.known(target.id)
