"""Model-based quality: keep documents a fastText classifier gives a high enough probability of ``label``.

The DCLM recipe (a fastText classifier of "high-quality" reference text vs. Common Crawl, documents kept by
the probability of ``__label__hq``) with a model trained by ``tokenmill train-classifier`` or any fastText
supervised model. The probability goes to ``meta["quality_score"]`` on every document (both modes) and is
observed as the score ``quality_score``; a document below ``min_score`` is dropped as
``quality_classifier:low_score``. Like ``lid``, the model path reaches workers as a param and each worker
loads the model once in ``setup``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import Field

from pipeline.documents import Doc, Drop
from pipeline.filters.fasttext_model import FastTextModel, check_model_file, clean_label, doc_meta
from pipeline.stages.base import FilterParams, FilterStage, Verdict

REASON = "quality_classifier:low_score"


class QualityParams(FilterParams):
    #: a fastText supervised model (.bin/.ftz), e.g. from ``tokenmill train-classifier``
    model: str
    #: the positive label (``hq`` or ``__label__hq``): the stage keeps documents by its probability
    label: str = "hq"
    #: 0.5, the decision boundary of a binary classifier (keep what it calls ``label``). DCLM instead cut at a
    #: percentile of its own model's scores (0.018112 ~ top 10 % in ``baselines_configs/fasttext_filter.yaml``),
    #: a value that means nothing for another model: run in annotate mode and read the quantiles of
    #: ``quality_score`` in stats.json to choose one.
    min_score: float = Field(0.5, ge=0.0, le=1.0)


class QualityClassifier(FilterStage):
    name = "quality_classifier"
    Params = QualityParams
    params: QualityParams
    path_params = ("model",)

    _model: FastTextModel | None = None

    @property
    def label(self) -> str:
        return clean_label(self.params.label)

    def preflight(self) -> None:
        check_model_file(self.params.model, "model")

    def setup(self) -> None:
        model = FastTextModel(Path(self.params.model))
        if self.label not in model.labels:
            raise ValueError(f"label: {self.label!r} is not a label of {self.params.model} (it has {model.labels})")
        self._model = model

    def process(self, docs: list[Doc]) -> Iterator[Doc | Drop]:
        scores = self._loaded().probability([d["text"] for d in docs], self.label)
        for doc, score in zip(docs, scores, strict=True):
            yield self.judge(doc, self._verdict(doc, score))

    def filter(self, doc: Doc) -> Verdict:
        return self._verdict(doc, self._loaded().probability([doc["text"]], self.label)[0])

    def _verdict(self, doc: Doc, score: float) -> Verdict:
        doc_meta(doc)["quality_score"] = round(score, 4)
        keep = score >= self.params.min_score
        return Verdict(keep, None if keep else REASON, {"quality_score": score})

    def _loaded(self) -> FastTextModel:
        if self._model is None:  # run_batch in a notebook or a test without setup()
            self.setup()
        assert self._model is not None
        return self._model
