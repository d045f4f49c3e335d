"""Stream a tokenmill shard set into training batches: same count on every rank, exact mid-epoch resume.

Where training runs hang or repeat data is the loader: ranks that run out of samples at different
steps, workers that read the same samples, resumes that restart the epoch. This loader avoids all
three by planning each epoch up front from the manifest alone:

1. the shards are put in an order drawn from ``(seed, epoch)``; their samples, in that order, form
   the epoch's sequence of ``N`` samples;
2. each rank gets a contiguous slice of ``N // world`` samples (``remainder="drop"``) or
   enough whole batches to cover every sample, wrapping round to the start (``"wrap"``),
   so every rank runs exactly the same number of steps;
3. each DataLoader worker gets a contiguous block of the rank's batches (it reads only the shards
   under its block), and the DataLoader's round-robin over workers fixes the batch order;
4. within a worker, samples are shuffled inside windows of ``shuffle_window`` samples, each window
   permuted by its own seeded generator, so any position can be re-created without replaying.

The state is just ``(epoch, batches consumed)``; resuming rebuilds the plan and each worker skips to
its position. Every shard is verified against the manifest's sha256 before a sample is used, and
only ``.npy`` / ``.json`` members are ever decoded (``pipeline.shard_format``).

Nothing read is trusted: the manifest goes through the one strict schema the writer also applies
(``Manifest.validate``), every read is bounded (the manifest by a fixed cap, a shard by its own
``bytes``), member headers are checked before anything is allocated, and HTTP credentials never
follow a redirect to another origin: the reading is the shard contract's (:mod:`pipeline.shard_source`), shared
with ``tokenmill mix``. Every failure is a :class:`LoaderError`.

Streaming from the tokenmill service: the base URL is an artifacts URL (``/v1/jobs/{id}/artifacts``,
``/v1/schedules/{id}/versions/{n|latest}/artifacts``) and the API key comes from ``headers``,
``bearer_token`` or the ``TOKENMILL_API_KEY`` environment variable; ``latest`` is resolved once, when the
manifest is read, so a run never mixes two versions.
"""

from __future__ import annotations

import gc
import hashlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import numpy as np
import torch

from pipeline.shard_format import MANIFEST, Manifest, Sample, ShardFormatError
from pipeline.shard_source import ShardReadError, ShardSource, read_runs

IGNORE_INDEX = -100
#: the loader's one error: a shard set that cannot be read (:mod:`pipeline.shard_source`) or a plan that cannot be made
LoaderError = ShardReadError


def manifest_fingerprint(manifest: Manifest) -> str:
    return hashlib.sha256(manifest.to_json().encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class LoaderConfig:
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    shuffle_window: int = 4096
    remainder: Literal["drop", "wrap"] = "drop"
    num_workers: int = 2


class SequenceSplit:
    """Which positions of an epoch's sequence of ``total`` samples each (rank, worker) reads: the split a
    shard set (:class:`EpochPlan`) and a mixture (``training.mixture_data``) share."""

    manifest: Manifest  # the batches' seq_len, pad_id and vocabulary: each kind of plan sets it

    def __init__(self, total: int, cfg: LoaderConfig, epoch: int, rank: int, world: int,
                 what: str = "the shard set") -> None:
        if not 0 <= rank < world:
            raise LoaderError(f"rank {rank} outside world size {world}")
        self.cfg, self.epoch, self.rank, self.world, self.total = cfg, epoch, rank, world, total
        if cfg.remainder == "drop":
            per_rank = self.total // world
        else:  # whole batches that cover every sample, positions wrapping round to the start
            per_rank = -(-self.total // (world * cfg.batch_size)) * cfg.batch_size
        self.batches = per_rank // cfg.batch_size
        if self.batches == 0:
            raise LoaderError(f"{what} has {self.total} samples: too few for {world} rank(s) x "
                              f"batch size {cfg.batch_size}")
        self.rank_start = rank * per_rank
        self.workers = max(1, cfg.num_workers)

    def worker_batches(self, worker: int) -> tuple[int, int]:
        """(first batch, number of batches) of the contiguous block a worker produces."""
        q, r = divmod(self.batches, self.workers)
        count = q + (worker < r)
        return worker * q + min(worker, r), count

    def consumed_per_worker(self, consumed: int) -> list[int]:
        """How many batches each worker had produced when the rank had consumed ``consumed``: the
        DataLoader takes one batch from each still-active worker in turn."""
        q, r = divmod(self.batches, self.workers)
        w = self.workers
        if consumed <= q * w:
            full, extra = divmod(consumed, w)
            return [full + (i < extra) for i in range(w)]
        return [q + (i < consumed - q * w) for i in range(w)]


class EpochPlan(SequenceSplit):
    """Which samples each (rank, worker) reads in one epoch, from the manifest alone."""

    def __init__(self, manifest: Manifest, cfg: LoaderConfig, epoch: int, rank: int, world: int) -> None:
        self.manifest = manifest
        counts = np.array([s.samples for s in manifest.shards], dtype=np.int64)
        self.order = (np.random.default_rng([cfg.seed, epoch]).permutation(len(counts))
                      if cfg.shuffle else np.arange(len(counts)))
        self.starts = np.concatenate([[0], np.cumsum(counts[self.order])])
        super().__init__(int(self.starts[-1]), cfg, epoch, rank, world)

    def locate(self, position: int) -> tuple[int, int]:
        """Epoch-sequence position (wrapping) -> (index into manifest.shards, sample offset)."""
        pos = position % self.total
        i = int(np.searchsorted(self.starts, pos, side="right")) - 1
        return int(self.order[i]), pos - int(self.starts[i])

    def segments(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """Positions ``[lo, hi)`` as runs ``(shard index, first offset, end offset)`` in read order."""
        out = []
        pos = lo
        while pos < hi:
            shard, off = self.locate(pos)
            take = min(self.manifest.shards[shard].samples - off, hi - pos)
            out.append((shard, off, off + take))
            pos += take
        return out


# --------------------------------------------------------------------------------------- batching


FIELDS = ("input_ids", "labels", "position_ids", "seq_ids")  # the per-token int32 planes of a batch


def collate_flat(samples: list[Sample], seq_len: int, pad_id: int, vocab_size: int | None = None,
                 keys: list[str] | None = None) -> dict[str, Any]:
    """Pad packed samples to ``seq_len`` and derive what the model needs, as ONE int32 buffer.

    ``labels[t]`` is the next token when it belongs to the same document and carries loss
    (``loss_mask`` 1), else ``IGNORE_INDEX``; positions restart at 0 in every document; the padding
    of a row is its own segment (it attends only to padding and is never a label). ``cu_seqlens`` /
    ``seq_ids`` describe the segments over the flattened batch for the attention kernels.
    Everything per token travels in one int32 buffer (the planes of ``FIELDS`` then ``cu_seqlens``):
    a DataLoader worker hands over one shared-memory tensor per batch instead of five int64 ones,
    which is what bounded throughput (see bench/loader.py); :func:`unflatten` makes the views.
    """
    b = len(samples)
    planes = np.empty((len(FIELDS), b, seq_len), dtype=np.int32)
    input_ids, labels, positions, seq_ids = planes
    input_ids.fill(pad_id)
    labels.fill(IGNORE_INDEX)
    seg_lens: list[np.ndarray] = []
    tokens = 0
    for i, s in enumerate(samples):
        name = keys[i] if keys else s.key
        ids = np.asarray(s.input_ids)
        n = len(ids)
        dl = np.asarray(s.doc_lens, dtype=np.int64)
        if n == 0 or n > seq_len or int(dl.sum()) != n or (dl < 0).any():
            raise LoaderError(f"sample {name}: {n} tokens, doc_lens sum {int(dl.sum())}, seq_len {seq_len}")
        if vocab_size is not None and int(ids.max()) >= vocab_size:
            raise LoaderError(f"sample {name}: token id {int(ids.max())} >= vocab size {vocab_size}")
        dl = dl[dl > 0]
        tokens += n
        input_ids[i, :n] = ids
        row = labels[i]
        row[: n - 1] = ids[1:]
        ends = np.cumsum(dl) - 1
        row[ends] = IGNORE_INDEX  # the last token of a document predicts nothing
        if s.loss_mask is not None:
            if len(s.loss_mask) != n:
                raise LoaderError(f"sample {name}: loss_mask has {len(s.loss_mask)} entries for {n} tokens")
            row[: n - 1][np.asarray(s.loss_mask[1:]) == 0] = IGNORE_INDEX
        positions[i, :n] = np.arange(n) - np.repeat(ends - dl + 1, dl)
        positions[i, n:] = np.arange(seq_len - n)
        seg_lens.append(dl)
        if n < seq_len:
            seg_lens.append(np.array([seq_len - n], dtype=np.int64))
    lens = np.concatenate(seg_lens)
    seq_ids.reshape(-1)[:] = np.repeat(np.arange(len(lens), dtype=np.int32), lens)
    flat = np.empty(planes.size + len(lens) + 1, dtype=np.int32)
    flat[: planes.size] = planes.reshape(-1)
    flat[planes.size] = 0
    np.cumsum(lens, out=flat[planes.size + 1:])
    return {
        "flat": torch.from_numpy(flat),
        "shape": (b, seq_len),
        "max_seqlen": int(lens.max()),
        "tokens": tokens,
        "keys": list(keys) if keys else [s.key for s in samples],
    }


def unflatten(wire: dict[str, Any]) -> dict[str, Any]:
    """Views of a :func:`collate_flat` buffer: int32 ``[B, S]`` planes and ``cu_seqlens``."""
    flat = wire["flat"]
    b, s = wire["shape"]
    n = b * s
    out = {name: flat[i * n:(i + 1) * n].view(b, s) for i, name in enumerate(FIELDS)}
    out["cu_seqlens"] = flat[len(FIELDS) * n:]
    out.update({k: wire[k] for k in ("max_seqlen", "tokens", "keys", "source_tokens") if k in wire})
    return out


def collate(samples: list[Sample], seq_len: int, pad_id: int, vocab_size: int | None = None,
            keys: list[str] | None = None) -> dict[str, Any]:
    """:func:`collate_flat` then :func:`unflatten`: the batch as the trainer sees it."""
    return unflatten(collate_flat(samples, seq_len, pad_id, vocab_size, keys))


PlanT = TypeVar("PlanT", bound=SequenceSplit)


class _SplitStream(torch.utils.data.IterableDataset, Generic[PlanT]):
    """One epoch of one rank, from a starting batch; each DataLoader worker produces its block of the plan's
    positions, which :meth:`_samples` reads (a shard set's or a mixture's)."""

    def __init__(self, plan: PlanT, start_batch: int, prefetch: int) -> None:
        super().__init__()
        self.plan, self.start_batch, self.prefetch = plan, start_batch, prefetch
        self.manifest = plan.manifest  # seq_len, pad_id and vocabulary of the batches

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        nworkers = info.num_workers if info is not None else 1
        plan = self.plan
        if nworkers != plan.workers:
            raise LoaderError(f"planned for {plan.workers} workers, running with {nworkers}")
        # The DataLoader always asks its worker 0 first; after a resume the next batch may be due from
        # another planned worker, so DataLoader worker i plays planned worker (i + start) mod W.
        worker = ((info.id if info is not None else 0) + self.start_batch) % nworkers
        first, count = plan.worker_batches(worker)
        skip = plan.consumed_per_worker(self.start_batch)[worker]
        if skip >= count:
            return
        yield from self._batches(worker, first, count, skip)

    def _batches(self, worker: int, first: int, count: int, skip: int) -> Iterator[dict[str, Any]]:
        plan, cfg = self.plan, self.plan.cfg
        bs, win = cfg.batch_size, max(cfg.shuffle_window, 1)
        lo = plan.rank_start + first * bs
        hi = lo + count * bs
        start = skip * bs  # offset into this worker's stream
        w0 = start // win
        read_from = lo + w0 * win
        reader = self._samples(read_from, hi)
        pending: list[tuple[str, Sample]] = []
        j = w0
        while True:
            size = min(win, hi - (lo + j * win))
            if size <= 0:
                break
            window = [next(reader) for _ in range(size)]
            if cfg.shuffle:
                rng = np.random.default_rng([cfg.seed, plan.epoch, plan.rank, worker, j])
                window = self._permute(window, rng)
            if j == w0:
                window = window[start - w0 * win:]
            for item in window:
                pending.append(item)
                if len(pending) == bs:
                    yield self._collate(pending)
                    pending = []
            j += 1

    def _permute(self, window: list[tuple[Any, Sample]], rng: np.random.Generator) -> list[tuple[Any, Sample]]:
        return [window[k] for k in rng.permutation(len(window))]

    def _samples(self, lo: int, hi: int) -> Iterator[tuple[Any, Sample]]:
        """(tag, sample) of the epoch's positions ``[lo, hi)`` in order."""
        raise NotImplementedError

    def _collate(self, pending: list[tuple[Any, Sample]]) -> dict[str, Any]:
        m = self.manifest
        return collate_flat([s for _, s in pending], m.seq_len, m.pad_id, m.vocab_size, [k for k, _ in pending])


class _EpochStream(_SplitStream[EpochPlan]):
    """A shard set's epoch: the positions read shard by shard from ``source``."""

    def __init__(self, source: ShardSource, plan: EpochPlan, start_batch: int, prefetch: int) -> None:
        super().__init__(plan, start_batch, prefetch)
        self.source = source

    def _samples(self, lo: int, hi: int) -> Iterator[tuple[Any, Sample]]:
        """(key, sample) of the epoch's positions ``[lo, hi)`` in order."""
        return read_runs(self.source, self.plan.manifest.shards, self.plan.segments(lo, hi), self.prefetch)


# ----------------------------------------------------------------------------------------- loader


def loader_config(batch_size: int, seed: int, shuffle: bool, shuffle_window: int,
                  remainder: Literal["drop", "wrap"], num_workers: int) -> LoaderConfig:
    if batch_size < 1:
        raise LoaderError(f"batch_size must be >= 1, got {batch_size}")
    if remainder not in ("drop", "wrap"):
        raise LoaderError(f"remainder must be 'drop' or 'wrap', got {remainder!r}")
    return LoaderConfig(batch_size, seed, shuffle, shuffle_window, remainder, max(0, num_workers))


class ShardLoader:
    """Batches for one rank, epoch after epoch, with ``state_dict`` / ``load_state_dict``."""

    def __init__(self, location: str, batch_size: int, *, rank: int = 0, world: int = 1, seed: int = 0,
                 shuffle: bool = True, shuffle_window: int = 4096, num_workers: int = 2,
                 remainder: Literal["drop", "wrap"] = "drop", headers: dict[str, str] | None = None,
                 prefetch_shards: int = 2, pin_memory: bool = False, max_epochs: int | None = None,
                 manifest: Manifest | None = None, bearer_token: str | None = None) -> None:
        cfg = loader_config(batch_size, seed, shuffle, shuffle_window, remainder, num_workers)
        self.source = ShardSource(location, headers, bearer_token=bearer_token)
        self.manifest = manifest or self.source.manifest()
        try:
            self.manifest.validate()  # a Manifest built in code gets the schema a loaded one got
        except ShardFormatError as exc:
            raise LoaderError(f"{self.source.describe(MANIFEST)}: invalid manifest: {exc}") from None
        if not self.manifest.shards:
            raise LoaderError(f"{self.source.describe(MANIFEST)}: the manifest lists no shards")
        self._configure(cfg, rank, world, prefetch_shards, pin_memory, max_epochs)

    def _configure(self, cfg: LoaderConfig, rank: int, world: int, prefetch_shards: int, pin_memory: bool,
                   max_epochs: int | None) -> None:
        self.cfg = cfg
        self.rank, self.world = rank, world
        self.prefetch = max(1, prefetch_shards)
        self.pin_memory = pin_memory
        self.max_epochs = max_epochs
        self.epoch = 0
        self.batch = 0
        self.batches_per_epoch = self.plan(0).batches  # raises early when the set is too small

    def plan(self, epoch: int) -> SequenceSplit:
        return EpochPlan(self.manifest, self.cfg, epoch, self.rank, self.world)

    def _stream(self, plan: Any, start_batch: int) -> torch.utils.data.IterableDataset:
        return _EpochStream(self.source, plan, start_batch, self.prefetch)

    def fingerprint(self) -> str:
        """What a checkpoint's loader state must have been planned over."""
        return manifest_fingerprint(self.manifest)

    def _epoch_loader(self, plan: Any, start_batch: int) -> torch.utils.data.DataLoader:
        stream = self._stream(plan, start_batch)
        nw = self.cfg.num_workers
        return torch.utils.data.DataLoader(
            stream, batch_size=None, num_workers=nw, pin_memory=self.pin_memory,
            prefetch_factor=4 if nw else None, persistent_workers=False,
            worker_init_fn=_worker_init if nw else None,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Endless (or ``max_epochs``) stream of batches; the state advances as batches are taken."""
        while self.max_epochs is None or self.epoch < self.max_epochs:
            plan = self.plan(self.epoch)
            if self.batch < plan.batches:
                it = iter(self._epoch_loader(plan, self.batch))
                try:
                    for wire in it:
                        self.batch += 1
                        yield unflatten(wire)
                finally:
                    # Stop the workers now: left to the garbage collector (an exception's traceback
                    # keeps the iterator alive), their queues can be torn down first and each worker
                    # then costs a 5 s join timeout.
                    shutdown = getattr(it, "_shutdown_workers", None)
                    if shutdown is not None:
                        shutdown()
                    del it
            if self.batch != plan.batches:  # a worker died without an error: never train on a short epoch
                raise LoaderError(f"epoch {self.epoch} ended after {self.batch} of {plan.batches} batches")
            self.epoch += 1
            self.batch = 0

    def epoch_batches(self) -> Iterator[dict[str, Any]]:
        """The rest of the current epoch only (the next one when the current is finished)."""
        if self.batch >= self.batches_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
        for batch in self:
            yield batch
            if self.batch == self.batches_per_epoch:
                return

    def state_dict(self) -> dict[str, Any]:
        c = self.cfg
        return {"epoch": self.epoch, "batch": self.batch, "seed": c.seed, "shuffle": c.shuffle,
                "shuffle_window": c.shuffle_window, "remainder": c.remainder, "batch_size": c.batch_size,
                "num_workers": c.num_workers, "rank": self.rank, "world": self.world,
                "manifest": self.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly where ``state`` was taken; refuses a state from another plan."""
        mine = self.state_dict()
        must_match = ["seed", "shuffle", "shuffle_window", "remainder", "batch_size", "world", "rank",
                      "manifest"]
        between_epochs = state.get("batch", 0) in (0, self.batches_per_epoch)
        if not between_epochs:
            must_match.append("num_workers")  # the order of batches inside an epoch depends on it
        diff = [f"{k} {state.get(k)!r} -> {mine[k]!r}" for k in must_match if state.get(k) != mine[k]]
        if diff:
            raise LoaderError("cannot resume the loader: the checkpoint was made with different settings: "
                              + ", ".join(diff))
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


def _worker_init(_worker_id: int) -> None:
    """torchrun sends SIGTERM to the whole process group: a worker killed by it would crash the rank
    (SIGCHLD -> RuntimeError) before the trainer checkpoints; the trainer handles the signal. A
    worker is forked from a trainer that runs with automatic GC off: the worker collects as usual."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    gc.enable()
