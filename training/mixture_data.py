"""Read a mixture (``mixture.json``) as the loader reads a shard set: same split, resume and checks.

The mixture's epoch is its schedule (:mod:`pipeline.mixture_format`): ``T`` positions, each a draw from one
source. The rank and worker split, the window shuffle, ``state_dict`` and the equal batch count on every
rank are :mod:`training.data`'s, applied to those positions; each worker reads its block's draws source by
source, as :mod:`pipeline.mixture_source` reads a mixture (every shard fetched once per run and checked against
its source's manifest, whose own sha256 must be the one the mixture pinned). Every batch carries
``source_tokens``: the non-padding tokens it holds from each source, which the trainer logs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

from pipeline.mixture_source import is_mixture, mixture_samples, open_mixture
from pipeline.shard_format import Manifest, Sample
from training.data import (
    LoaderConfig,
    SequenceSplit,
    ShardLoader,
    _SplitStream,
    collate_flat,
    loader_config,
)

#: positions whose draws are computed at once (a worker's block is read chunk by chunk)
CHUNK = 1 << 16


class MixturePlan(SequenceSplit):
    """One epoch of the mixture for one rank: the schedule's positions, split as a shard set's are."""

    def __init__(self, manifest: Manifest, total: int, cfg: LoaderConfig, epoch: int, rank: int, world: int) -> None:
        self.manifest = manifest  # seq_len, pad_id and vocabulary (every source shares them)
        super().__init__(total, cfg, epoch, rank, world, what="the mixture")


class _MixtureStream(_SplitStream[MixturePlan]):
    def __init__(self, loader: MixtureLoader, plan: MixturePlan, start_batch: int) -> None:
        super().__init__(plan, start_batch, loader.prefetch)
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
        opened = open_mixture(location, headers, bearer_token)
        self.mixture, self.mixture_sha256, self.schedule = opened.mixture, opened.sha256, opened.schedule
        self.sources, self.manifests = opened.sources, opened.manifests
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
