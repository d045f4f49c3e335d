"""``decontaminate``: drop (or flag) documents that contain benchmark items, whole or in pieces.

``prepare()`` builds the n-gram index of the benchmark files once per job on the driver and returns it
as plain arrays (:meth:`~pipeline.decontam.index.BenchmarkIndex.to_plain`); each worker builds its
:class:`~pipeline.decontam.match.Matcher` from it in ``setup()``. A document matches an item when one of
the item's texts (every text field, and the fields end to end) reaches ``min_overlap`` of its n-grams, or
when the document holds a piece of it (``min_span`` words, or ``min_span_share`` of it): see
:mod:`pipeline.decontam.match`.

A matching document gets ``meta["contamination"] = [{benchmark, item, overlap, exact, span, field,
rule}, ...]`` (best first) in both modes; in ``filter`` mode it is dropped as ``decontaminate:<benchmark
of the best match>`` and its matches are also in the rejected record's ``detail.contamination``.

Counters (summed over workers, so only per-document counts): ``docs:<benchmark>`` documents matching at
least one item of that benchmark (a document matching two benchmarks counts under both; its drop reason
names one), ``exact_docs:<benchmark>`` those holding an item verbatim (after normalization) and
``matches:<benchmark>`` (document, item) pairs. How many *distinct* items were found cannot be summed
across workers: the rejected records (or ``tokenmill contamination-report``) list them.
Score ``overlap``: each document's best overlap (0 when none), so annotate mode shows the distribution.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from pipeline.decontam.index import (
    DEFAULT_COMMON_ITEMS,
    DEFAULT_EXCLUDE_FIELDS,
    DEFAULT_MIN_WORDS,
    DEFAULT_NGRAM,
    DEFAULT_STOCK_ITEMS,
    BenchmarkIndex,
    benchmark_files,
    index_files,
)
from pipeline.decontam.match import DEFAULT_MIN_SPAN, DEFAULT_MIN_SPAN_SHARE, Matcher
from pipeline.documents import Doc, Drop
from pipeline.problems import NO_MATCH, ParamError, across_params
from pipeline.stages.base import FilterParams, FilterStage, Verdict

#: PaLM's contamination criterion: an example is contaminated when >= 70 % of its n-grams occur in the
#: document (Chowdhery et al. 2022, section 8); verbatim copies score 1.0
DEFAULT_MIN_OVERLAP = 0.7


def _benchmarks_required(schema: dict[str, Any]) -> None:
    """The JSON schema says what preflight checks: ``benchmarks``, one at least."""
    schema["required"] = ["benchmarks"]


class DecontaminateParams(FilterParams):
    model_config = ConfigDict(json_schema_extra=_benchmarks_required)

    #: benchmark files (JSONL(.gz/.zst) or Parquet), folders or globs; relative to the spec's folder.
    #: Required, but checked by preflight (a spec naming the stage bare still parses, like every stage)
    benchmarks: list[str] = Field(default_factory=list, json_schema_extra={"minItems": 1})
    ngram: int = Field(DEFAULT_NGRAM, ge=1, le=64)
    #: an item shorter than ngram is one gram if it has min_words words holding a letter (else skipped)
    min_words: int = Field(DEFAULT_MIN_WORDS, ge=1)
    #: ... and is not a stock question, found in stock_items or more benchmark items (else skipped)
    stock_items: int = Field(DEFAULT_STOCK_ITEMS, ge=2)
    min_overlap: float = Field(DEFAULT_MIN_OVERLAP, gt=0.0, le=1.0)
    #: ... or when it holds a piece of the item of min_span words (its consecutive n-grams, stock phrases
    #: excluded), or of at least ngram words and min_span_share of the item's text
    min_span: int = Field(DEFAULT_MIN_SPAN, ge=1)
    min_span_share: float = Field(DEFAULT_MIN_SPAN_SHARE, gt=0.0, le=1.0)
    #: an n-gram found in this many benchmark items is a stock phrase: never part of a span
    common_items: int = Field(DEFAULT_COMMON_ITEMS, ge=2)
    #: fields of a benchmark record indexed as texts of the item (each one present); null: every text field
    #: but exclude_fields (see index.item_texts)
    text_fields: list[str] | None = Field(None, min_length=1)
    exclude_fields: list[str] = Field(default_factory=lambda: list(DEFAULT_EXCLUDE_FIELDS))
    id_field: str = "id"
    #: the record field naming its benchmark; without it, the file's name (``gsm8k_test.jsonl.gz``: gsm8k_test)
    benchmark_field: str = "benchmark"

    @model_validator(mode="after")
    def _short_items(self) -> DecontaminateParams:
        if self.min_words > self.ngram:
            raise across_params(f"min_words ({self.min_words}) must not exceed ngram ({self.ngram})")
        if self.min_span < self.ngram:
            raise across_params(f"min_span ({self.min_span}) must be at least ngram ({self.ngram}): a span is a "
                                "run of n-grams")
        return self


class Decontaminate(FilterStage):
    name = "decontaminate"
    Params = DecontaminateParams
    params: DecontaminateParams
    path_params = ("benchmarks",)

    def preflight(self) -> None:
        if not self.params.benchmarks:
            raise ParamError("benchmarks", "name at least one benchmark file, folder or glob")
        for path in self.params.benchmarks:
            if not benchmark_files([path]):
                raise ParamError("benchmarks", f"no file matches {path!r}", NO_MATCH)

    def prepare(self) -> dict[str, Any]:
        self.preflight()  # a job run without spec validation still gets the one-line reason
        p = self.params
        return index_files(p.benchmarks, ngram=p.ngram, min_words=p.min_words, stock_items=p.stock_items,
                           text_fields=p.text_fields, id_field=p.id_field, benchmark_field=p.benchmark_field,
                           exclude_fields=p.exclude_fields, common_items=p.common_items).to_plain()

    def setup(self) -> None:
        prepared = self.prepared if self.prepared is not None else self.prepare()
        p = self.params
        self.matcher = Matcher(BenchmarkIndex.from_plain(prepared), p.min_overlap, p.min_span, p.min_span_share)

    def process(self, docs: list[Doc]) -> Iterator[Doc | Drop]:
        if "matcher" not in self.__dict__:  # run_batch without setup (tests, notebooks)
            self.setup()
        for doc, matches in zip(docs, self.matcher.match_batch([d["text"] for d in docs]), strict=True):
            if not matches:
                yield self.judge(doc, Verdict(True, None, {"overlap": 0.0}))
                continue
            found = [m.as_dict() for m in matches]
            benches = dict.fromkeys(m.benchmark for m in matches)
            for bench in benches:
                self.count(f"docs:{bench}")
                self.count(f"matches:{bench}", sum(m.benchmark == bench for m in matches))
                for m in matches:  # for the dataset card: which rule found it, and which items (few: the leaks)
                    if m.benchmark == bench:
                        self.count(f"rule:{bench}:{m.rule}")
                        self.count(f"item:{bench}:{m.item}")
                if any(m.exact and m.benchmark == bench for m in matches):
                    self.count(f"exact_docs:{bench}")
            meta = doc.get("meta")
            if isinstance(meta, dict):
                meta["contamination"] = found
            else:  # a JSON string (or nothing): judge() parses it in annotate mode; do it here for both
                doc["meta"] = {**(json.loads(meta) if meta else {}), "contamination": found}
            out = self.judge(doc, Verdict(False, f"{self.name}:{matches[0].benchmark}",
                                          {"overlap": matches[0].overlap}))
            if isinstance(out, Drop):
                out.detail["contamination"] = found
            yield out
