"""The curate phase's Ray Data graph: the readers, then every stage in spec order.

Consecutive batch stages that ask for the same resources run as one operator (:class:`StageChain`): a
batch crosses Arrow and the object store once, and ten filters need one pool of workers, not ten. With
at least two input files per worker, the batch stages right after the readers run inside the readers'
own workers (:class:`ReadFiles`). Dataset stages (dedup) run eagerly inside their ``apply``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import ray
from ray.data import ActorPoolStrategy, Dataset

from pipeline import storage
from pipeline.job.pools import fused_into_readers, reader_actors
from pipeline.job.stats import StageRecorder
from pipeline.job.udfs import READ_BATCH, BatchStageRunner, ReadFiles, StageChain, StageLink
from pipeline.spec import InputSpec, JobSpec
from pipeline.stages import DatasetStage, StageContext, stage_class
from pipeline.stages.custom import travelling_modules

#: stage key of the reader in counters and ``rejected/``
READ_KEY = "00-read"
Recorder = Callable[[str], StageRecorder]
#: ``(file_index, input, path)`` of every input file (:func:`pipeline.readers.expand_inputs`)
InputFiles = list[tuple[int, InputSpec, str]]


def build_graph(spec: JobSpec, files: InputFiles, stage_dir: str, par: int, recorder: Recorder) -> Dataset:
    """Read every file, then each stage in spec order; ``recorder(key)`` counts stage ``key``."""
    for module in travelling_modules():  # a module:Class from the spec's folder: not on the workers' path
        ray.cloudpickle.register_pickle_by_value(module)
    return _Graph(spec, files, stage_dir, par, recorder).build()


def stage_key(index: int, stage_type: str) -> str:
    """Stage ``index`` (from 1, spec order)'s key in counters, ``stats.json`` and ``rejected/``: ``01-normalize``."""
    return f"{index:02d}-{stage_class(stage_type).name}"


def stage_keys(spec: JobSpec) -> tuple[str, ...]:
    """Every curation stage's key, in spec order (what ``job_started`` tells a display to expect)."""
    return tuple(stage_key(i, s.type) for i, s in enumerate(spec.stages, start=1))


@dataclass
class _Graph:
    """The graph as it grows: the batch stages waiting to become one operator, and whether the readers are in."""

    spec: JobSpec
    files: InputFiles
    stage_dir: str
    par: int
    recorder: Recorder
    #: consecutive batch stages that ask for the same resources, not in the graph yet
    chain: list[StageLink] = field(default_factory=list)
    chain_resources: dict[str, float] | None = None
    readers_added: bool = False

    def build(self) -> Dataset:
        ds: Dataset = ray.data.from_items(
            [{"file_index": i, "path": p, "input": inp.model_dump_json()} for i, inp, p in self.files],
            override_num_blocks=max(1, len(self.files)),
        )
        for i, stage_spec in enumerate(self.spec.stages, start=1):
            cls = stage_class(stage_spec.type)
            params = self.spec.stage_params(i - 1)
            ctx = StageContext(self.spec.name, self.stage_dir, i, storage.join(self.stage_dir, "index"),
                               self.spec.execution.seed)
            key = stage_key(i, stage_spec.type)
            if isinstance(cls, type) and issubclass(cls, DatasetStage):
                ds = cls(params, ctx).apply(self.flush(ds), self.recorder(key))
                if cls.reorders:
                    ds = ds.sort("ord")
            else:
                if self.chain and cls.resources != self.chain_resources:
                    ds = self.flush(ds)
                self.chain_resources = dict(cls.resources)
                # prepare() runs here, once per job, on the driver
                self.chain.append(BatchStageRunner.constructor_args(cls, params, ctx, self.recorder(key)))
        return self.flush(ds)

    def flush(self, ds: Dataset) -> Dataset:
        """Put the readers (the first time) and the waiting chain into the graph."""
        if not self.readers_added:
            ds = self._readers(ds)
        if self.chain:
            resources = self.chain_resources or {}
            custom = {k: v for k, v in resources.items() if k not in ("num_cpus", "num_gpus")}
            ds = ds.map_batches(
                StageChain, fn_constructor_args=(self.chain,), batch_size=self.spec.execution.batch_size,
                batch_format="pyarrow", compute=ActorPoolStrategy(size=self.par), num_cpus=resources.get("num_cpus"),
                num_gpus=resources.get("num_gpus"), resources=custom or None,
            )
        self.chain, self.chain_resources = [], None
        return ds

    def _readers(self, ds: Dataset) -> Dataset:
        # the batch stages right after the readers run in the readers' workers when there are files enough to keep
        # every worker busy and they need nothing but one CPU (ReadFiles: one pool, no Arrow round trip)
        resources = self.chain_resources or {}
        fuse = fused_into_readers(bool(self.chain), resources, len(self.files), self.par)
        ds = ds.map_batches(
            ReadFiles, fn_constructor_args=(self.recorder(READ_KEY), self.chain if fuse else None,
                                            self.spec.execution.batch_size if fuse else READ_BATCH),
            batch_size=1, batch_format="pyarrow",
            compute=ActorPoolStrategy(size=reader_actors(self.par, len(self.files))),
        )
        self.readers_added = True
        if fuse:
            self.chain, self.chain_resources = [], None
        return ds

