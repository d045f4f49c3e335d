"""Writing a stage: the one stage interface, from a batch of documents to kept documents and drops.

A document is a :class:`~pipeline.documents.Document` (a TypedDict) with ``id``, ``text``, ``source``, ``ord``
(its position in the input, used to restore a deterministic order), ``meta`` (a dict: annotations go here)
and ``segments`` (SFT spans). A built-in stage is one line in :data:`pipeline.stages.REGISTRY`
(``"name": "module:Class"``); a stage of one's own needs none: a spec names it as ``module:Class``, or its installed
package declares it as a ``tokenmill.stages`` entry point (:mod:`pipeline.stages.custom`, docs/writing-a-stage.md).

**Kinds.** :class:`Stage` sees one batch at a time: implement ``process(docs)`` and yield each
document (possibly edited) or a :class:`~pipeline.documents.Drop` with a reason. :class:`FilterStage`
is a per-document keep/drop decision: implement ``filter(doc)``. :class:`DatasetStage` needs the whole
dataset (dedup): implement ``apply(ds, recorder)`` on the Ray Dataset.

**Params.** ``Params`` is a pydantic model inheriting :class:`StageParams` (unknown keys refused);
a filter's inherits :class:`FilterParams`. The spec is parsed once; a stage reads ``self.params``, and
declares its type next to ``Params`` (``params: LengthParams``) so its fields are type-checked.
Check files in ``preflight()``, not in the model. A check of one parameter, in ``preflight()`` or in
a ``Params`` validator, raises :class:`~pipeline.problems.ParamError` ``("param", "why")``: the spec's
problem is then placed at ``stages.<i>.params.<param>``.

**Filters.** ``filter(doc)`` returns ``True`` (keep), a reason string (drop), or a
:class:`Verdict` ``(keep, reason, scores)`` whose ``scores`` are per-document floats (a ratio, a
language probability). Name reasons by rule (``gopher_quality:symbol_word_ratio``). Every filter has
``mode``: in ``filter`` mode (default) a drop goes to ``rejected/`` with ``detail.scores``; in
``annotate`` mode every document is kept and the verdict is written to its metadata as
``meta["filters"][stage.name] = {"keep": bool, "reason": str | None, "scores": {...}, "at": stage_index}``, and each
would-be drop is counted as ``would_drop:<reason>``. A filter that also edits text overrides
``process`` and calls ``self.judge(doc, verdict)``.

**Counters and scores.** ``self.count("lines_removed", 3)`` adds to a counter and
``self.observe("entities", 2.0)`` records a per-document score; verdict scores are observed for you.
The runner collects them after every batch (a stage never talks to Ray or the stats actor); they end
in ``stats.json`` under the stage's entry as ``"counters": {name: n}`` and ``"scores": {name: {count,
min, max, mean, p01, p10 ... p90, p99}}`` (quantiles within 1 %, merged across workers), next to
``docs_in``, ``docs_out``, ``dropped``, ``bytes_in``, ``bytes_out`` and ``seconds``. Each batch counts
once even when Ray runs it again after losing a worker or a node (the runner names every report by the
batch's documents; :mod:`pipeline.job.stats`).

**Expensive state.** ``prepare()`` runs once per job on the driver, before any worker starts (build
an n-gram index, load a model); its return value goes through Ray's object store to every worker,
where it is ``self.prepared`` by the time ``setup()`` runs (once per worker: open files, compile
regexes). Neither runs per batch. Keep heavy imports (Ray, torch, fastText, Presidio) inside
``prepare``/``setup``/``apply``: validating a spec imports the stage module and must stay cheap.

Run a batch stage without Ray (tests, notebooks) with :func:`run_batch`, or ``tokenmill.apply`` (as a job runs it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from pipeline.documents import Doc, Drop
from pipeline.stages.metrics import StageMetrics
from pipeline.stages.recorder import Recorder

if TYPE_CHECKING:  # Ray only for the annotation: validating a spec imports this module and must not import Ray
    from ray.data import Dataset


class StageParams(BaseModel):
    """Base of every stage's ``Params``: a typo in a spec is refused, not ignored."""

    model_config = ConfigDict(extra="forbid")


#: a stage without parameters
NoParams = StageParams


class FilterParams(StageParams):
    """Base of every filter's ``Params``."""

    #: ``filter``: drop what fails; ``annotate``: keep everything, write the verdict to ``meta["filters"]``
    mode: Literal["filter", "annotate"] = "filter"


@dataclass(frozen=True)
class Verdict:
    """A filter's decision on one document; ``reason`` names the rule that failed (default: the stage)."""

    keep: bool
    reason: str | None = None
    scores: dict[str, float] = field(default_factory=dict)

    def annotation(self) -> dict[str, Any]:
        """The verdict as stored in ``meta["filters"][stage]`` in annotate mode."""
        return {"keep": self.keep, "reason": None if self.keep else self.reason, "scores": dict(self.scores)}


@dataclass
class StageContext:
    """What a stage may know about the job it runs in."""

    job_name: str
    output_dir: str
    stage_index: int
    work_dir: str
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Stage:
    """A batch stage. Subclasses set ``name`` and ``Params`` and implement :meth:`process`."""

    name: ClassVar[str] = "stage"
    Params: ClassVar[type[BaseModel]] = NoParams
    #: Ray resources of one worker of this stage (e.g. ``{"num_cpus": 1}``, ``{"num_gpus": 1}``).
    resources: ClassVar[dict[str, float]] = {"num_cpus": 1}
    #: params holding a path or a list of paths: relative ones resolve against a spec file's folder
    path_params: ClassVar[tuple[str, ...]] = ()

    #: what :meth:`prepare` returned on the driver (None when it returned nothing), set before :meth:`setup`
    prepared: Any = None
    #: the parsed ``Params`` (a subclass narrows the annotation to its own model)
    params: BaseModel

    def __init__(self, params: BaseModel, ctx: StageContext):
        self.params = params
        self.ctx = ctx

    def prepare(self) -> Any:
        """Once per job, on the driver: build what every worker shares (an index, a model). The value
        reaches each worker through Ray's object store as ``self.prepared``; keep it plain data."""
        return None

    def setup(self) -> None:
        """Once per worker, after ``self.prepared`` is set: load models, compile patterns."""

    def preflight(self) -> None:
        """Checks that need the filesystem (a model file, an earlier index), run when the spec is
        validated so a bad path is refused before any work; raise :class:`~pipeline.problems.ParamError`
        naming the param (a plain ValueError is placed at the stage's params as a whole)."""

    def process(self, docs: list[Doc]) -> Iterable[Doc | Drop]:
        raise NotImplementedError

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to this stage's counter ``name`` (summed over batches and workers)."""
        self._recording().count(name, n)

    def observe(self, name: str, value: float) -> None:
        """Record one document's score ``name`` (summarised as a distribution in ``stats.json``)."""
        self._recording().observe(name, value)

    def take_metrics(self) -> StageMetrics:
        """Hand over and reset what was recorded (the runner calls it after each batch)."""
        return self.__dict__.pop("_stage_metrics", None) or StageMetrics()

    def _recording(self) -> StageMetrics:
        # created lazily so a subclass __init__ that skips super().__init__ still counts
        m = self.__dict__.get("_stage_metrics")
        if m is None:
            m = self.__dict__["_stage_metrics"] = StageMetrics()
        return m


class FilterStage(Stage):
    """A per-document filter: :meth:`filter` returns True, a drop reason, or a :class:`Verdict`."""

    Params: ClassVar[type[BaseModel]] = FilterParams
    params: FilterParams

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if not (isinstance(cls.Params, type) and issubclass(cls.Params, FilterParams)):
            raise TypeError(f"{cls.__name__}.Params must inherit pipeline.stages.base.FilterParams (for `mode`)")

    def filter(self, doc: Doc) -> bool | str | Verdict:
        raise NotImplementedError

    def process(self, docs: list[Doc]) -> Iterator[Doc | Drop]:
        for doc in docs:
            yield self.judge(doc, self.filter(doc))

    def judge(self, doc: Doc, verdict: bool | str | Verdict) -> Doc | Drop:
        """Apply a verdict in this stage's mode: observe its scores, then keep, drop or annotate."""
        v = self.verdict(verdict)
        if v.scores:  # a dozen scores a document: one lookup of the recording, not one per score
            observe = self._recording().observe
            for name, value in v.scores.items():
                observe(name, value)
        if self.params.mode == "annotate":
            meta = doc.get("meta")
            if not isinstance(meta, dict):
                meta = json.loads(meta) if meta else {}
                doc["meta"] = meta
            # "at": the stage's position, so a report or a later job applies stored verdicts in pipeline order
            meta.setdefault("filters", {})[self.name] = {**v.annotation(), "at": getattr(self.ctx, "stage_index", 0)}
            if not v.keep:
                self.count(f"would_drop:{v.reason}")
            return doc
        if v.keep:
            return doc
        return Drop(doc, v.reason or self.name, {"scores": dict(v.scores)} if v.scores else {})

    def verdict(self, value: bool | str | Verdict) -> Verdict:
        """What :meth:`filter` returned, as a :class:`Verdict` (False or no reason: the stage's name)."""
        if isinstance(value, Verdict):
            return value if value.keep or value.reason else Verdict(False, self.name, value.scores)
        if value is True:
            return Verdict(True)
        if value is False:
            return Verdict(False, self.name)
        if isinstance(value, str) and value:
            return Verdict(False, value)
        raise TypeError(f"{type(self).__name__}.filter returned {value!r}: expected True, a reason or a Verdict")


@dataclass
class BatchResult:
    """One batch through a stage: kept documents, drops, and what the stage counted."""

    kept: list[Doc]
    drops: list[Drop]
    metrics: StageMetrics


def run_batch(stage: Stage, docs: list[Doc]) -> BatchResult:
    """Run ``stage`` on one batch and collect its output and metrics (what the Ray runner does per batch)."""
    kept: list[Doc] = []
    drops: list[Drop] = []
    for item in stage.process(docs):
        if isinstance(item, Drop):
            drops.append(item)
        else:
            kept.append(item)
    return BatchResult(kept, drops, stage.take_metrics())


class DatasetStage:
    """A stage that needs the whole dataset (a shuffle, a join, connected components).

    ``apply`` must keep memory bounded per worker and never gather the corpus on the driver.
    The runner restores the ``ord`` order after it when ``reorders`` is True.
    """

    name: ClassVar[str] = "dataset_stage"
    Params: ClassVar[type[BaseModel]] = NoParams
    reorders: ClassVar[bool] = True
    #: as :attr:`Stage.path_params`
    path_params: ClassVar[tuple[str, ...]] = ()
    #: as :attr:`Stage.params`
    params: BaseModel

    def __init__(self, params: BaseModel, ctx: StageContext):
        self.params = params
        self.ctx = ctx

    def preflight(self) -> None:
        """As :meth:`Stage.preflight`."""

    def apply(self, ds: Dataset, recorder: Recorder) -> Dataset:
        """Return the dataset (rows in :data:`pipeline.documents.DOC_SCHEMA`) without the dropped documents.

        ``recorder`` is a :class:`~pipeline.stages.recorder.Recorder` (in a job, a
        :class:`pipeline.job.stats.StageRecorder`): call ``recorder.rejects(batch)`` from Ray tasks with
        the dropped rows (they must carry ``reason`` and may carry ``detail``) and
        ``recorder.counts(docs_in=..., docs_out=..., dropped={reason: n}, bytes_in=..., seconds=...,
        metrics=StageMetrics)`` (the last for the stage's own counters and scores).

        Ray runs a task again when a worker or node is lost, and the re-run reports again: a report made in
        a Ray task is named by the task and its place in it, and a repeat is counted once (its rejected
        file written once). Pass ``key=`` to both calls to name the batch yourself (e.g.
        :func:`pipeline.job.stats.batch_key` of its ords) when another task could report the same batch.
        """
        raise NotImplementedError
