"""A job in words: the end-of-job table from stats.json the CLI prints, and the lines of the job's own log.

The job's log (``OUT/.tokenmill/job.log`` for ``tokenmill run``, the job process's log in the service) holds
tokenmill's lines only, one per event that says what the job did (:class:`JobLog`); Ray's output goes to
``ray.log`` beside it (:mod:`pipeline.job.ray_env`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pipeline import storage
from pipeline.job import events as ev


def ray_starting_text(event: ev.RayStarting) -> str:
    """``starting Ray (local, 2 CPUs)`` / ``starting Ray (local, every CPU)`` / ``joining Ray at HOST:6379``."""
    if event.address != "local":
        return f"joining Ray at {event.address}"
    cpus = f"{event.num_cpus} CPU{'s' if event.num_cpus != 1 else ''}" if event.num_cpus else "every CPU"
    return f"starting Ray (local, {cpus})"


def ray_started_text(event: ev.RayStarted) -> str:
    """``Ray ready in 4.1 s (2 CPUs)``, with the dashboard's URL when there is one."""
    text = f"Ray ready in {event.seconds:.1f} s ({event.cpus} CPU{'s' if event.cpus != 1 else ''}"
    if not event.own:
        text += f" at {event.address}"
    return text + (f", dashboard {event.dashboard})" if event.dashboard else ")")


def event_line(event: ev.Event) -> str | None:
    """The job log's line for ``event``; None for one it leaves to ``events.jsonl`` (progress, counters)."""
    if isinstance(event, ev.RayStarting):
        return ray_starting_text(event)
    if isinstance(event, ev.RayStarted):
        return ray_started_text(event)
    if isinstance(event, ev.JobStarted):
        resumed = f", resuming ({', '.join(event.resumed_phases)} done)" if event.resumed_phases else ""
        return f"job {event.job}: {event.parallelism} worker(s), output {event.output}{resumed}"
    if isinstance(event, ev.PhaseChanged):
        words = {"started": "started", "skipped": "skipped (done by an earlier run)"}
        return f"{event.phase}: {words.get(event.state, f'done in {event.seconds:.1f}s')}"
    if isinstance(event, ev.ShardWritten):
        how = "kept from an earlier run" if event.reused else "written"
        return f"shard {event.name} {how} ({event.samples} samples, {event.tokens} tokens, by {event.writer})"
    if isinstance(event, ev.JobFinished):
        return (f"done in {event.seconds:.1f}s: {event.documents} documents, {event.shards} shard(s), "
                f"{event.tokens} tokens, output {event.output}")
    if isinstance(event, ev.JobFailed):
        where = f" in {event.phase}" if event.phase else ""
        return f"failed ({event.category}){where}: {event.message}"
    if isinstance(event, ev.LogLine):
        return event.message if event.level == "info" else f"{event.level}: {event.message}"
    return None


class JobLog:
    """An event sink that appends the event's line (:func:`event_line`) to the job's log, with its time.

    Opened per line (events that make a line are few: no progress), so nothing stays open and the service's
    job process, whose stdout is the same file, interleaves its own lines with these."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, event: ev.Event) -> None:
        line = event_line(event)
        if line is None:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.ts))
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{stamp} [tokenmill] {line}\n")


def dropped_text(stage: dict[str, Any]) -> str:
    """A stage's drops per reason, then what an annotate-mode stage would have dropped (its ``would_drop:``
    counters, nothing dropped): ``too_short=3; would-drop: lid:language=5``, or ``-``."""
    dropped = ", ".join(f"{k}={v}" for k, v in (stage.get("dropped") or {}).items())
    would = ", ".join(f"{k.removeprefix('would_drop:')}={v}" for k, v in (stage.get("counters") or {}).items()
                      if k.startswith("would_drop:"))
    return "; ".join(t for t in (dropped, f"would-drop: {would}" if would else "") if t) or "-"


def format_summary(stats: dict[str, Any], output_dir: str | Path) -> str:
    """Per-stage counts, packing, output and throughput; a documents-only job (no ``packing``) has no
    packing or token lines."""
    lines = [f"job {stats['job']}: done in {stats['seconds']['total']:.1f}s (parallelism {stats['parallelism']})", ""]
    lines.append(f"{'stage':<24}{'docs in':>10}{'docs out':>10}{'MB in':>9}{'sec':>8}  dropped")
    for s in stats["stages"]:
        dropped = dropped_text(s)
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
    where = output_dir if storage.is_remote(output_dir) else Path(output_dir).resolve()
    lines.append(f"written to  {where}{hint}")
    return "\n".join(lines)
