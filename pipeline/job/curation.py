"""The curate and tokenizer phases on Ray: the graph of readers and stages, its counters, the tokenizer.

Stages count through one path (:class:`pipeline.job.stats.StageRecorder` into one stats actor):
readers, batch stages and dataset stages alike, so ``stats.json`` and the live counters agree.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.job import events as ev
from pipeline.spec import JobSpec

#: stage key of the reader in counters and ``rejected/``
READ_KEY = "00-read"


def parallelism(requested: int | None) -> int:
    """Workers per stage: the spec's number, else the cluster's CPUs."""
    import ray

    return requested or max(1, int(ray.cluster_resources().get("CPU", 1)))


def curate(spec: JobSpec, curated_dir: str, stage_dir: str, par: int, emit: Callable[[ev.Event], None],
           check_cancel: Callable[[], None]) -> dict[str, Any]:
    """Read and curate every input; write the kept documents as Parquet parts in ``curated_dir``.

    Returns the phase's record: the parts (name, rows, first ord, writer), the number of documents
    and every stage's counters. Dropped documents go to ``stage_dir/rejected``, dedup indexes to
    ``stage_dir/index``: both are published with the shards.
    """
    import ray

    from pipeline.dedup.index import DedupIndexError
    from pipeline.job.engine import JobError
    from pipeline.job.stats import StageRecorder, StatsActor
    from pipeline.output.curated import write_part
    from pipeline.readers import expand_inputs

    stats_actor = StatsActor.remote()
    rejected_dir = str(Path(stage_dir) / "rejected") if spec.output.write_rejected else None

    def recorder(key: str) -> StageRecorder:
        return StageRecorder(key, stats_actor, rejected_dir)

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
    emit(ev.StageCounters(stages=counters))
    return {"parts": parts, "docs": sum(p["rows"] for p in parts), "stages": counters, "files": len(files),
            "writers": sorted({p["writer"] for p in parts})}


def _graph(spec: JobSpec, files: list, stage_dir: str, par: int, recorder: Callable[[str], Any]) -> Any:
    """Read every file, then each stage in spec order (dataset stages run eagerly inside ``apply``)."""
    import ray
    from ray.data import ActorPoolStrategy

    from pipeline.job.udfs import BatchStageRunner, ReadFiles, StageChain
    from pipeline.stages import DatasetStage, StageContext, stage_class

    ds = ray.data.from_items(
        [{"file_index": i, "path": p, "input": inp.model_dump_json()} for i, inp, p in files],
        override_num_blocks=max(1, len(files)),
    )
    ds = ds.map_batches(
        ReadFiles, fn_constructor_args=(recorder(READ_KEY),), batch_size=1, batch_format="pyarrow",
        compute=ActorPoolStrategy(size=min(par, max(1, len(files)))),
    )
    chain: list[tuple[Any, ...]] = []  # consecutive batch stages that ask for the same resources: one operator
    chain_resources: dict[str, float] | None = None

    def flush(ds: Any) -> Any:
        nonlocal chain, chain_resources
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
        ctx = StageContext(spec.name, stage_dir, i, str(Path(stage_dir) / "index"), spec.execution.seed)
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

