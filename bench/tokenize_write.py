"""Tokenize+pack throughput of the pipeline against raw `tokenizers` encode_batch, same text, same run.

The pipeline side is what the job runs per batch: DocEncoder (EOS added, segments honoured) then the
best-fit packer and the shard writer (to a temp folder). The peer is `Tokenizer.encode_batch` on the
same texts with the same tokenizer. Ratio = pipeline tokens/s / peer tokens/s (goal >= 0.8). The
pipeline calls ``encode_batch_fast`` (no offsets); the ratio against that call alone is printed too,
so the cost of packing and writing shards is visible on its own.
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# the repo root instead of bench/ on sys.path, so `pipeline`, `training` and `bench` import
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import tempfile
import time

from bench.common import default_paths, emit_json, read_texts  # noqa: E402
from pipeline.output.shard_set import ShardSetWriter  # noqa: E402
from pipeline.packing import BestFitPacker  # noqa: E402
from pipeline.shard_format import token_dtype  # noqa: E402
from pipeline.spec import TokenizerSpec  # noqa: E402
from pipeline.tokenize import DocEncoder, TokenizerInfo, special_tokens, train_bpe  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", nargs="*", type=Path, help="JSONL(.gz) files with a text field")
    ap.add_argument("--mb", type=float, default=40.0, help="megabytes of text to tokenize")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    paths = args.data or default_paths(
        "english/manpages_en.jsonl.gz", "english/python_docs.jsonl.gz", "english/usr_share_doc.jsonl.gz",
        "english/gutenberg.jsonl.gz", "code/code.jsonl.gz",
    )
    if not paths:
        sys.exit("no data: pass --data FILE.jsonl.gz (../shared/corpora not found)")
    texts = read_texts(paths, int(args.mb * 1e6))
    mb = sum(len(t.encode()) for t in texts) / 1e6
    tspec = TokenizerSpec()
    tok = train_bpe(texts[:20000], args.vocab, 2, special_tokens(tspec))
    info = TokenizerInfo.resolve(tok, tspec)
    batches = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]

    def peer() -> int:
        n = 0
        for b in batches:
            n += sum(len(e.ids) for e in tok.encode_batch(b, add_special_tokens=False))
        return n

    def peer_fast() -> int:
        n = 0
        for b in batches:
            n += sum(len(e.ids) for e in tok.encode_batch_fast(b, add_special_tokens=False))
        return n

    def pipeline() -> int:
        enc = DocEncoder(tok, info)
        packer = BestFitPacker(args.seq_len)
        with tempfile.TemporaryDirectory() as tmp:
            writer = ShardSetWriter(tmp, 1024, token_dtype(info.vocab_size))
            for bi, b in enumerate(batches):
                for j, (ids, mask) in enumerate(enc.encode(b, [""] * len(b))):
                    for seq in packer.add(f"{bi}-{j}", ids, mask, bi * 100000 + j):
                        writer.add(seq)
            for seq in packer.flush():
                writer.add(seq)
            writer.close()
        return packer.stats.tokens

    best = {}
    for name, fn in (("peer", peer), ("peer_fast", peer_fast), ("pipeline", pipeline)) * args.repeat:
        t = time.perf_counter()
        tokens = fn()
        dt = time.perf_counter() - t
        if name not in best or dt < best[name][1]:
            best[name] = (tokens, dt)
    peer_tps = best["peer"][0] / best["peer"][1]
    fast_tps = best["peer_fast"][0] / best["peer_fast"][1]
    pipe_tps = best["pipeline"][0] / best["pipeline"][1]
    print(f"{len(texts)} documents, {mb:.1f} MB, vocab {info.vocab_size}, seq_len {args.seq_len}")
    print(f"{'':<42}{'tokens':>12}{'seconds':>10}{'tokens/s':>14}")
    print(f"{'raw tokenizers encode_batch':<42}{best['peer'][0]:>12}{best['peer'][1]:>10.2f}{peer_tps:>14,.0f}")
    print(f"{'raw tokenizers encode_batch_fast (no offsets)':<42}{best['peer_fast'][0]:>12}"
          f"{best['peer_fast'][1]:>10.2f}{fast_tps:>14,.0f}")
    print(f"{'tokenmill encode+best-fit pack+shards':<42}{best['pipeline'][0]:>12}{best['pipeline'][1]:>10.2f}"
          f"{pipe_tps:>14,.0f}")
    emit_json({"bench": "tokenize_write", "tokens_per_s": round(pipe_tps), "peer_tokens_per_s": round(peer_tps),
               "ratio": round(pipe_tps / peer_tps, 3), "ratio_vs_encode_batch_fast": round(pipe_tps / fast_tps, 3),
               "goal": 0.8})


if __name__ == "__main__":
    main()
