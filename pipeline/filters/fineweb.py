"""FineWeb's line-based quality rules (Penedo et al. 2024, "The FineWeb Datasets: Decanting the Web for the Finest
Text Data at Scale", §3.6 and appendix; implemented in datatrove's ``FineWebQualityFilter``).

They catch what Gopher and C4 let through on web pages: lists, menus and boilerplate repeated line by line.
Lines are the non-blank lines of the text; the rules run in datatrove's order, so the reason is datatrove's.
"""

from __future__ import annotations

from pydantic import Field

from pipeline.documents import Doc
from pipeline.filters.text import RuleCheck, doc_lang, find_duplicates, splitter, terminal_punctuation
from pipeline.stages.base import FilterParams, FilterStage, Verdict


class FineWebQualityParams(FilterParams):
    """Defaults: the FineWeb paper and datatrove's ``FineWebQualityFilter`` (the code that built FineWeb)."""

    #: 0.12: "fraction of lines ending with punctuation ≤ 0.12" (paper §3.6); datatrove drops below 0.12
    min_line_punct_ratio: float | None = Field(0.12, ge=0, le=1)
    #: keep a document with no line ending in punctuation at all (datatrove's ``line_punct_exclude_zero``)
    line_punct_exclude_zero: bool = False
    #: characters that end a line "with punctuation"; default: Unicode terminal punctuation (datatrove's list)
    stop_chars: list[str] | None = None
    #: 0.67 and 30: "fraction of lines shorter than 30 characters ≥ 0.67" (paper §3.6); datatrove counts lines
    #: of at most 30 characters and drops above 0.67
    max_short_line_ratio: float | None = Field(0.67, ge=0, le=1)
    short_line_length: int = Field(30, ge=0)
    #: 0.01: "fraction of characters in duplicated lines", as in the paper's appendix table and datatrove's
    #: default (the §3.6 text says ≥ 0.1; the dataset was built with the code); line breaks not counted
    max_char_dup_ratio: float | None = Field(0.01, ge=0, le=1)
    #: 0.3: datatrove's fourth rule ``list_ratio`` (line breaks per word), not in the paper: null disables it
    max_newline_word_ratio: float | None = Field(0.3, ge=0)
    #: the language of a document without ``meta["lang"]`` (words for the list rule)
    language: str = "en"


class FineWebQuality(FilterStage):
    """Drop list-like and line-repetitive documents; reasons ``fineweb:<rule>``."""

    name = "fineweb"
    Params = FineWebQualityParams
    params: FineWebQualityParams

    def setup(self) -> None:
        self._stops()
        splitter(self.params.language)

    def _stops(self) -> frozenset[str] | tuple[str, ...]:
        stops = self.__dict__.get("_stop_chars")
        if stops is None:
            given = self.params.stop_chars
            if given is None:
                stops = terminal_punctuation()
            else:
                stops = frozenset(given) if all(len(c) == 1 for c in given) else tuple(given)
            self.__dict__["_stop_chars"] = stops
        return stops

    def filter(self, doc: Doc) -> Verdict:
        p = self.params
        text = doc["text"]
        r = RuleCheck(self.name, p.mode == "annotate")
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            r.check(True, "empty")
            return r.verdict()
        s = r.scores
        n = len(lines)
        stops = self._stops()
        if isinstance(stops, frozenset):
            ending = sum(1 for line in lines if line[-1] in stops)
        else:
            ending = sum(1 for line in lines if line.endswith(stops))
        punct = s["line_punct_ratio"] = ending / n
        too_few = p.min_line_punct_ratio is not None and punct < p.min_line_punct_ratio
        if r.check(too_few and not (punct == 0 and p.line_punct_exclude_zero), "line_punct_ratio"):
            return r.verdict()
        short = s["short_line_ratio"] = sum(1 for line in lines if len(line) <= p.short_line_length) / n
        if r.check(p.max_short_line_ratio is not None and short > p.max_short_line_ratio, "short_line_ratio"):
            return r.verdict()
        breaks = text.count("\n")
        dup = s["char_dup_ratio"] = find_duplicates(lines)[1] / max(len(text) - breaks, 1)
        if r.check(p.max_char_dup_ratio is not None and dup > p.max_char_dup_ratio, "char_dup_ratio"):
            return r.verdict()
        if p.max_newline_word_ratio is not None or p.mode == "annotate":
            words = splitter(doc_lang(doc, p.language)).count(text)
            ratio = s["newline_word_ratio"] = breaks / words if words else float(breaks)
            if r.check(p.max_newline_word_ratio is not None and ratio > p.max_newline_word_ratio, "list_ratio"):
                return r.verdict()
        return r.verdict()
