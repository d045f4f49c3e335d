"""Synthetic shard sets that follow the shard contract, for loader benchmarks and loader tests.

Training runs read shard sets the pipeline made; these exist so the loader can be measured and
tested at shapes a small generated corpus cannot reach (many shards, uneven counts, long
sequences) without a Ray run. Written exactly as the shard writer does: WebDataset tar members from
``shard_format.encode_sample`` with fixed metadata, sha256 in a manifest written last.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from pipeline import shard_format as fmt  # the shard contract, which training shares with the writer
from pipeline import storage  # ... and its one atomic write

Packed = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # input_ids, doc_lens, loss_mask


def random_packed(n: int, seq_len: int, vocab_size: int, seed: int = 0, min_doc: int = 4,
                  max_doc: int | None = None, fill: float = 0.95, with_mask: bool = False) -> Iterator[Packed]:
    """``n`` packed sequences of random documents filling about ``fill`` of ``seq_len``."""
    rng = np.random.default_rng(seed)
    max_doc = max_doc or seq_len
    for _ in range(n):
        target = int(rng.integers(max(1, int(seq_len * fill * 0.9)), int(seq_len * fill) + 1))
        lens: list[int] = []
        while sum(lens) < target:
            lens.append(int(min(rng.integers(min_doc, max_doc + 1), target - sum(lens))))
        total = sum(lens)
        ids = rng.integers(0, vocab_size, total)
        mask = None
        if with_mask:  # a prompt then a response in every document
            mask = np.concatenate([np.r_[np.zeros(n_ // 2), np.ones(n_ - n_ // 2)] for n_ in lens])
        yield ids, np.array(lens, dtype=np.int32), mask


def write_shard_set(out_dir: str | os.PathLike, sequences: Iterable[Packed], *, seq_len: int, vocab_size: int,
                    samples_per_shard: int, pad_id: int = 0, eos_id: int | None = None,
                    bos_id: int | None = None, spec_hash: str = "synthetic", tokenizer_hash: str = "synthetic",
                    meta: dict | None = None) -> fmt.Manifest:
    """Write ``sequences`` as shards of ``samples_per_shard`` (the last one may be partial); ``meta`` is
    every sample's ``meta.json`` (``training.mixture_materialize`` writes a mixture with it too)."""
    out = Path(out_dir)
    dtype = fmt.token_dtype(vocab_size)
    shards: list[fmt.ShardInfo] = []
    pending: list[dict] = []
    tokens = 0
    has_mask = False
    index = 0

    def flush(partial: bool) -> None:
        nonlocal pending, tokens
        data = fmt.tar_bytes(pending)
        name = fmt.shard_name(len(shards))
        storage.write_bytes(str(out / name), data)
        shards.append(fmt.ShardInfo(name, len(pending), tokens, fmt.sha256_bytes(data), len(data), partial))
        pending, tokens = [], 0

    for ids, lens, mask in sequences:
        if len(ids) > seq_len:
            raise ValueError(f"sequence of {len(ids)} tokens exceeds seq_len {seq_len}")
        has_mask = has_mask or mask is not None
        pending.append(fmt.encode_sample(index, np.asarray(ids, dtype=dtype), lens, mask, meta or {"synthetic": True}))
        tokens += len(ids)
        index += 1
        if len(pending) == samples_per_shard:
            flush(partial=False)
    if pending:
        flush(partial=True)
    manifest = fmt.Manifest(spec_hash=spec_hash, tokenizer_hash=tokenizer_hash, seq_len=seq_len, dtype=dtype.name,
                            vocab_size=vocab_size, samples_per_shard=samples_per_shard, bos_id=bos_id, eos_id=eos_id,
                            pad_id=pad_id, has_loss_mask=has_mask, shards=shards)
    storage.write_bytes(str(out / fmt.MANIFEST), manifest.to_json().encode())
    return manifest


class QuietHandler(SimpleHTTPRequestHandler):
    """Serves files without logging each request; subclass it to make a test server misbehave."""

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_directory(directory: Path, handler: type[SimpleHTTPRequestHandler] = QuietHandler) -> Iterator[str]:
    """A real HTTP server on loopback serving ``directory`` (a shard set), for loader tests and benches."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
