"""``tokenmill.apply(stage, docs)``: one stage on a list of documents, in this process, without Ray.

A stage runs here as a job's worker runs it (:class:`pipeline.job.udfs.BatchStageRunner`): its ``Params`` come
through JSON as the worker gets them, ``prepare()`` then ``setup()`` run once, and the documents go through
:func:`pipeline.stages.base.run_batch` in batches of the job's ``execution.batch_size``. So a stage keeps and
drops here what it keeps and drops in a job (tests/test_library.py runs the same documents through both). A
dataset stage (dedup) needs the whole dataset on Ray: run it in a job.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from pipeline.documents import Document
from pipeline.problems import PREFLIGHT, ParamError, Problem, SpecError, parse_model, problems_of
from pipeline.spec import ExecutionSpec, StageSpec
from pipeline.stages import DatasetStage, Stage, StageContext, stage_class
from pipeline.stages.base import run_batch
from pipeline.stages.custom import StageClass
from pipeline.stages.metrics import StageMetrics

#: what names a stage: a spec's stage entry (``{"type": ..., "params": {...}}``), its type, its class, or a
#: stage made by :func:`stage`
StageLike = Mapping[str, Any] | StageSpec | str | type[Stage] | Stage
#: documents per batch, as in a job that leaves ``execution.batch_size`` alone
BATCH_SIZE: int = ExecutionSpec.model_fields["batch_size"].default

#: stages whose ``prepare()`` and ``setup()`` have run (made by :func:`stage`, or by :func:`apply` once)
_READY: weakref.WeakSet[Stage] = weakref.WeakSet()


@dataclass(frozen=True)
class Dropped:
    """A document a stage dropped, why (``reason``, as in ``stats.json``), and the stage's ``detail`` (scores)."""

    doc: Document
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Applied:
    """What a stage did to the documents: those it kept (iterate the result for them), those it dropped, and its
    own counters and per-document scores (what ``stats.json`` summarises under the stage)."""

    kept: list[Document]
    dropped: list[Dropped]
    metrics: StageMetrics

    @property
    def counters(self) -> dict[str, int]:
        return dict(self.metrics.counters)

    @property
    def scores(self) -> dict[str, dict[str, Any]]:
        """Each score's distribution (count, min, max, mean, quantiles), as ``stats.json`` writes it."""
        return {name: sketch.summary() for name, sketch in self.metrics.scores.items()}

    def __iter__(self) -> Iterator[Document]:
        return iter(self.kept)

    def __len__(self) -> int:
        return len(self.kept)


def stage(entry: StageLike, params: Mapping[str, Any] | None = None) -> Stage:
    """A stage ready to run (``prepare()`` and ``setup()`` done), for several :func:`apply` calls that load its
    model once. ``entry`` as for :func:`apply`; ``params`` with a type or a class. :class:`SpecError` names a
    bad field (``params.min_chars: ...``), an unknown type or a ``module:Class`` that cannot be imported."""
    if isinstance(entry, Stage):
        return _ready(entry)
    cls, validated = _resolve(entry, params)
    if not issubclass(cls, Stage):
        raise SpecError.one(("type",), f"{cls.name!r} needs the whole dataset on Ray (a dataset stage): run it in a "
                                       "job (tokenmill.run)", "dataset_stage")
    # through JSON, as a job's worker builds it (pipeline.job.udfs.BatchStageRunner)
    made = cls(cls.Params.model_validate_json(validated.model_dump_json()), StageContext("apply", "", 1, ""))
    try:
        made.preflight()
    except ParamError as exc:
        raise SpecError([exc.problem(("params",), PREFLIGHT)]) from None
    except ValueError as exc:
        raise SpecError([Problem(("params",), str(exc), PREFLIGHT)]) from None
    return _ready(made)


def apply(entry: StageLike, docs: Iterable[Mapping[str, Any]], params: Mapping[str, Any] | None = None,
          batch_size: int = BATCH_SIZE) -> Applied:
    """Run one stage on ``docs`` (dicts with ``text`` and, optionally, ``id``, ``meta``, ``source``) and return
    what it kept and dropped. ``entry``: a spec's stage entry (``{"type": "length", "params": {...}}``), a type
    (``"gopher_quality"``, an installed stage, ``"mypkg.filters:MyFilter"``) or a stage class with ``params``,
    or a stage from :func:`stage`. The documents are copied, so a stage that edits them leaves the caller's
    alone; missing fields get a job's defaults (``id``: the position, ``source`` empty, ``meta`` ``{}``)."""
    ready = stage(entry, params)
    kept: list[Document] = []
    dropped: list[Dropped] = []
    metrics = StageMetrics()
    batch: list[Document] = []
    for i, doc in enumerate(docs):
        batch.append(_document(i, doc))
        if len(batch) >= batch_size:
            _run(ready, batch, kept, dropped, metrics)
            batch = []
    if batch:
        _run(ready, batch, kept, dropped, metrics)
    return Applied(kept, dropped, metrics)


def _run(ready: Stage, batch: list[Document], kept: list[Document], dropped: list[Dropped],
         metrics: StageMetrics) -> None:
    result = run_batch(ready, batch)
    kept += result.kept
    dropped += [Dropped(d.doc, d.reason, dict(d.detail)) for d in result.drops]  # type: ignore[arg-type]
    metrics.merge(result.metrics)


def _resolve(entry: StageLike, params: Mapping[str, Any] | None) -> tuple[StageClass, BaseModel]:
    """The stage class ``entry`` names and its validated ``Params``: checked as a spec's stage entry is (the same
    checks, the same messages)."""
    if isinstance(entry, type):
        if not issubclass(entry, (Stage, DatasetStage)):
            raise SpecError.one(("type",), f"{entry!r} is not a stage: subclass tokenmill.Stage or FilterStage",
                                "not_a_stage")
        try:
            return entry, entry.Params.model_validate(dict(params or {}))
        except ValidationError as exc:
            raise SpecError([p.under("params") for p in problems_of(exc)]) from None
    if isinstance(entry, str):
        entry = {"type": entry, "params": dict(params or {})}
    elif params is not None:
        raise TypeError("params go inside a stage entry: {'type': ..., 'params': {...}}")
    spec = entry if isinstance(entry, StageSpec) else parse_model(StageSpec, dict(entry))  # type: ignore[arg-type]
    return stage_class(spec.type), spec.validated


def _ready(made: Stage) -> Stage:
    if made not in _READY:
        made.prepared = made.prepare()
        made.setup()
        _READY.add(made)
    return made


def _document(i: int, doc: Mapping[str, Any]) -> Document:
    """A copy of ``doc`` with the fields a reader gives every document (a job's defaults for those missing)."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("text"), str):
        raise SpecError.one(("docs", i, "text"), "each document is a dict with a text (str)")
    meta = doc.get("meta") or {}
    meta = orjson.loads(meta) if isinstance(meta, str) else orjson.loads(orjson.dumps(meta, default=str))
    return Document(id=str(doc.get("id", i)), text=doc["text"], source=str(doc.get("source") or ""),
                    ord=int(doc.get("ord", i)), meta=meta, segments=doc.get("segments"))
