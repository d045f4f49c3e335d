"""The validation split on Ray (``output.validation``), after curation: the curated parts in ``work/all`` become
the training parts (``work/curated``, what every later phase reads) and the validation parts
(``work/groups/validation``, packed by the write phase as a shard set of its own into ``OUT/validation/``).

Three rounds of tasks over the parts, the driver holding only hashes: key every document and keep each part's
smallest hashes (the threshold), gather the held-out documents' band keys, then split every part. The rules are
:mod:`pipeline.output.validation`'s.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import ray

from pipeline import storage
from pipeline.job.errors import JobError
from pipeline.job.records import CurateResult, ValidationRecord, whole
from pipeline.job.tasks import PhaseContext
from pipeline.output.curated import sorted_parts
from pipeline.output.validation import (
    DOCUMENTS_JSONL,
    VALIDATION,
    held_bands,
    key_config,
    key_part,
    split_part,
    threshold,
    write_documents_jsonl,
)


def split(ctx: PhaseContext, result: CurateResult, all_dir: str) -> CurateResult:
    """``result`` with its training parts in ``work/curated`` and its validation record."""
    spec, work = ctx.spec, ctx.work
    v = spec.output.validation
    assert v is not None, "split only for a spec with output.validation"
    cfg = key_config([s.type for s in spec.stages])
    parts = sorted_parts(result.parts)
    keys_dir, val_dir = storage.join(work, "validation-keys"), storage.join(work, "groups", VALIDATION)
    remote = ray.remote(num_cpus=1, max_retries=3)
    lows = ctx.tasks.get_all(remote(key_part).remote(all_dir, p, cfg, keys_dir, v.documents or 1) for p in parts)
    cut = threshold(v.share, v.documents, lows)
    held = np.zeros(0, np.uint64)
    if cfg.near is not None:
        found = ctx.tasks.get_all(remote(held_bands).remote(keys_dir, p, cut) for p in parts)
        held = np.unique(np.concatenate(found))
    held_ref = ray.put(held)
    out = ctx.tasks.get_all(remote(split_part).remote(all_dir, p, keys_dir, cut, held_ref,
                                                      storage.join(work, "curated"), val_dir) for p in parts)
    train = [s.train for s in out if s.train is not None]
    val = [s.validation for s in out if s.validation is not None]
    if not train:
        raise JobError(f"output.validation: {sum(p.rows for p in val)} of {result.docs} documents held out, "
                       "none left to train on", "validation")
    jsonl = storage.join(ctx.stage, VALIDATION, DOCUMENTS_JSONL)
    ctx.tasks.get_all([remote(write_documents_jsonl).remote(val_dir, val, jsonl)])
    for folder in (keys_dir, all_dir):  # every document is in a training or validation part now
        storage.rmtree(folder)
    record = ValidationRecord(val, sum(s.dropped for s in out), cfg.kind)
    return dataclasses.replace(result, parts=train, groups=whole(train), validation=record)
