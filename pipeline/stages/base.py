"""The one stage interface: a batch of documents in, kept documents out, each drop with a reason.

A document is a plain dict with at least ``id`` (str), ``text`` (str), ``source`` (str),
``ord`` (int64: the document's position in the input, ``file_index << 40 | record_index``, used to
restore a deterministic order after any shuffle) and ``meta`` (a JSON string).

Two kinds of stage:
- :class:`Stage` works on one batch at a time (normalize, filters, PII, tokenize...). Subclasses
  implement :meth:`Stage.process` or, for a per-document filter, :meth:`FilterStage.filter`.
  The runner wraps them in :class:`pipeline.job.udfs.BatchStageRunner`, which counts docs in/out,
  drops per reason, bytes and seconds, and writes dropped documents to ``rejected/``.
- :class:`DatasetStage` needs the whole dataset (exact and near dedup): it gets the Ray Dataset and
  returns a new one, recording its counters and rejects through the :class:`StageContext`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from pipeline.documents import Doc, Drop


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


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

    def __init__(self, params: BaseModel, ctx: StageContext):
        self.params = params
        self.ctx = ctx

    def setup(self) -> None:
        """Load models or build indexes once per worker, not once per batch."""

    def preflight(self) -> None:
        """Checks that need the filesystem (a model file, an earlier index), run when the spec is
        validated so a bad path is refused before any work; raise ValueError naming the param."""

    def process(self, docs: list[Doc]) -> Iterable[Doc | Drop]:
        raise NotImplementedError


class FilterStage(Stage):
    """A per-document filter, datatrove style: ``filter`` returns True to keep, else a reason."""

    def filter(self, doc: Doc) -> bool | str:
        raise NotImplementedError

    def process(self, docs: list[Doc]) -> Iterator[Doc | Drop]:
        for doc in docs:
            verdict = self.filter(doc)
            if verdict is True:
                yield doc
            else:
                yield Drop(doc, verdict if isinstance(verdict, str) else self.name)


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

    def __init__(self, params: BaseModel, ctx: StageContext):
        self.params = params
        self.ctx = ctx

    def preflight(self) -> None:
        """As :meth:`Stage.preflight`."""

    def apply(self, ds: Any, recorder: Any) -> Any:
        """Return the dataset without the dropped documents.

        ``recorder`` is a :class:`pipeline.job.stats.StageRecorder`: call ``recorder.rejects(batch)`` from
        Ray tasks with the dropped rows (they must carry ``reason`` and may carry ``detail``) and
        ``recorder.counts(docs_in=..., docs_out=..., dropped={reason: n}, bytes_in=..., seconds=...)``.
        """
        raise NotImplementedError
