"""Ray-side wrappers: run a reader or a chain of batch stages inside Ray workers and count what each does.

The base class, not each stage, collects docs in/out, drops per reason, bytes and seconds, the
stage's own counters and scores, and writes dropped documents to ``rejected/``: a stage only decides
what to keep. Each report names the batch it counts (a file's n-th batch; a digest of the batch's ords),
so a batch Ray runs again after losing a worker is counted and set aside once
(:mod:`pipeline.job.stats`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import ray
from pydantic import BaseModel
from ray import ObjectRef

from pipeline.documents import (
    DOC_SCHEMA,
    Doc,
    Drop,
    ReaderDocument,
    docs_bytes,
    docs_to_table,
    parse_meta,
    reject_row,
    table_to_docs,
    text_bytes,
)
from pipeline.job.stats import Report, Row, StageRecorder, batch_key, send_reports
from pipeline.readers import read_file
from pipeline.spec import InputSpec
from pipeline.stages.base import Stage, StageContext, run_batch
from pipeline.worker_start import process_start_seconds

READ_BATCH = 512
#: what ``prepare()`` gave, in the object store (wrapped in a tuple so Ray hands the ref over instead of resolving it)
Prepared = tuple[ObjectRef | None]
#: a :class:`BatchStageRunner`'s constructor arguments (:meth:`BatchStageRunner.constructor_args`)
StageLink = tuple[type[Stage], str, StageContext, StageRecorder, Prepared]


class ReadFiles:
    """Ray Data UDF: one row per input file in, batches of documents out (a generator, so a large
    file streams instead of being held whole).

    With ``links``, the batch stages that follow the readers run here too, on each batch of
    ``batch_docs`` documents as it is read: the documents go from the reader to the stages as Python
    objects, without a round trip through Arrow and the object store, and one pool of workers does both.
    """

    def __init__(self, recorder: StageRecorder, links: list[StageLink] | None = None, batch_docs: int = READ_BATCH):
        start = process_start_seconds(getattr(recorder, "phase_started", None))
        if start:
            recorder.counts(seconds=start)
        if isinstance(recorder, StageRecorder):  # the readers are the phase's first workers
            recorder.waited_for_workers("start_workers", ray.get_runtime_context().get_actor_id() or "", start)
        self.recorder = recorder
        self.chain = StageChain(links) if links else None
        self.batch_docs = batch_docs

    def __call__(self, files: pa.Table) -> Iterator[pa.Table]:
        for row in files.to_pylist():
            spec = InputSpec.model_validate_json(row["input"])
            t0 = time.perf_counter()
            docs: list[ReaderDocument] = []
            rejects: list[Row] = []
            dropped: Counter[str] = Counter()
            n = 0  # the file's n-th batch: the same in a re-run, which reads the same file the same way
            for item in read_file(row["file_index"], row["path"], spec):
                if isinstance(item, Drop):
                    dropped[item.reason] += 1
                    rejects.append(reject_row(item.doc, item.reason, item.detail))
                else:
                    docs.append(item)
                if len(docs) + len(rejects) >= self.batch_docs:
                    yield self._flush(f"file:{row['file_index']}:{n}", docs, rejects, dropped, t0)
                    docs, rejects, dropped, t0 = [], [], Counter(), time.perf_counter()
                    n += 1
            if docs or rejects:
                yield self._flush(f"file:{row['file_index']}:{n}", docs, rejects, dropped, t0)

    def _flush(self, key: str, docs: list[ReaderDocument], rejects: list[Row], dropped: Counter[str], t0: float
               ) -> pa.Table:
        size = docs_bytes(docs)
        self.recorder.rejects(rejects, key=key, sampled=False)  # malformed input: always set aside whole
        reports = [self.recorder.report(
            key=key, docs_in=len(docs) + len(rejects), docs_out=len(docs), dropped=dict(dropped),
            bytes_out=size, seconds=time.perf_counter() - t0,
        )]
        out: list[ReaderDocument] | list[Doc] = docs
        if self.chain is not None and docs:
            out = self.chain.run(parse_meta(docs), size, batch_key([d["ord"] for d in docs]), reports)
        send_reports(self.recorder.actor, reports)  # one call for the reader and every stage of the chain
        return docs_to_table(out) if out else DOC_SCHEMA.empty_table()


class BatchStageRunner:
    """Ray Data UDF (run in an actor pool) around one :class:`Stage`.

    Build its constructor arguments with :meth:`constructor_args`, which runs the stage's ``prepare``
    once on the driver; each worker then fetches that value from the object store before ``setup``.
    """

    def __init__(self, stage_cls: type[Stage], params_json: str, ctx: StageContext, recorder: StageRecorder,
                 prepared: Prepared = (None,)):
        t0 = time.perf_counter() - process_start_seconds(getattr(recorder, "phase_started", None))
        self.stage = stage_cls(stage_cls.Params.model_validate_json(params_json), ctx)
        ref = prepared[0]  # wrapped in a tuple so Ray hands the ref over instead of resolving it
        if ref is not None:
            self.stage.prepared = ray.get(ref)
        self.stage.setup()
        self.recorder = recorder
        # the worker's setup (its process's start, models, word splitters) is the stage's cost too: counted in its
        # seconds, once per worker (the key names the actor's creation, so a restarted actor is not counted twice)
        recorder.counts(seconds=time.perf_counter() - t0)

    @staticmethod
    def constructor_args(stage_cls: type[Stage], params: BaseModel, ctx: StageContext, recorder: StageRecorder
                         ) -> StageLink:
        """``fn_constructor_args`` for one stage: runs ``prepare()`` here, on the driver, once per job,
        and ships its value through Ray's object store (``ray.put``) rather than per worker or batch."""
        prepared = stage_cls(params, ctx).prepare()
        ref = None if prepared is None else ray.put(prepared)
        return (stage_cls, params.model_dump_json(), ctx, recorder, (ref,))

    def __call__(self, table: pa.Table) -> pa.Table:
        docs, _ = self.run_docs(table_to_docs(table), text_bytes(table), batch_key(table.column("ord")))
        return docs_to_table(docs) if docs else DOC_SCHEMA.empty_table()

    def run_docs(self, docs: list[Doc], size_in: int, key: str | None = None, reports: list[Report] | None = None
                 ) -> tuple[list[Doc], int]:
        """Run the stage on one batch of documents and record what it did under ``key`` (the batch's name,
        see :func:`pipeline.job.stats.batch_key`): sent now, or added to ``reports`` for the caller to send with
        others. Returns the kept ones and their UTF-8 size (the next stage's ``bytes_in``)."""
        t0 = time.perf_counter()
        n_in = len(docs)
        result = run_batch(self.stage, docs)
        dropped = Counter(d.reason for d in result.drops)
        size_out = docs_bytes(result.kept)
        self.recorder.rejects([reject_row(d.doc, d.reason, d.detail) for d in result.drops], key=key)
        counts: dict[str, Any] = {
            "docs_in": n_in, "docs_out": len(result.kept), "dropped": dict(dropped), "bytes_in": size_in,
            "bytes_out": size_out, "seconds": time.perf_counter() - t0, "metrics": result.metrics or None,
        }
        if reports is None:
            self.recorder.counts(key, **counts)
        else:
            reports.append(self.recorder.report(key, **counts))
        return result.kept, size_out


class StageChain:
    """Ray Data UDF (one actor pool) running consecutive batch stages on each batch, in spec order.

    One operator for a run of stages, not one per stage: a batch is converted from Arrow once, not once per
    stage, crosses the object store once, and a spec with ten filters needs one pool of workers instead of ten
    (ten pools of ``parallelism`` actors each would ask a small node for more CPUs than it has and stall).
    Each stage still gets its own counters, seconds, drops and ``rejected/`` rows, as if it ran alone.
    """

    def __init__(self, links: list[StageLink]):
        self.runners = [BatchStageRunner(*args) for args in links]

    def __call__(self, table: pa.Table) -> pa.Table:
        # every stage names the batch by what entered the chain
        reports: list[Report] = []
        docs = self.run(table_to_docs(table), text_bytes(table), batch_key(table.column("ord")), reports)
        send_reports(self.runners[0].recorder.actor, reports)
        return docs_to_table(docs) if docs else DOC_SCHEMA.empty_table()

    def run(self, docs: list[Doc], size: int, key: str, reports: list[Report]) -> list[Doc]:
        """The documents each stage keeps in turn (``size``: their UTF-8 bytes; ``key``: the batch's name); each
        stage's report is added to ``reports``, which the caller sends in one call."""
        for runner in self.runners:
            if not docs:
                break
            docs, size = runner.run_docs(docs, size, key, reports)
        return docs

