"""The curate phase: read every input and run the stages on Ray, then split by ``output.split_by``.

The last step of the graph (:mod:`pipeline.job.graph`) writes the kept documents on the workers, as
Parquet parts in ``work/curated/``; the driver sees one small row per part. Stages count through one
path (:class:`pipeline.job.stats.StageRecorder` into one stats actor): readers, batch stages and dataset
stages alike, so ``stats.json`` and the live counters agree.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import cast

import pyarrow as pa
import ray
import ray.exceptions as rex
from ray.actor import ActorHandle

from pipeline import storage
from pipeline.dedup.index import DedupIndexError
from pipeline.job import events as ev
from pipeline.job import validation
from pipeline.job.errors import JobError
from pipeline.job.graph import READ_KEY, build_graph
from pipeline.job.records import Counters, CurateResult, GroupRecord, whole
from pipeline.job.state import JsonObject
from pipeline.job.stats import StageRecorder, batch_key, reject_file_tag, start_stats_actor
from pipeline.job.tasks import EventSink, PhaseContext
from pipeline.output.curated import Part, sorted_parts, write_part
from pipeline.output.groups import collect_groups, split_part
from pipeline.readers import expand_inputs
from pipeline.readers.limit import limit_files
from pipeline.readers.paths import source_name
from pipeline.spec import InputSpec, JobSpec
from pipeline.worker_start import process_start_seconds

#: times the curate phase is run when Ray loses work it cannot rebuild (see :func:`curate`)
CURATE_ATTEMPTS = 3


def run(ctx: PhaseContext) -> CurateResult:
    """The phase: curate from empty folders into ``work/curated``, then split into ``work/groups/<value>``."""
    work, stage = ctx.work, ctx.stage
    held_out = ctx.spec.output.validation is not None  # curated into work/all, then split (pipeline/job/validation.py)
    for folder in (storage.join(work, "curated"), storage.join(work, "groups"), storage.join(stage, "rejected"),
                   storage.join(stage, "index"), *([storage.join(work, "all"), storage.join(work, "validation-keys")]
                                                    if held_out else [])):
        storage.rmtree(folder)
    curated = storage.join(work, "all" if held_out else "curated")
    storage.makedirs(curated)
    result = curate(ctx.spec, curated, stage, ctx.par, ctx.emit, ctx.check_cancel)
    if held_out and result.docs:
        return validation.split(ctx, result, curated)
    if ctx.spec.output.split_by and result.docs:
        return CurateResult(result.parts, result.stages, result.files, result.attempts, result.repeated_reports,
                            _split(ctx, result.parts, ctx.spec.output.split_by), result.inputs, result.overhead)
    return result


def _split(ctx: PhaseContext, parts: list[Part], key: str) -> list[GroupRecord]:
    """``output.split_by``: each curated part split by a meta field, on the workers (pipeline/output/groups.py)."""
    task = ray.remote(num_cpus=1, max_retries=3)(split_part)
    dest = storage.join(ctx.work, "groups")
    split = ctx.tasks.get_all(task.remote(storage.join(ctx.work, "curated"), part, key, dest)
                              for part in sorted_parts(parts))
    return [GroupRecord(name, group) for name, group in collect_groups(split).items()]


def curate(spec: JobSpec, curated_dir: str, stage_dir: str, par: int, emit: EventSink,
           check_cancel: Callable[[], None]) -> CurateResult:
    """Read and curate every input; write the kept documents as Parquet parts in ``curated_dir``.

    Returns the parts (name, rows, first ord, writer), their count and every stage's counters. Dropped
    documents go to ``stage_dir/rejected``, dedup indexes to ``stage_dir/index``: both are published
    with the shards.

    A node lost mid-phase is Ray's to recover: its tasks and actor tasks run again elsewhere (Ray Data
    restarts a pool's actors and retries their tasks by default, ``max_restarts=-1`` and
    ``max_task_retries=-1``; a restarted actor needs room on another node) and the blocks it held are
    rebuilt from their lineage; each batch run again is counted once (:mod:`pipeline.job.stats`). Work Ray
    cannot rebuild (an object whose lineage or owner is gone) fails the attempt with an object, actor or
    node loss: the phase then starts over from empty folders and a new stats actor, at most
    :data:`CURATE_ATTEMPTS` times in all.
    """
    for attempt in range(1, CURATE_ATTEMPTS + 1):
        try:
            return _curate_once(spec, curated_dir, stage_dir, par, emit, check_cancel, attempt)
        except Exception as exc:
            lost = lost_work(exc)
            if lost is None:
                raise
            first = (str(lost).splitlines() or [type(lost).__name__])[0]
            if attempt == CURATE_ATTEMPTS:
                raise JobError(f"curate: Ray lost work {attempt} times, the last: {type(lost).__name__}: {first}",
                               "infra") from None
            emit(ev.LogLine(level="warning", message=f"curate: attempt {attempt} of {CURATE_ATTEMPTS} lost work Ray "
                                                     f"could not rebuild ({type(lost).__name__}: {first}); "
                                                     "starting the phase again"))
            _reset(curated_dir, stage_dir)
    raise AssertionError("unreachable")


def lost_work(exc: BaseException) -> BaseException | None:
    """The Ray error in ``exc`` (or its causes) that says work was lost with a worker or a node, else None:
    an application error, a cancel or an actor whose constructor failed is not retried."""
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, rex.LocalRayletDiedError):
            return None  # this process's own node: nothing left to run on
        if isinstance(e, rex.RayActorError) and not e.actor_init_failed:
            return e
        if isinstance(e, (rex.ObjectLostError, rex.NodeDiedError, rex.WorkerCrashedError)) and not isinstance(
                e, rex.ReferenceCountingAssertionError):
            return e
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    return None


def _reset(curated_dir: str, stage_dir: str) -> None:
    """Empty what an attempt wrote: curated parts, ``rejected/`` and dedup indexes."""
    for folder in (curated_dir, storage.join(stage_dir, "rejected"), storage.join(stage_dir, "index")):
        storage.rmtree(folder)
    storage.makedirs(curated_dir)


def _curate_once(spec: JobSpec, curated_dir: str, stage_dir: str, par: int, emit: EventSink,
                 check_cancel: Callable[[], None], attempt: int) -> CurateResult:
    stats_actor = start_stats_actor()
    rejected_dir = storage.join(stage_dir, "rejected") if spec.output.write_rejected else None

    started = time.time()

    def recorder(key: str) -> StageRecorder:
        return StageRecorder(key, stats_actor, rejected_dir, attempt, started, par, spec.output.rejected_sample)

    files, to_read = limit_files(expand_inputs(spec.inputs))  # inputs[].limit: the files its documents are in
    parts: list[Part] = []
    with _CounterReporter(stats_actor, emit):
        try:
            ds = build_graph(spec, to_read, stage_dir, par, recorder)
        except DedupIndexError as exc:
            raise JobError(str(exc), "validation") from None
        # no CPU of its own: the stages' actor pools may hold every CPU until their output is consumed
        ds = ds.map_batches(_write_part, fn_kwargs={"folder": curated_dir, "stats": stats_actor,  # type: ignore[arg-type]  # Ray's types: no fn_kwargs
                                                    "started": started},
                            batch_size=None, batch_format="pyarrow", num_cpus=0, concurrency=par)
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None, prefetch_batches=0):
            check_cancel()
            parts.extend(Part.from_json(row) for row in cast(pa.Table, batch).to_pylist())
        ray.get(stats_actor.driver_gap.remote("finish", par))  # every task has ended: the workers wait from here
    counters: Counters = ray.get(stats_actor.snapshot.remote())
    overhead: dict[str, float] = ray.get(stats_actor.overheads.remote(par))
    repeated: dict[str, int] = ray.get(stats_actor.repeated.remote())
    if repeated:
        emit(ev.LogLine(level="warning", message="curate: Ray ran work again after losing a worker; batches it had "
                                                 f"counted already were not counted twice: {repeated}"))
    if rejected_dir:
        _drop_stale_rejects(rejected_dir, attempt)
    emit(ev.StageCounters(stages=counters))
    return CurateResult(parts, counters, len(files), attempt, repeated, whole(parts), input_records(spec, files),
                        overhead)


def _write_part(table: pa.Table, folder: str, stats: ActorHandle, started: float) -> pa.Table:
    """:func:`write_part`, its seconds (and its worker process's start) counted as the phase's ``write_parts``."""
    t0 = time.perf_counter() - process_start_seconds(started)
    out = write_part(table, folder)
    if table.num_rows:
        ray.get(stats.add_overhead.remote("write_parts", time.perf_counter() - t0, batch_key(table.column("ord")),
                                          at=time.time()))
    return out


def input_records(spec: JobSpec, files: list[tuple[int, InputSpec, str]]) -> tuple[JsonObject, ...]:
    """Per spec input: its files, their bytes, a fingerprint (sha256 over each file's name below the input and
    size: the same files give the same one, wherever they lie) and its first file index (an input without
    files: where the next one starts). One stat per file, on the driver, as listing them took."""
    out: list[JsonObject] = []
    n = len(files)
    for inp in reversed(spec.inputs):
        mine = [p for _, s, p in files if s is inp]
        n = next((i for i, s, _ in files if s is inp), n)
        sizes = [_size(p) for p in mine]
        digest = hashlib.sha256()
        for p, size in zip(mine, sizes, strict=True):
            digest.update(f"{source_name(inp.path, p)}\t{size}\n".encode())
        out.append({"path": inp.path, "format": inp.format, "files": len(mine), "bytes": sum(sizes),
                    "sha256": digest.hexdigest(), "start": n})
    return tuple(reversed(out))


def _size(path: str) -> int:
    """A local file's size (one stat); 0 for an object (a request per object would slow a large listing down:
    its fingerprint is then over names only) and for an unreadable file (the reader counts it)."""
    if storage.is_remote(path):
        return 0
    try:
        return storage.size(path)
    except OSError:
        return 0


def _drop_stale_rejects(rejected_dir: str, attempt: int) -> None:
    """Remove from ``rejected/`` what is not this attempt's: files a failed attempt's stragglers wrote after
    the folder was emptied, and the temporary file of a write cut short with its worker."""
    tag = reject_file_tag(attempt)
    for path in storage.list_files(rejected_dir):
        name = storage.name(path)
        if not (name.startswith(tag) and name.endswith(".jsonl")):
            storage.delete_file(path)


class _CounterReporter:
    """A daemon thread that emits every stage's counters while curation runs (best effort)."""

    def __init__(self, stats_actor: ActorHandle, emit: EventSink, every: float = 1.0):
        self.stats_actor, self.emit, self.every = stats_actor, emit, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenmill-counters", daemon=True)

    def __enter__(self) -> _CounterReporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every + 5)

    def _run(self) -> None:
        last: Counters | None = None
        while not self._stop.wait(self.every):
            try:
                snap = cast(Counters, ray.get(self.stats_actor.snapshot.remote(), timeout=self.every * 5))
            except Exception:  # noqa: BLE001 - progress must never disturb the job
                continue
            if snap != last:
                last = snap
                read: dict[str, object] = snap.get(READ_KEY) or {}
                self.emit(ev.StageCounters(stages=snap))
                docs_in = read.get("docs_in", 0)
                done = int(docs_in) if isinstance(docs_in, int | float) else 0
                self.emit(ev.PhaseProgress(phase="curate", done=done, total=None, unit="docs"))
