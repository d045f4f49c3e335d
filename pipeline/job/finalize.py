"""The finalize phase: the ``documents/`` output, ``stats.json`` and the manifests staged, then committed.

Everything is written into the stage folder first and published into the output folder in one step
(:meth:`pipeline.output.store.StoreBase.commit`); the work folder is emptied once it is.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable

import ray
from ray import ObjectRef

from pipeline import storage
from pipeline.card.collect import TokenCounter
from pipeline.card.profile import merge_profiles
from pipeline.job import events as ev
from pipeline.job.records import (
    CurateResult,
    DocumentsRecord,
    GroupStats,
    OutputTotals,
    Packing,
    Seconds,
    Stats,
    TokenizeTotals,
    ValidationRecord,
    WriteResult,
    group_stage_dir,
)
from pipeline.job.state import JsonObject, WorkState, clear
from pipeline.job.tasks import PhaseContext
from pipeline.job.write import range_bounds, worker_encoder
from pipeline.output.curated import Part, export_documents, profile_documents, sorted_parts
from pipeline.output.documents_meta import DOCUMENTS_INDEX_NAME, MetaPlan, json_plan, unify_meta
from pipeline.output.shard_set import write_manifest
from pipeline.output.validation import VALIDATION
from pipeline.shard_format import STATS, TOKENIZER, Manifest, token_dtype
from pipeline.spec import JobSpec
from pipeline.tokenize import TokenizerInfo


def run(ctx: PhaseContext, state: WorkState, curated: CurateResult, written: list[WriteResult] | None,
        t_start: float, commit: Callable[[], object]) -> tuple[Stats, Manifest | None]:
    """Stage the outputs, commit them; returns the stats and the output's own manifest (None for a job
    without shards, or with one shard set per ``output.split_by`` group)."""
    documents = _export_documents(ctx, curated) if ctx.spec.output.documents else None
    train = [r for r in written if r.group != VALIDATION] if written is not None else None
    held = next((r for r in written or [] if r.group == VALIDATION), None)
    stats = job_stats(ctx.spec, curated, train, state, documents, ctx.par, time.perf_counter() - t_start)
    if held is not None and curated.validation is not None:
        stats = dataclasses.replace(stats, validation=_validation_stats(curated.validation, held))
    storage.write_text(storage.join(ctx.stage, STATS), json.dumps(stats.to_json(), indent=2) + "\n")
    manifest = _stage_manifests(ctx, written, held) if written is not None else None
    _stage_card(ctx, _worker_token_counts(ctx, written[0].info) if written else None)
    ctx.check_cancel()
    commit()
    clear(ctx.work)
    return stats, manifest


def _stage_card(ctx: PhaseContext, count_tokens: TokenCounter | None = None) -> None:
    """``README.md`` (the dataset card) and ``card/`` (pipeline/card), staged to be published with the rest. A card
    that cannot be made does not fail a job whose data is sound: a warning event says so, the output has no card,
    and ``tokenmill card OUT`` makes it later."""
    from pipeline.card.build import write_card  # matplotlib: only when a job finishes

    try:
        write_card(ctx.stage, ctx.spec.output.card_compare, ctx.spec.model_dump(mode="json"), count_tokens)
    except Exception as exc:  # noqa: BLE001 - reported as an event; the shards and stats stand
        storage.rmtree(storage.join(ctx.stage, "card"))
        ctx.emit(ev.LogLine(level="warning", message=f"card: not written ({type(exc).__name__}: {exc}); "
                                                     "`tokenmill card OUT` makes it from the published output"))


def _worker_token_counts(ctx: PhaseContext, info: TokenizerInfo) -> TokenCounter:
    """The card's sample of dropped documents tokenized by the write phase's workers, ``parallelism`` at once: their
    encoders' caches already hold the corpus' words, which the dropped documents mostly share, where the driver's
    would start empty (it was most of the card's time). The same counts as the card's own (the same encoder)."""

    def count(tok_json: str, texts: list[str]) -> list[int]:
        task = ray.remote(num_cpus=1)(count_tokens)
        tok_ref, step = ray.put(tok_json), -(-len(texts) // (2 * ctx.par))
        parts = ctx.tasks.get_all(task.remote(tok_ref, info, texts[i:i + step]) for i in range(0, len(texts), step))
        return [n for part in parts for n in part]

    return count


def count_tokens(tok_json: str, info: TokenizerInfo, texts: list[str]) -> list[int]:
    """Tokens per text, as the write phase counts them, by this worker's encoder (a Ray task)."""
    return [len(ids) for ids in worker_encoder(tok_json, info).ids(texts)]


def _export_documents(ctx: PhaseContext, curated: CurateResult) -> DocumentsRecord:
    """``documents/part-NNNNNN.{parquet,jsonl}``: ``range_docs`` documents each, in ``ord`` order, so
    the files are the same for any parallelism; listed with checksums in ``documents.json`` beside the folder
    (so the folder holds parts only: a dataset every reader takes whole). Parquet parts share one ``meta``
    struct type (:mod:`pipeline.output.documents_meta`)."""
    fmt = ctx.spec.output.documents or "parquet"
    parts = ray.put(sorted_parts(curated.parts))
    bounds = range_bounds(curated.docs, ctx.spec.packing.range_docs)
    curated_dir, dest = storage.join(ctx.work, "curated"), storage.join(ctx.stage, "documents")
    plan = _meta_plan(ctx, curated_dir, parts, bounds) if fmt == "parquet" else None
    task = ray.remote(num_cpus=1)(export_documents)
    listing = ctx.tasks.get_all(task.remote(curated_dir, parts, k, lo, hi, dest, fmt, plan)
                                for k, (lo, hi) in enumerate(bounds))
    if any(p is None for p in listing):  # a range the struct does not hold exactly: every part as JSON
        plan = json_plan("a value the struct type does not hold exactly")
        listing = ctx.tasks.get_all(task.remote(curated_dir, parts, k, lo, hi, dest, fmt, plan)
                                    for k, (lo, hi) in enumerate(bounds))
    rows = sum(int(p["rows"]) for p in listing)
    meta = plan.to_json() if plan is not None else {"meta": "object"}
    index = {"format": 1, "documents": fmt, **meta, "rows": rows, "parts": listing}
    storage.write_text(storage.join(ctx.stage, DOCUMENTS_INDEX_NAME), json.dumps(index, indent=2) + "\n")
    return DocumentsRecord(fmt, len(listing), rows)


def _meta_plan(ctx: PhaseContext, curated_dir: str, parts: ObjectRef[list[Part]],
               bounds: list[tuple[int, int]]) -> MetaPlan:
    """Every range's meta profiled by a task, unified on the driver: the one ``meta`` type of every part."""
    task = ray.remote(num_cpus=1)(profile_documents)
    return unify_meta(ctx.tasks.get_all(task.remote(curated_dir, parts, lo, hi) for lo, hi in bounds))


def _stage_manifests(ctx: PhaseContext, written: list[WriteResult], held: WriteResult | None) -> Manifest | None:
    """A manifest per shard set; a group's folder (``validation/`` too) gets the tokenizer, being a shard set of its
    own. Returns the output's own manifest (None with one per ``output.split_by`` group), which names the
    validation split's when there is one."""
    tok_text = storage.read_text(storage.join(ctx.stage, TOKENIZER)) if any(r.group for r in written) else ""
    own = None
    for r in written:
        folder = group_stage_dir(ctx.stage, r.group)
        m = manifest(ctx.spec, r)
        if not r.group:
            own = m = dataclasses.replace(m, validation=_validation_entry(held)) if held is not None else m
        write_manifest(folder, m)
        if r.group:
            storage.write_text(storage.join(folder, TOKENIZER), tok_text)
    return own


def _validation_entry(held: WriteResult) -> dict[str, object]:
    """The output manifest's ``validation``: where the split's shard set is and what it holds."""
    return {"path": VALIDATION, "documents": held.tokenize.docs, "samples": sum(s.samples for s in held.shards),
            "tokens": sum(s.tokens for s in held.shards)}


def _validation_stats(record: ValidationRecord, held: WriteResult) -> JsonObject:
    """``stats.json``'s ``validation``: the split's size, and the training documents it cost."""
    return {**_validation_entry(held), "shards": len(held.shards), "dropped_near_validation": record.dropped,
            "key": record.key}


def manifest(spec: JobSpec, r: WriteResult) -> Manifest:
    info = r.info
    return Manifest(
        spec_hash=spec.content_hash(),
        tokenizer_hash=info.sha256,
        seq_len=spec.packing.seq_len,
        dtype=token_dtype(info.vocab_size).name,
        vocab_size=info.vocab_size,
        samples_per_shard=spec.output.samples_per_shard,
        bos_id=info.bos_id if info.add_bos else None,
        eos_id=info.eos_id if info.add_eos else None,
        pad_id=info.pad_id,
        has_loss_mask=r.has_mask,
        shards=list(r.shards),
        extra={"job": spec.name, "packing": r.packing.to_json(), "add_bos": info.add_bos, "add_eos": info.add_eos},
    )


def job_stats(spec: JobSpec, curated: CurateResult, written: list[WriteResult] | None, state: WorkState,
              documents: DocumentsRecord | None, par: int, total_s: float) -> Stats:
    """``stats.json``: every stage's counts (the write phase's tokenizing as ``90-tokenize``), the output,
    per group with ``output.split_by``, and the seconds per phase."""
    seconds = Seconds(curation=state.seconds("curate"), total=round(total_s, 3))
    if written is None:
        return Stats(spec.name, dict(curated.stages), OutputTotals(), seconds, _docs_per_s(curated, total_s), 0.0,
                     par, documents=documents, inputs=curated.inputs, overhead={"curation": curated.overhead})
    groups = None
    if any(r.group for r in written):  # output.split_by: a shard set per group
        docs = {g.name: g.docs for g in curated.groups}
        groups = {r.group: GroupStats(docs[r.group], OutputTotals.of(r.shards), r.packing) for r in written}
    tokenize = TokenizeTotals.merge([r.tokenize for r in written])
    task_s, shard_s = sum(r.task_seconds for r in written), sum(r.shard_seconds for r in written)
    stages = {**curated.stages, "90-tokenize": {
        "docs_in": tokenize.docs, "docs_out": tokenize.docs, "dropped": {}, "bytes_in": tokenize.bytes_in,
        "bytes_out": 0, "seconds": round(task_s, 3),
        # the write phase's tasks: tokenizing, the rest of the range tasks (reading, packing), the shard tasks
        "steps": {"tokenize": tokenize.seconds, "pack": round(max(0.0, task_s - shard_s - tokenize.seconds), 3),
                  "write_shards": round(shard_s, 3)}}}
    output = OutputTotals.of([s for r in written for s in r.shards])
    seconds = Seconds(seconds.curation, seconds.total, state.seconds("tokenizer"), state.seconds("write"))
    write_s = seconds.write or 0.0
    tokens_per_s = round(output.tokens / max(write_s, 1e-9), 1) if write_s else 0.0
    return Stats(spec.name, stages, output, seconds, _docs_per_s(curated, total_s), tokens_per_s, par, groups=groups,
                 packing=Packing.merge([r.packing for r in written], spec.packing.seq_len, spec.packing.method),
                 writers=len({w for r in written for w in r.writers}), documents=documents,
                 profile=merge_profiles([r.profile for r in written]), inputs=curated.inputs,
                 overhead={"curation": curated.overhead,
                           "tokenize_pack_write": {"idle": round(sum(r.idle_seconds for r in written), 3),
                                                   "dispatch": round(sum(r.dispatch_seconds for r in written), 3)}})


def _docs_per_s(curated: CurateResult, total_s: float) -> float:
    return round(curated.docs / max(total_s, 1e-9), 1)
