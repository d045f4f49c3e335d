"""A readable end-of-job summary from stats.json: the one table the CLI prints when a job ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def format_summary(stats: dict[str, Any], output_dir: str | Path) -> str:
    """Per-stage counts, packing, output and throughput; a documents-only job (no ``packing``) has no
    packing or token lines."""
    lines = [f"job {stats['job']}: done in {stats['seconds']['total']:.1f}s (parallelism {stats['parallelism']})", ""]
    lines.append(f"{'stage':<24}{'docs in':>10}{'docs out':>10}{'MB in':>9}{'sec':>8}  dropped")
    for s in stats["stages"]:
        dropped = ", ".join(f"{k}={v}" for k, v in s["dropped"].items()) or "-"
        mb = (s["bytes_in"] or s["bytes_out"]) / 1e6
        lines.append(f"{s['stage']:<24}{s['docs_in']:>10}{s['docs_out']:>10}{mb:>9.2f}{s['seconds']:>8.1f}  {dropped}")
    o, t = stats["output"], stats["throughput"]
    lines.append("")
    p = stats.get("packing")
    if p:
        writers = f" by {stats['writers']} worker process(es)" if stats.get("writers") else ""
        lines += [
            f"packing     {p['method']}, seq_len {p['seq_len']}: {p['sequences']} sequences, "
            f"utilization {p['utilization']:.2%}, documents cut {p['docs_cut']}/{p['docs']} ({p['cut_fraction']:.2%})",
            f"output      {o['tokens']} tokens in {o['samples']} samples, {o['shards']} shard(s){writers}",
        ]
    for name, g in (stats.get("groups") or {}).items():  # output.split_by: one shard set per group
        lines.append(f"  {name + '/':<10}{g['documents']} docs -> {g['tokens']} tokens in {g['samples']} samples, "
                     f"{g['shards']} shard(s), utilization {g['packing']['utilization']:.2%}")
    docs = stats.get("documents")
    if docs:
        lines.append(f"documents   {docs['rows']} curated documents as {docs['format']} in {docs['parts']} part(s)")
    through = f"throughput  {t['docs_per_s']:.0f} docs/s end to end"
    if p:
        through += f", {t['tokens_per_s']:.0f} tokens/s tokenize+pack+write"
    lines.append(through)
    first = next(iter(stats.get("groups") or {}), None)
    target = Path(output_dir) / first if first else output_dir
    hint = f"  (inspect: tokenmill inspect {target} --decode 2)" if p else ""
    lines.append(f"written to  {Path(output_dir).resolve()}{hint}")
    return "\n".join(lines)
