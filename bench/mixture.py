"""Mixture loader: tokens/s of a 3-source mixture against the same shards read as one shard set, and the
worst share error over every window of 1,000 samples.

Three synthetic shard sets (seq_len 2048, vocab 32k) are written; the peer is one shard set listing all of
their shards (the same files, one manifest), read by ``training.data.ShardLoader``; ours is a mixture of the
three (``tokenmill mix`` with weights in proportion to their sizes, so each is read about once: the same
tokens decoded) read by ``training.mixture_data.MixtureLoader``. Goals: ratio >= 0.9, worst window error of
any source's share of non-padding tokens <= 0.01 (over the mixture's order, every 1,000-sample window).
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# the repo root instead of bench/ on sys.path, so `pipeline`, `training` and `bench` import
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
import yaml

from bench.common import emit_json
from pipeline.mixture_source import mixture_samples
from pipeline.output.shard_set import write_shard_set
from pipeline.shard_format import MANIFEST, Manifest
from service.commands import mix
from training.data import ShardLoader
from training.mixture_data import MixtureLoader
from training.synthetic import SYNTHETIC, random_packed

GOAL_RATIO, GOAL_SHARE_ERROR, WINDOW = 0.9, 0.01, 1000
SOURCES = {"web": 0.6, "code": 0.25, "books": 0.15}


def build(root: Path, samples: int, seq_len: int, per_shard: int) -> tuple[Path, Path]:
    """(mixture file, one shard set over the same shard files)."""
    combined = root / "combined"
    (combined / "shards").mkdir(parents=True)
    shards = []
    for seed, (name, weight) in enumerate(SOURCES.items()):
        n = round(samples * weight / per_shard) * per_shard  # whole shards: the combined set has one partial
        write_shard_set(root / name, random_packed(n, seq_len, 32000, seed=seed, min_doc=50, max_doc=seq_len),
                        seq_len=seq_len, vocab_size=32000, samples_per_shard=per_shard, **SYNTHETIC)
        for s in Manifest.load(root / name).shards:
            renamed = f"shards/{name}-{Path(s.name).name}"
            os.link(root / name / s.name, combined / renamed)
            s.name = renamed
            shards.append(s)
    manifest = Manifest.load(root / "web")
    manifest.shards = shards
    (combined / MANIFEST).write_text(manifest.to_json())
    spec = root / "mix.yaml"
    spec.write_text(yaml.safe_dump({"name": "bench", "sources": [
        {"name": n, "path": n, "weight": w} for n, w in SOURCES.items()]}))
    out = root / "mixture.json"
    if mix.main([str(spec), "-o", str(out)]) != 0:
        raise SystemExit("tokenmill mix failed")
    return out, combined


def rate(loader: ShardLoader) -> tuple[int, float]:
    t0 = time.perf_counter()
    tokens = sum(b["tokens"] for b in loader.epoch_batches())
    return tokens, time.perf_counter() - t0


def worst_window_error(mixture_file: Path) -> float:
    loader = MixtureLoader(str(mixture_file), 1, num_workers=0, shuffle=False)
    pairs = [(i, len(s.input_ids)) for (i, _), s in mixture_samples(
        loader.sources, loader.manifests, loader.mixture, 0, loader.schedule.total)]
    src = np.array([i for i, _ in pairs])
    tok = np.array([t for _, t in pairs], dtype=np.float64)
    target = np.array([s.target_share for s in loader.mixture.sources])
    per = np.stack([np.where(src == i, tok, 0.0) for i in range(len(target))])
    csum = np.concatenate([np.zeros((len(target), 1)), np.cumsum(per, axis=1)], axis=1)
    window = csum[:, WINDOW:] - csum[:, :-WINDOW]  # tokens per source in every window of WINDOW samples
    share = window / window.sum(axis=0, keepdims=True)
    return float(np.abs(share - target[:, None]).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=6144, help="packed sequences over the three sources")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--per-shard", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        mixture_file, combined = build(root, args.samples, args.seq_len, args.per_shard)
        runs: dict[str, list[float]] = {"mixture": [], "one shard set": []}
        tokens: dict[str, int] = {}
        for _ in range(args.repeat):  # interleaved, best of each: the machine is shared
            for name, make in (("mixture", lambda: MixtureLoader(str(mixture_file), args.batch,
                                                                  num_workers=args.workers)),
                               ("one shard set", lambda: ShardLoader(str(combined), args.batch,
                                                                     num_workers=args.workers))):
                n, secs = rate(make())
                tokens[name] = n
                runs[name].append(n / secs)
        error = worst_window_error(mixture_file)
        shutil.rmtree(root / "combined")
    ours, peer = max(runs["mixture"]), max(runs["one shard set"])
    print(f"{'loader':<16}{'tokens':>12}{'best tokens/s':>16}  (workers {args.workers}, batch {args.batch}, "
          f"seq_len {args.seq_len}, best of {args.repeat})")
    for name, values in runs.items():
        print(f"{name:<16}{tokens[name]:>12,}{max(values) / 1e6:>14.2f}M")
    print(f"ratio {ours / peer:.3f} (goal >= {GOAL_RATIO}); worst {WINDOW}-sample window share error "
          f"{error:.4f} (goal <= {GOAL_SHARE_ERROR}); {os.cpu_count()} CPU cores")
    emit_json({"bench": "mixture", "tokens_per_s": round(ours), "peer_tokens_per_s": round(peer),
               "ratio": round(ours / peer, 3), "max_share_error": round(error, 5),
               "goal": {"ratio": GOAL_RATIO, "max_share_error": GOAL_SHARE_ERROR}})


if __name__ == "__main__":
    main()
