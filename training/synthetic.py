"""Synthetic test data for loader benchmarks and loader tests: random packed sequences, and a server for a folder.

Training runs read shard sets the pipeline made; these exist so the loader can be measured and tested at shapes a
small generated corpus cannot reach (many shards, uneven counts, long sequences) without a Ray run. They are
written by the one shard-set writer, ``pipeline.output.shard_set.write_shard_set(folder, random_packed(...), ...,
**SYNTHETIC)``: this module only makes the data (``training`` imports nothing of ``pipeline`` but the contract).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

Packed = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # input_ids, doc_lens, loss_mask
#: what a synthetic set's manifest names as its spec and tokenizer, and every sample's ``meta.json``
SYNTHETIC: dict[str, Any] = {"spec_hash": "synthetic", "tokenizer_hash": "synthetic", "meta": {"synthetic": True}}


def random_packed(n: int, seq_len: int, vocab_size: int, seed: int = 0, min_doc: int = 4,
                  max_doc: int | None = None, fill: float = 0.95, with_mask: bool = False) -> Iterator[Packed]:
    """``n`` packed sequences of random documents filling about ``fill`` of ``seq_len``."""
    rng = np.random.default_rng(seed)
    max_doc = max_doc or seq_len
    for _ in range(n):
        target = int(rng.integers(max(1, int(seq_len * fill * 0.9)), int(seq_len * fill) + 1))
        lens: list[int] = []
        while sum(lens) < target:
            lens.append(min(int(rng.integers(min_doc, max_doc + 1)), target - sum(lens)))
        total = sum(lens)
        ids = rng.integers(0, vocab_size, total)
        mask = None
        if with_mask:  # a prompt then a response in every document
            mask = np.concatenate([np.r_[np.zeros(n_ // 2), np.ones(n_ - n_ // 2)] for n_ in lens])
        yield ids, np.array(lens, dtype=np.int32), mask


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
