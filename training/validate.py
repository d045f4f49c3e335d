"""The trainer's validation pass: loss and bits per byte over a held-out shard set, the same for any world size.

The set is read in its manifest's order (shards as listed, samples as stored, no shuffle) and cut into batches
of ``data.batch_size`` sequences; ``eval.max_batches`` keeps the first N of them. Each rank scores a contiguous
block of those batches and the sums (NLL, target tokens, their bytes) are all-reduced, so every rank gets the
figures one process would get over the same batches, whatever the world size. A rank with fewer batches
runs forward passes on a one-row filler batch that it does not count: under FSDP every forward is collective.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.mixture_source import is_mixture
from pipeline.shard_format import TOKENIZER, Manifest, Sample
from pipeline.shard_source import ShardReadError, ShardSource, read_runs
from pipeline.storage import join
from training.config import ConfigError, TrainConfig
from training.data import EpochPlan, LoaderConfig, collate
from training.parallel import DistInfo, say
from training.scoring import token_nll
from training.token_bytes import TokenBytesError, token_byte_lengths_of

MAX_TOKENIZER_BYTES = 256 << 20  # a tokenizer.json is read whole: a bound on a file we did not write
PREFETCH_SHARDS = 2


def validation_entry(manifest: Manifest) -> dict[str, Any] | None:
    """The manifest's ``validation`` entry (a job with ``output.validation`` writes it), or None."""
    entry = getattr(manifest, "validation", None)
    return entry if isinstance(entry, dict) and isinstance(entry.get("path"), str) else None


def eval_location(cfg: TrainConfig, manifest: Manifest, rank: int) -> str | None:
    """Where the validation set is, or None (eval off) with one line saying why."""
    if cfg.eval.every == 0:
        return None
    if cfg.eval.data:
        return cfg.eval.data
    data_path = cfg.data.path or ""
    entry = None if is_mixture(data_path) else validation_entry(manifest)
    if entry is None:
        say(rank, "eval: off: the data names no validation split (output.validation in its job); "
                  "set eval.data to a shard set")
        return None
    return join(data_path, entry["path"])


def _byte_lengths(locations: list[str], vocab: int, info: DistInfo) -> torch.Tensor | None:
    """Bytes per token id from the first ``tokenizer.json`` found at ``locations``, padded to ``vocab``, on the
    rank's device (looked up there for every batch)."""
    rank = info.rank
    for location in locations:
        try:
            text, where = ShardSource(location).fetch(TOKENIZER, MAX_TOKENIZER_BYTES)
        except ShardReadError:
            continue
        try:
            lengths = token_byte_lengths_of(text, where)
        except TokenBytesError as exc:
            say(rank, f"eval: no val_bpb: {exc}")
            return None
        out = np.zeros(max(vocab, len(lengths)), dtype=np.int64)
        out[: len(lengths)] = lengths
        return torch.from_numpy(out).to(info.device)
    say(rank, f"eval: no val_bpb: no {TOKENIZER} in {' or '.join(locations)}")
    return None


@dataclass
class Validator:
    """One validation set, planned once; :meth:`run` is collective (every rank calls it at the same step)."""

    source: ShardSource
    manifest: Manifest
    token_bytes: torch.Tensor | None
    batch_size: int
    batches: int  # the set's batches this pass scores, over all ranks
    every: int
    info: DistInfo

    @classmethod
    def open(cls, cfg: TrainConfig, info: DistInfo, train: Manifest, model_vocab: int,
             max_seq_len: int) -> Validator | None:
        location = eval_location(cfg, train, info.rank)
        if location is None:
            return None
        source = ShardSource(location, cfg.data.headers)
        try:
            manifest = source.manifest()
        except ShardReadError as exc:
            raise ConfigError(f"eval.data: {exc}") from None
        if manifest.tokenizer_hash != train.tokenizer_hash:
            raise ConfigError(f"eval.data: {location} was tokenized with another tokenizer than the training data")
        if manifest.seq_len > max_seq_len or manifest.vocab_size > model_vocab:
            raise ConfigError(f"eval.data: {location}: seq_len {manifest.seq_len} / vocabulary {manifest.vocab_size} "
                              f"exceed the model's {max_seq_len} / {model_vocab}")
        batches = math.ceil(manifest.total_samples / cfg.data.batch_size)
        if cfg.eval.max_batches is not None:
            batches = min(batches, cfg.eval.max_batches)
        # the same tokenizer (checked above by its hash): the set's own tokenizer.json, else the training data's
        places = [location] + ([cfg.data.path] if cfg.data.path and not is_mixture(cfg.data.path) else [])
        token_bytes = _byte_lengths(places, model_vocab, info)
        say(info.rank, f"eval: {batches} batch(es) of {location} every {cfg.eval.every} steps and at the end")
        return cls(source, manifest, token_bytes, cfg.data.batch_size, batches, cfg.eval.every, info)

    def due(self, step: int, max_steps: int) -> bool:
        return step % self.every == 0 or step == max_steps

    def _block(self) -> tuple[int, int]:
        """(first batch, number of batches) of this rank's contiguous share."""
        q, r = divmod(self.batches, self.info.world)
        rank = self.info.rank
        return rank * q + min(rank, r), q + (rank < r)

    def _my_batches(self) -> Iterator[dict[str, Any]]:
        first, count = self._block()
        lo = first * self.batch_size
        hi = min((first + count) * self.batch_size, self.manifest.total_samples)
        if hi <= lo:
            return
        plan = EpochPlan(self.manifest, LoaderConfig(self.batch_size, shuffle=False, remainder="wrap"), 0, 0, 1)
        m = self.manifest
        pending: list[Sample] = []
        for _, sample in read_runs(self.source, m.shards, plan.segments(lo, hi), PREFETCH_SHARDS):
            pending.append(sample)
            if len(pending) == self.batch_size:
                yield collate(pending, m.seq_len, m.pad_id, m.vocab_size)
                pending = []
        if pending:
            yield collate(pending, m.seq_len, m.pad_id, m.vocab_size)

    def _filler(self) -> dict[str, Any]:
        """One row of padding: a forward pass that scores nothing."""
        m = self.manifest
        sample = Sample("filler", np.full(1, m.pad_id, dtype=np.int64), np.ones(1, dtype=np.int64), None, {})
        return collate([sample], m.seq_len, m.pad_id, m.vocab_size)

    def run(self, model: torch.nn.Module) -> dict[str, Any]:
        """``val_loss`` (mean nats per target token), ``val_bpb`` (bits per UTF-8 byte of the targets; absent
        without a tokenizer), ``val_tokens``, ``val_bytes``, ``val_s``, over all ranks."""
        t0 = time.perf_counter()
        device = self.info.device
        sums = torch.zeros(3, dtype=torch.float64, device=device)
        done = 0
        for batch in self._my_batches():
            sums += torch.stack(token_nll(model, batch, self.token_bytes))
            done += 1
        rounds = math.ceil(self.batches / self.info.world)
        for _ in range(rounds - done):
            token_nll(model, self._filler())
        dist.all_reduce(sums)
        nll, tokens, nbytes = sums.tolist()
        out: dict[str, Any] = {"val_loss": nll / max(tokens, 1.0), "val_tokens": int(tokens)}
        if self.token_bytes is not None:
            out.update(val_bpb=nll / math.log(2) / max(nbytes, 1.0), val_bytes=int(nbytes))
        out["val_s"] = time.perf_counter() - t0
        return out
