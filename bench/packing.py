"""Best-fit against concat-and-chunk on the demo corpus: utilization and documents cut.

Builds the demo corpus (this machine's Python packages) unless --data is given, trains the demo's
tokenizer on it, tokenizes every document once and packs the same token streams both ways, and
best-fit once more the way a job packs (ranges of ``--range-docs`` documents, packed apart).
"""

from __future__ import annotations

import sys  # noqa: I001
from pathlib import Path

# the repo root instead of bench/ on sys.path, so `pipeline`, `training` and `bench` import
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse
import tempfile

from bench.common import emit_json, read_texts  # noqa: E402
from pipeline.packing import pack_all  # noqa: E402
from pipeline.spec import TokenizerSpec  # noqa: E402
from pipeline.tokenize import DocEncoder, TokenizerInfo, special_tokens, train_bpe  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", nargs="*", type=Path, help="JSONL(.gz) files (default: a fresh demo corpus)")
    ap.add_argument("--max-bytes", type=int, default=20_000_000)
    ap.add_argument("--seq-len", type=int, nargs="*", default=[1024, 2048, 4096])
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--range-docs", type=int, default=4096, help="documents per packing range, as in a job")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.data:
            paths = args.data
        else:
            from pipeline.demo_corpus import build_demo_corpus

            paths = build_demo_corpus(Path(tmp) / "corpus", max_bytes=args.max_bytes)
        texts = read_texts(sorted(paths))
    tspec = TokenizerSpec()
    tok = train_bpe(texts[:20000], args.vocab, 2, special_tokens(tspec))
    enc = DocEncoder(tok, TokenizerInfo.resolve(tok, tspec))
    encoded = []
    for i in range(0, len(texts), 512):
        batch = texts[i : i + 512]
        encoded += [(str(i + j), ids, None) for j, (ids, _) in enumerate(enc.encode(batch, [""] * len(batch)))]
    print(f"{len(texts)} documents, {sum(len(e[1]) for e in encoded)} tokens")
    print(f"{'seq_len':>8} {'method':<9}{'sequences':>10}{'utilization':>13}{'docs cut':>10}{'cut %':>8}")
    figures = {}
    for L in args.seq_len:
        for method in ("best_fit", "concat", "ranges"):
            if method == "ranges":  # what a job does: each range packed on its own
                chunks = [pack_all(encoded[i:i + args.range_docs], "best_fit", L)[1]
                          for i in range(0, len(encoded), args.range_docs)]
                seqs, toks = sum(c.sequences for c in chunks), sum(c.tokens for c in chunks)
                util, cut = toks / (seqs * L), sum(c.docs_cut for c in chunks)
            else:
                _, st = pack_all(encoded, method, L)
                seqs, util, cut = st.sequences, st.utilization, st.docs_cut
            print(f"{L:>8} {method:<9}{seqs:>10}{util:>13.4%}{cut:>10}{cut / len(encoded):>8.2%}")
            figures[f"{method}_{L}"] = {"utilization": round(util, 5), "docs_cut": cut}
    L = args.seq_len[0]
    emit_json({"bench": "packing", "seq_len": L, "best_fit_utilization": figures[f"best_fit_{L}"]["utilization"],
               "job_ranges_utilization": figures[f"ranges_{L}"]["utilization"], "range_docs": args.range_docs,
               "best_fit_docs_cut": figures[f"best_fit_{L}"]["docs_cut"],
               "concat_docs_cut": figures[f"concat_{L}"]["docs_cut"], "all": figures, "goal": 0.99})


if __name__ == "__main__":
    main()
