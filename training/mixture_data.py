"""Read a mixture (``mixture.json``) as the loader reads a shard set: same split, resume and checks.

The mixture's epoch is its schedule (:mod:`pipeline.mixture_format`): ``T`` positions, each a draw from one
source. The rank and worker split, the window shuffle, ``state_dict`` and the equal batch count on every
rank are :mod:`training.data`'s, applied to those positions; each worker reads its block's draws source by
source (every shard fetched once per run and checked against its source's manifest, whose own sha256 must
be the one the mixture pinned). Every batch carries ``source_tokens``: the non-padding tokens it holds from
each source, which the trainer logs.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pipeline import storage
from pipeline.mixture_format import MAX_MIXTURE_BYTES, Mixture, source_runs
from pipeline.shard_format import Manifest, Sample, ShardFormatError
from training.data import (
    LoaderConfig,
    LoaderError,
    SequenceSplit,
    ShardLoader,
    ShardSource,
    _EpochStream,
    _is_url,
    collate_flat,
    loader_config,
    read_runs,
)

#: positions whose draws are computed at once (a worker's block is read chunk by chunk)
CHUNK = 1 << 16


def is_mixture(location: str) -> bool:
    """``--data`` names a mixture when it names a ``.json`` file (a shard set is a folder or base URL)."""
    return str(location).rstrip("/").endswith(".json")


def split_location(location: str) -> tuple[str, str]:
    """(folder or base URL, file name) of a mixture file."""
    location = str(location)
    if _is_url(location) or storage.is_remote(location):
        base, _, name = location.rstrip("/").rpartition("/")
        return base, name
    path = Path(location)
    return str(path.parent), path.name


def resolve_source(base: str, location: str) -> str:
    """A source's location as written in the mixture, relative to the mixture's folder or URL."""
    if "://" in location:
        return location
    if _is_url(base):  # a relative URL, or a path on the mixture's server (/v1/jobs/{id}/artifacts)
        return urllib.parse.urljoin(base.rstrip("/") + "/", location)
    if os.path.isabs(location):
        return location
    if storage.is_remote(base):
        return storage.join(base, location)
    return os.path.normpath(os.path.join(base, location))


def read_mixture(location: str, headers: dict[str, str] | None = None,
                 bearer_token: str | None = None) -> tuple[Mixture, bytes, str]:
    """(the mixture, its bytes, the folder or URL its relative sources resolve against)."""
    base, name = split_location(location)
    data, where = ShardSource(base, headers, bearer_token=bearer_token).fetch(name, MAX_MIXTURE_BYTES)
    try:
        mixture = Mixture.from_json(data)
    except ShardFormatError as exc:
        raise LoaderError(f"{where}: {exc}") from None
    return mixture, data, split_location(where)[0]


def mixture_samples(sources: list[ShardSource], manifests: list[Manifest], mixture: Mixture, lo: int, hi: int,
                    prefetch: int = 2) -> Iterator[tuple[tuple[int, str], Sample]]:
    """((source index, key), sample) of the schedule's positions ``[lo, hi)`` in order, each source's
    shards read once per run (fetched ahead and checked against its manifest)."""
    src, draws = mixture.schedule().draws(lo, hi)
    readers: dict[int, Iterator[tuple[str, Sample]]] = {}
    for i in np.unique(src).tolist():
        m, s = manifests[i], mixture.sources[i]
        runs = source_runs(mixture.seed, i, [x.samples for x in m.shards], draws[src == i])
        readers[i] = read_runs(sources[i], m.shards, runs, prefetch, prefix=f"{s.name}/")
    for i in src.tolist():
        key, sample = next(readers[i])
        yield (i, key), sample


class MixturePlan(SequenceSplit):
    """One epoch of the mixture for one rank: the schedule's positions, split as a shard set's are."""

    def __init__(self, manifest: Manifest, total: int, cfg: LoaderConfig, epoch: int, rank: int, world: int) -> None:
        self.manifest = manifest  # seq_len, pad_id and vocabulary (every source shares them)
        super().__init__(total, cfg, epoch, rank, world, what="the mixture")


class _MixtureStream(_EpochStream):
    def __init__(self, loader: MixtureLoader, plan: MixturePlan, start_batch: int) -> None:
        super().__init__(loader.sources[0], plan, start_batch, loader.prefetch)  # type: ignore[arg-type]
        self.sources, self.manifests = loader.sources, loader.manifests
        self.mixture, self.schedule = loader.mixture, loader.schedule

    def _samples(self, lo: int, hi: int) -> Iterator[tuple[Any, Sample]]:
        total = self.schedule.total
        pos = lo
        while pos < hi:  # positions past the end wrap round to the start (remainder "wrap")
            a = pos % total
            b = min(a + (hi - pos), total, a + CHUNK)
            yield from self._chunk(a, b)
            pos += b - a

    def _chunk(self, lo: int, hi: int) -> Iterator[tuple[Any, Sample]]:
        return mixture_samples(self.sources, self.manifests, self.mixture, lo, hi, self.prefetch)

    def _permute(self, window: list[tuple[Any, Sample]], rng: np.random.Generator) -> list[tuple[Any, Sample]]:
        """Shuffle each source's samples among that source's positions only: the interleave, and with it every
        window's share per source, stays exactly the schedule's."""
        src = np.array([i for (i, _), _ in window], dtype=np.int64)
        out = list(window)
        for i in np.unique(src).tolist():
            slots = np.flatnonzero(src == i)
            for slot, k in zip(slots.tolist(), slots[rng.permutation(len(slots))].tolist(), strict=True):
                out[slot] = window[k]
        return out

    def _collate(self, pending: list[tuple[Any, Sample]]) -> dict[str, Any]:
        m = self.manifest
        wire = collate_flat([s for _, s in pending], m.seq_len, m.pad_id, m.vocab_size, [k for (_, k), _ in pending])
        counts = [0] * len(self.sources)
        for (i, _), s in pending:
            counts[i] += len(s.input_ids)
        wire["source_tokens"] = counts
        return wire


class MixtureLoader(ShardLoader):
    """:class:`~training.data.ShardLoader` over a mixture file (a path or an http(s) URL)."""

    def __init__(self, location: str, batch_size: int, *, rank: int = 0, world: int = 1, seed: int = 0,
                 shuffle: bool = True, shuffle_window: int = 4096, num_workers: int = 2,
                 remainder: Literal["drop", "wrap"] = "drop", headers: dict[str, str] | None = None,
                 prefetch_shards: int = 2, pin_memory: bool = False, max_epochs: int | None = None,
                 bearer_token: str | None = None) -> None:
        cfg = loader_config(batch_size, seed, shuffle, shuffle_window, remainder, num_workers)
        self.mixture, data, base = read_mixture(location, headers, bearer_token)
        self.mixture_sha256 = hashlib.sha256(data).hexdigest()
        self.schedule = self.mixture.schedule()
        self.sources: list[ShardSource] = []
        self.manifests: list[Manifest] = []
        for s in self.mixture.sources:
            source = ShardSource(resolve_source(base, s.location), headers, bearer_token=bearer_token)
            manifest = source.manifest()
            if source.manifest_sha256 != s.manifest_sha256:
                raise LoaderError(f"source {s.name}: {source.describe('manifest.json')} has sha256 "
                                  f"{source.manifest_sha256[:16]}..., the mixture pinned {s.manifest_sha256[:16]}...: "
                                  "the shard set changed since the mixture was made")
            if manifest.total_samples != s.available_samples:
                raise LoaderError(f"source {s.name}: {manifest.total_samples} samples, the mixture planned "
                                  f"{s.available_samples}")
            for key in ("seq_len", "dtype", "vocab_size", "tokenizer_hash", "pad_id"):
                if getattr(manifest, key) != getattr(self.mixture, key):
                    raise LoaderError(f"source {s.name}: {key} differs from the mixture's")
            self.sources.append(source)
            self.manifests.append(manifest)
        self.source = self.sources[0]
        self.manifest = self.manifests[0]
        self.source_names = [s.name for s in self.mixture.sources]
        self._configure(cfg, rank, world, prefetch_shards, pin_memory, max_epochs)

    def plan(self, epoch: int) -> MixturePlan:
        return MixturePlan(self.manifest, self.schedule.total, self.cfg, epoch, self.rank, self.world)

    def _stream(self, plan: Any, start_batch: int) -> _MixtureStream:
        return _MixtureStream(self, plan, start_batch)

    def fingerprint(self) -> str:
        return self.mixture_sha256[:16]


def open_loader(location: str, batch_size: int, **kwargs: Any) -> ShardLoader:
    """The loader for ``--data``: a mixture file or a shard set."""
    if is_mixture(location):
        return MixtureLoader(location, batch_size, **kwargs)
    return ShardLoader(location, batch_size, **kwargs)
