"""Shard-loader throughput: tokens/s per DataLoader worker, from a directory and over HTTP.

Measures ``training.data.ShardLoader`` (sha256 check of every shard, decode, per-rank/worker split,
windowed shuffle, padding, labels, positions and segment tables) against a plain WebDataset pipeline
over the same shards (no checksum, no shuffle, same decoding and collation). The goal is >= 5M
tokens/s per worker, so that a handful of workers feed any GPU. The loader's cost depends on the
shape of the data (sequence length, documents per sequence), not on token values, so without
``--data`` it writes a synthetic shard set at seq_len 2048 with a 32k vocabulary.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# the repo root instead of bench/ on sys.path, so `pipeline`, `training` and `bench` import
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import os
import tempfile
import time

from bench.common import emit_json
from pipeline.output.shard_set import write_shard_set
from pipeline.shard_format import Manifest, Sample, npy_load
from training.data import ShardLoader, collate
from training.synthetic import SYNTHETIC, random_packed, serve_directory

GOAL = 5_000_000




def run_ours(location: str, workers: int, batch: int) -> tuple[int, float]:
    loader = ShardLoader(location, batch, num_workers=workers, shuffle_window=4096)
    t0 = time.perf_counter()
    tokens = sum(b["tokens"] for b in loader.epoch_batches())
    return tokens, time.perf_counter() - t0


def run_peer(location: str, manifest: Manifest, workers: int, batch: int) -> tuple[int, float]:
    """WebDataset's own pipeline: shard list -> tar stream -> group by key -> decode -> batch."""
    import torch
    import webdataset as wds

    urls = [f"{location}/{s.name}" for s in manifest.shards]
    if not location.startswith("http"):
        urls = [str(Path(location) / s.name) for s in manifest.shards]

    def to_sample(s: dict) -> Sample:
        return Sample(s["__key__"], npy_load(s["input_ids.npy"]), npy_load(s["doc_lens.npy"]), None, {})

    def collation(samples: list[Sample]) -> dict:
        return collate(samples, manifest.seq_len, manifest.pad_id)

    ds = (wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node, empty_check=False)
          .map(to_sample).batched(batch, collation_fn=collation, partial=False))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                         prefetch_factor=4 if workers else None)
    t0 = time.perf_counter()
    tokens = sum(b["tokens"] for b in loader)
    return tokens, time.perf_counter() - t0


def best(fn, repeat: int) -> tuple[int, float]:
    runs = [fn() for _ in range(repeat)]
    return min(runs, key=lambda r: r[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, help="a shard set directory (default: synthetic, written to a temp dir)")
    ap.add_argument("--samples", type=int, default=8192, help="synthetic: packed sequences")
    ap.add_argument("--seq-len", type=int, default=2048, help="synthetic: sequence length")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, nargs="*", default=[0, 1],
                    help="DataLoader workers to try; 0 = decoding in the training process itself")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "shards"
            write_shard_set(data, random_packed(args.samples, args.seq_len, 32000, seed=0, min_doc=50,
                                                max_doc=args.seq_len), seq_len=args.seq_len,
                            vocab_size=32000, samples_per_shard=256, **SYNTHETIC)
        m = Manifest.load(data)
        print(f"shard set: {len(m.shards)} shards, {m.total_samples} samples, {m.total_tokens / 1e6:.1f}M tokens, "
              f"seq_len {m.seq_len}, {sum(s.bytes for s in m.shards) / 2**20:.0f} MiB")
        print(f"{'loader':<12}{'source':<8}{'workers':>8}{'tokens/s':>14}{'per worker':>14}")
        figures: dict[str, float] = {}
        with serve_directory(data) as url:
            for source, location in (("local", str(data)), ("http", url)):
                for w in args.workers:
                    for name, fn in (("tokenmill", lambda loc=location, w=w: run_ours(loc, w, args.batch)),
                                     ("webdataset", lambda loc=location, w=w: run_peer(loc, m, w, args.batch))):
                        tokens, secs = best(fn, args.repeat)
                        rate = tokens / secs
                        per = rate / max(w, 1)
                        figures[f"{name}_{source}_w{w}"] = per
                        print(f"{name:<12}{source:<8}{w:>8}{rate / 1e6:>12.2f}M{per / 1e6:>12.2f}M")
    # "per worker": one worker process handing batches to the training process (workers=1), the
    # setting the goal is about; workers=0 shows the decode path alone, without the hand-off.
    w = 1 if 1 in args.workers else max(args.workers)
    local, http = figures[f"tokenmill_local_w{w}"], figures[f"tokenmill_http_w{w}"]
    peer = figures[f"webdataset_local_w{w}"]
    print(f"({os.cpu_count()} CPU cores; per-worker figures need a core per worker plus one for the trainer)")
    emit_json({
        "bench": "loader",
        "workers": w,
        "tokens_per_s_per_worker_local": round(local),
        "tokens_per_s_per_worker_http": round(http),
        "decode_only_tokens_per_s_local": round(figures.get("tokenmill_local_w0", 0)),
        "decode_only_tokens_per_s_http": round(figures.get("tokenmill_http_w0", 0)),
        "peer_tokens_per_s_per_worker_local": round(peer),
        "ratio": round(local / peer, 2),
        "min_tokens_per_s_per_worker": round(min(local, http)),
        "goal": GOAL,
    })

if __name__ == "__main__":
    main()
