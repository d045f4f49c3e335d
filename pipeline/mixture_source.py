"""Read a mixture (``mixture.json``) and its samples: the mixture contract's reading side.

A mixture names shard sets (relative to the mixture's own folder or URL) and pins each by its manifest's sha256;
its samples are its schedule (:mod:`pipeline.mixture_format`), each position a draw from one source. The trainer's
loader (``training.mixture_data``) and ``tokenmill mix --materialize`` (:mod:`pipeline.output.materialize`) read them
the same way, here: every source opened and checked against the pin (:func:`open_mixture`), every shard read once
per run and checked against its source's manifest (:func:`mixture_samples`). No torch; failures are
:class:`~pipeline.shard_source.ShardReadError`.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import storage
from pipeline.mixture_format import MAX_MIXTURE_BYTES, Mixture, Schedule, source_runs
from pipeline.shard_format import MANIFEST, Manifest, Sample, ShardFormatError
from pipeline.shard_source import ShardReadError, ShardSource, is_url, read_runs

#: what every source must share with the mixture (and so with each other)
SHARED = ("seq_len", "dtype", "vocab_size", "tokenizer_hash", "pad_id")


def is_mixture(location: str) -> bool:
    """A location names a mixture when it names a ``.json`` file (a shard set is a folder or base URL)."""
    return str(location).rstrip("/").endswith(".json")


def split_location(location: str) -> tuple[str, str]:
    """(folder or base URL, file name) of a mixture file."""
    location = str(location)
    if is_url(location) or storage.is_remote(location):
        base, _, name = location.rstrip("/").rpartition("/")
        return base, name
    path = Path(location)
    return str(path.parent), path.name


def resolve_source(base: str, location: str) -> str:
    """A source's location as written in the mixture, relative to the mixture's folder or URL."""
    if "://" in location:
        return location
    if is_url(base):  # a relative URL, or a path on the mixture's server (/v1/jobs/{id}/artifacts)
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
        raise ShardReadError(f"{where}: {exc}") from None
    return mixture, data, split_location(where)[0]


@dataclass
class OpenMixture:
    """A mixture read, with every source opened and checked: what reading its samples needs."""

    mixture: Mixture
    #: the sha256 of the mixture file's bytes (its identity)
    sha256: str
    schedule: Schedule
    sources: list[ShardSource]
    manifests: list[Manifest]


def open_mixture(location: str, headers: dict[str, str] | None = None,
                 bearer_token: str | None = None) -> OpenMixture:
    """Read the mixture at ``location`` (path or URL) and each source's manifest, refusing a source whose manifest
    is not the one the mixture pinned, whose sample count changed, or that does not share :data:`SHARED`."""
    mixture, data, base = read_mixture(location, headers, bearer_token)
    sources: list[ShardSource] = []
    manifests: list[Manifest] = []
    for s in mixture.sources:
        source = ShardSource(resolve_source(base, s.location), headers, bearer_token=bearer_token)
        manifest = source.manifest()
        if source.manifest_sha256 != s.manifest_sha256:
            raise ShardReadError(f"source {s.name}: {source.describe(MANIFEST)} has sha256 "
                                 f"{source.manifest_sha256[:16]}..., the mixture pinned {s.manifest_sha256[:16]}...: "
                                 "the shard set changed since the mixture was made")
        if manifest.total_samples != s.available_samples:
            raise ShardReadError(f"source {s.name}: {manifest.total_samples} samples, the mixture planned "
                                 f"{s.available_samples}")
        for key in SHARED:
            if getattr(manifest, key) != getattr(mixture, key):
                raise ShardReadError(f"source {s.name}: {key} differs from the mixture's")
        sources.append(source)
        manifests.append(manifest)
    return OpenMixture(mixture, hashlib.sha256(data).hexdigest(), mixture.schedule(), sources, manifests)


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
