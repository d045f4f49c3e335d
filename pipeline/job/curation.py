"""The curate and tokenizer phases on Ray: the graph of readers and stages, its counters, the tokenizer.

Stages count through one path (:class:`pipeline.job.stats.StageRecorder` into one stats actor):
readers, batch stages and dataset stages alike, so ``stats.json`` and the live counters agree.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pipeline import storage
from pipeline.job import events as ev
from pipeline.spec import JobSpec

#: stage key of the reader in counters and ``rejected/``
READ_KEY = "00-read"


def parallelism(requested: int | None) -> int:
    """Workers per stage: the spec's number, else the cluster's CPUs."""
    import ray

    return requested or max(1, int(ray.cluster_resources().get("CPU", 1)))


#: times the curate phase is run when Ray loses work it cannot rebuild (see :func:`curate`)
CURATE_ATTEMPTS = 3


def curate(spec: JobSpec, curated_dir: str, stage_dir: str, par: int, emit: Callable[[ev.Event], None],
           check_cancel: Callable[[], None]) -> dict[str, Any]:
    """Read and curate every input; write the kept documents as Parquet parts in ``curated_dir``.

    Returns the phase's record: the parts (name, rows, first ord, writer), the number of documents
    and every stage's counters. Dropped documents go to ``stage_dir/rejected``, dedup indexes to
    ``stage_dir/index``: both are published with the shards.

    A node lost mid-phase is Ray's to recover: its tasks and actor tasks run again elsewhere (Ray Data
    restarts a pool's actors and retries their tasks by default, ``max_restarts=-1`` and
    ``max_task_retries=-1``; a restarted actor needs room on another node) and the blocks it held are
    rebuilt from their lineage; each batch run again is counted once (:mod:`pipeline.job.stats`). Work Ray
    cannot rebuild (an object whose lineage or owner is gone) fails the attempt with an object, actor or
    node loss: the phase then starts over from empty folders and a new stats actor, at most
    :data:`CURATE_ATTEMPTS` times in all.
    """
    from pipeline.job.engine import JobError

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
    import ray.exceptions as rex

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


def _curate_once(spec: JobSpec, curated_dir: str, stage_dir: str, par: int, emit: Callable[[ev.Event], None],
                 check_cancel: Callable[[], None], attempt: int) -> dict[str, Any]:
    import ray

    from pipeline.dedup.index import DedupIndexError
    from pipeline.job.engine import JobError
    from pipeline.job.stats import StageRecorder, start_stats_actor
    from pipeline.output.curated import write_part
    from pipeline.readers import expand_inputs

    stats_actor = start_stats_actor()
    rejected_dir = storage.join(stage_dir, "rejected") if spec.output.write_rejected else None

    def recorder(key: str) -> StageRecorder:
        return StageRecorder(key, stats_actor, rejected_dir, attempt)

    files = expand_inputs(spec.inputs)
    reporter = _CounterReporter(stats_actor, emit)
    parts: list[dict[str, Any]] = []
    with reporter:
        try:
            ds = _graph(spec, files, stage_dir, par, recorder)
        except DedupIndexError as exc:
            raise JobError(str(exc), "validation") from None
        # no CPU of its own: the stages' actor pools may hold every CPU until their output is consumed
        ds = ds.map_batches(write_part, fn_kwargs={"folder": curated_dir}, batch_size=None, batch_format="pyarrow",
                            num_cpus=0, concurrency=par)
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None, prefetch_batches=0):
            check_cancel()
            parts.extend(batch.to_pylist())
    counters = ray.get(stats_actor.snapshot.remote())
    repeated = ray.get(stats_actor.repeated.remote())
    if repeated:
        emit(ev.LogLine(level="warning", message="curate: Ray ran work again after losing a worker; batches it had "
                                                 f"counted already were not counted twice: {repeated}"))
    if rejected_dir:
        _drop_stale_rejects(rejected_dir, attempt)
    emit(ev.StageCounters(stages=counters))
    return {"parts": parts, "docs": sum(p["rows"] for p in parts), "stages": counters, "files": len(files),
            "writers": sorted({p["writer"] for p in parts}), "attempts": attempt, "repeated_reports": repeated}


def _drop_stale_rejects(rejected_dir: str, attempt: int) -> None:
    """Remove from ``rejected/`` what is not this attempt's: files a failed attempt's stragglers wrote after
    the folder was emptied, and the temporary file of a write cut short with its worker."""
    from pipeline.job.stats import reject_file_tag

    tag = reject_file_tag(attempt)
    for path in storage.list_files(rejected_dir):
        name = storage.name(path)
        if not (name.startswith(tag) and name.endswith(".jsonl")):
            storage.delete_file(path)


def _graph(spec: JobSpec, files: list, stage_dir: str, par: int, recorder: Callable[[str], Any]) -> Any:
    """Read every file, then each stage in spec order (dataset stages run eagerly inside ``apply``)."""
    import ray
    from ray.data import ActorPoolStrategy

    from pipeline.job.udfs import READ_BATCH, BatchStageRunner, ReadFiles, StageChain
    from pipeline.stages import DatasetStage, StageContext, stage_class

    ds = ray.data.from_items(
        [{"file_index": i, "path": p, "input": inp.model_dump_json()} for i, inp, p in files],
        override_num_blocks=max(1, len(files)),
    )
    chain: list[tuple[Any, ...]] = []  # consecutive batch stages that ask for the same resources: one operator
    chain_resources: dict[str, float] | None = None
    read = True  # the readers are not in the graph yet

    def flush(ds: Any) -> Any:
        nonlocal chain, chain_resources, read
        if read:
            # the batch stages right after the readers run in the readers' workers when there are files enough
            # to keep every worker busy and they need nothing but CPU (ReadFiles: one pool, no Arrow round trip)
            fuse = bool(chain) and len(files) >= 2 * par and set(chain_resources or {}) <= {"num_cpus"} and (
                chain_resources or {}).get("num_cpus", 1) == 1
            ds = ds.map_batches(
                ReadFiles, fn_constructor_args=(recorder(READ_KEY), chain if fuse else None,
                                                spec.execution.batch_size if fuse else READ_BATCH),
                batch_size=1, batch_format="pyarrow", compute=ActorPoolStrategy(size=min(par, max(1, len(files)))),
            )
            read = False
            if fuse:
                chain, chain_resources = [], None
        if chain:
            ds = ds.map_batches(
                StageChain, fn_constructor_args=(chain,), batch_size=spec.execution.batch_size,
                batch_format="pyarrow", compute=ActorPoolStrategy(size=par), **_ray_resources(chain_resources or {}),
            )
        chain, chain_resources = [], None
        return ds

    for i, stage_spec in enumerate(spec.stages, start=1):
        cls = stage_class(stage_spec.type)
        params = spec.stage_params(i - 1)
        ctx = StageContext(spec.name, stage_dir, i, storage.join(stage_dir, "index"), spec.execution.seed)
        key = f"{i:02d}-{cls.name}"
        if isinstance(cls, type) and issubclass(cls, DatasetStage):
            ds = cls(params, ctx).apply(flush(ds), recorder(key))
            if cls.reorders:
                ds = ds.sort("ord")
        else:
            if chain and cls.resources != chain_resources:
                ds = flush(ds)
            chain_resources = dict(cls.resources)
            chain.append(BatchStageRunner.constructor_args(cls, params, ctx, recorder(key)))  # prepare(), once
    return flush(ds)


class _CounterReporter:
    """A daemon thread that emits every stage's counters while curation runs (best effort)."""

    def __init__(self, stats_actor: Any, emit: Callable[[ev.Event], None], every: float = 1.0):
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
        import ray

        last = None
        while not self._stop.wait(self.every):
            try:
                snap = ray.get(self.stats_actor.snapshot.remote(), timeout=self.every * 5)
            except Exception:  # noqa: BLE001 - progress must never disturb the job
                continue
            if snap != last:
                last = snap
                read = snap.get(READ_KEY, {})
                self.emit(ev.StageCounters(stages=snap))
                self.emit(ev.PhaseProgress(phase="curate", done=int(read.get("docs_in", 0)), total=None, unit="docs"))


def make_tokenizer(spec: JobSpec, curated_dir: str, part_records: list[dict[str, Any]]) -> tuple[str, Any]:
    """Train BPE on the first documents in corpus order (bounded), or load ``tokenizer.path``; returns the
    tokenizer's JSON and its :class:`~pipeline.tokenize.TokenizerInfo` (a Ray task runs it)."""
    from pipeline.job.engine import JobError
    from pipeline.output.curated import sample_texts, sorted_parts
    from pipeline.tokenize import TokenizerInfo, load_tokenizer, special_tokens, train_bpe

    tspec = spec.tokenizer
    if tspec.path:
        try:
            tok = load_tokenizer(tspec.path)
        except ValueError as exc:
            raise JobError(str(exc), "validation") from None
    else:
        texts = sample_texts(curated_dir, sorted_parts(part_records), tspec.train.sample_docs, tspec.train.sample_bytes)
        tok = train_bpe(texts, tspec.train.vocab_size, tspec.train.min_frequency, special_tokens(tspec))
    try:
        return tok.to_str(), TokenizerInfo.resolve(tok, tspec)
    except ValueError as exc:
        raise JobError(str(exc), "validation") from None


def tokenizer_info(tok_json: str, spec: JobSpec) -> Any:
    from tokenizers import Tokenizer

    from pipeline.tokenize import TokenizerInfo

    return TokenizerInfo.resolve(Tokenizer.from_str(tok_json), spec.tokenizer)


def _ray_resources(resources: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "num_cpus" in resources:
        out["num_cpus"] = resources["num_cpus"]
    if "num_gpus" in resources:
        out["num_gpus"] = resources["num_gpus"]
    extra = {k: v for k, v in resources.items() if k not in ("num_cpus", "num_gpus")}
    if extra:
        out["resources"] = extra
    return out

