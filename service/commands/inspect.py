"""``tokenmill inspect OUTPUT``: summarize a shard set (or a documents-only output), verify its checksums,
decode samples. Exit 1 when a checksum fails, 2 when the output cannot be read."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from service.commands.exits import error


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenmill inspect")
    p.add_argument("output", help="a job's output folder (a shard set, or a documents-only output)")
    p.add_argument("--decode", type=int, default=0, metavar="N", help="decode the first N samples to text")
    p.add_argument("--full", action="store_true", help="print decoded documents whole")
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--export-docs", metavar="FILE", help="write every document, re-assembled and decoded, as JSONL")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    return p


def run(args: argparse.Namespace) -> int:
    # lazy: numpy, tokenizers and pyarrow (0.2 s), not for -h
    from pipeline.output.inspect import documents_index_name, verify_shards
    from pipeline.shard_format import Manifest

    out = Path(args.output)
    if not (out / "manifest.json").exists() and documents_index_name(out) is not None:
        return _inspect_documents(out, args)
    try:
        manifest = Manifest.load(out)
    except (OSError, ValueError) as exc:
        return error(f"{out}: no readable manifest.json ({exc})")
    _print_manifest(out, manifest)
    bad = 0 if args.no_verify else _report_checks(verify_shards(out, manifest))
    try:  # every read is bounded and checked: a bad shard set ends in one line naming the shard
        if args.decode:
            _print_samples(out, manifest, args.decode, args.full)
        if args.export_docs:
            _export_documents(out, args.export_docs)
    except (OSError, ValueError) as exc:  # ShardFormatError is a ValueError
        return error(f"{out}: {exc}")
    if args.json:
        print(json.dumps({"samples": manifest.total_samples, "tokens": manifest.total_tokens, "bad_shards": bad}))
    return 1 if bad else 0


def _print_manifest(out: Path, manifest: Any) -> None:
    print(f"shard set   {out}")
    print(f"samples     {manifest.total_samples} in {len(manifest.shards)} shard(s) of {manifest.samples_per_shard}")
    print(f"tokens      {manifest.total_tokens} (seq_len {manifest.seq_len}, dtype {manifest.dtype}, "
          f"vocab {manifest.vocab_size})")
    print(f"fill        {manifest.total_tokens / max(1, manifest.total_samples * manifest.seq_len):.2%}")
    print(f"bos/eos/pad {manifest.bos_id}/{manifest.eos_id}/{manifest.pad_id}   loss mask: {manifest.has_loss_mask}")
    print(f"spec        {manifest.spec_hash[:16]}   tokenizer {manifest.tokenizer_hash[:16]}")
    if manifest.validation:  # output.validation: a shard set of its own beside this one
        v = manifest.validation
        print(f"validation  {v['documents']} documents, {v['samples']} samples, {v['tokens']} tokens in "
              f"{out / v['path']} (inspect it as a shard set)")


def _print_samples(out: Path, manifest: Any, count: int, full: bool) -> None:
    """The first ``count`` samples, each document decoded (cut at 300 characters unless ``full``)."""
    from pipeline.output.inspect import Decoder, iter_samples, split_documents  # lazy: see run

    decoder = Decoder(out, manifest)
    for n, sample in enumerate(iter_samples(out, manifest)):
        if n >= count:
            break
        print(f"--- sample {sample.key}: {len(sample.input_ids)} tokens, {len(sample.doc_lens)} document(s)")
        for doc_id, ids in zip(sample.meta.get("doc_ids", []), split_documents(sample), strict=False):
            text = decoder.decode(ids)
            shown = text if full or len(text) <= 300 else text[:300] + f"... [{len(text)} chars]"
            print(f"[{doc_id}] {shown}")


def _export_documents(out: Path, path: str) -> None:
    from pipeline.output.inspect import decode_documents  # lazy: see run

    docs = decode_documents(out)
    with open(path, "w", encoding="utf-8") as f:
        for ord_, text in sorted(docs.items()):
            f.write(json.dumps({"ord": ord_, "text": text}, ensure_ascii=False) + "\n")
    print(f"documents   {len(docs)} re-assembled and decoded to {path}")


def _report_checks(checks: list[Any]) -> int:
    """Print each failed checksum and the tally; returns how many failed."""
    bad = [c for c in checks if not c.ok]
    for check in bad:
        print(f"BAD {check.name}: {check.problem}")
    print(f"checksums   {len(checks) - len(bad)}/{len(checks)} OK")
    return len(bad)


def _inspect_documents(out: Path, args: argparse.Namespace) -> int:
    """A documents-only output (``tokenizer: null``): its listing, checksums, the first documents."""
    from pipeline.output.inspect import iter_documents, load_documents_index, verify_documents  # lazy: see run

    try:
        index = load_documents_index(out)
        print(f"documents   {out}: {index.rows} in {len(index.parts)} {index.format} part(s)")
        bad = 0 if args.no_verify else _report_checks(verify_documents(out, index))
        for n, doc in enumerate(iter_documents(out, index) if args.decode else ()):
            if n >= args.decode:
                break
            text = doc["text"] if args.full or len(doc["text"]) <= 300 else doc["text"][:300] + "..."
            print(f"[{doc['id']}] {text}")
    except (OSError, ValueError) as exc:
        return error(f"{out}: {exc}")
    if args.json:
        print(json.dumps({"documents": index.rows, "parts": len(index.parts), "bad_parts": bad}))
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))

