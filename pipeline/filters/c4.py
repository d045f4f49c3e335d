"""C4's cleaning (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer", §2.2; the code: ``clean_page`` in tensorflow-datasets' ``text/c4_utils.py``).

Line rules remove lines and EDIT the text: a line is dropped when it has a word over 1000 characters, does not end
in terminal punctuation (or ends in an ellipsis), has too few words, mentions "javascript" or a cookie / terms of
use notice; Wikipedia citation marks (``[1]``, ``[edit]``, ``[citation needed]``) are cut out. Document rules drop
the page: "lorem ipsum" or a curly bracket on a line that survived the line rules (a page of code), a bad word
(optional list, ``bad_words``), or fewer sentences than ``min_num_sentences`` in the lines kept. The kept text is
the kept lines, stripped, joined by line breaks. In ``annotate`` mode the text is not edited; the verdict and
``lines_removed_ratio`` say what filtering would do.

Sentences are counted with spaCy's sentencizer rule, as datatrove does (tensorflow-datasets used NLTK's punkt,
a trained model that would have to be downloaded).

Defaults are the paper's and tensorflow-datasets'; datatrove's ``C4QualityFilter`` defaults differ in three
places (swapped ``min_words_per_line`` 3 / ``min_num_sentences`` 5, and ``'`` as an end mark): pass those
values to reproduce it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from pydantic import Field

from pipeline.documents import Doc, Drop
from pipeline.filters.text import RuleCheck, doc_lang, splitter
from pipeline.problems import ParamError
from pipeline.stages.base import FilterParams, FilterStage, StageContext, Verdict

#: tensorflow-datasets c4_utils: ``citation_regex``
_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
#: tensorflow-datasets c4_utils: ``_POLICY_SUBSTRINGS``
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
_ELLIPSIS = "..."


class C4QualityParams(FilterParams):
    """Defaults: Raffel et al. 2020 §2.2 and tensorflow-datasets ``c4_utils.py`` (constants quoted per field)."""

    #: "only retained lines that ended in a terminal punctuation mark (i.e. a period, exclamation mark, question
    #: mark, or end quotation mark)"; lines ending in "..." are removed too (tfds ``_ELLIPSIS``)
    filter_no_terminal_punct: bool = True
    #: tfds ``_END_MARKS = (".", "?", "!", '"')``; datatrove adds ``'``
    end_marks: list[str] = Field(default_factory=lambda: [".", "?", "!", '"'], min_length=1)
    #: "only retained lines that contained at least 5 words" (tfds ``_MIN_WORDS_PER_LINE = 5``; datatrove: 3)
    min_words_per_line: int | None = Field(5, ge=0)
    #: "discarded any page with fewer than 3 sentences" (tfds ``_MIN_NUM_SENTENCES = 3``; datatrove: 5)
    min_num_sentences: int | None = Field(3, ge=0)
    #: tfds ``_MAX_WORD_LENGTH = 1000``: a line with a longer word is removed
    max_word_length: int | None = Field(1000, ge=1)
    #: remove Wikipedia-style citation marks from each line (tfds ``citation_regex``)
    remove_citations: bool = True
    #: "removed any page where the phrase 'lorem ipsum' appeared"
    filter_lorem_ipsum: bool = True
    #: "removed any line with the word Javascript"
    filter_javascript: bool = True
    #: "removed any pages that contained a curly bracket" (on the lines kept so far, as tfds checks it)
    filter_curly_bracket: bool = True
    #: tfds ``_POLICY_SUBSTRINGS``: lines with "terms of use", "privacy policy", "uses cookies" ... are removed
    filter_policy: bool = True
    #: a file of bad words / phrases, one per line ("List of Dirty, Naughty, Obscene or Otherwise Bad Words"
    #: in the paper; not shipped, nothing is downloaded): a page with one of them on a kept line is dropped
    bad_words: str | None = None
    #: the language of a document without ``meta["lang"]`` (its sentence splitting)
    language: str = "en"


class C4Quality(FilterStage):
    """C4 line cleaning (edits text) and page rules; reasons ``c4:<rule>``, counters ``lines_removed[:<cause>]``."""

    name = "c4"
    Params = C4QualityParams
    params: C4QualityParams
    path_params = ("bad_words",)

    def __init__(self, params: C4QualityParams, ctx: StageContext):
        super().__init__(params, ctx)
        self._bad: re.Pattern[str] | None = None
        self._bad_loaded = False

    def preflight(self) -> None:
        if self.params.bad_words is not None and not Path(self.params.bad_words).is_file():
            raise ParamError("bad_words", f"no such file: {self.params.bad_words}")

    def setup(self) -> None:
        self._bad_words()
        splitter(self.params.language)

    def _bad_words(self) -> re.Pattern[str] | None:
        if not self._bad_loaded:
            self._bad_loaded = True
            if self.params.bad_words is not None:
                lines = Path(self.params.bad_words).read_text(encoding="utf-8").splitlines()
                words = sorted({w.strip().lower() for w in lines if w.strip()}, key=len, reverse=True)
                if words:  # whole words only, as datatrove's C4BadWordsFilter
                    self._bad = re.compile(r"(?:\W|^)(" + "|".join(map(re.escape, words)) + r")(?:\W|$)")
        return self._bad

    def process(self, docs: list[Doc]) -> Iterator[Doc | Drop]:
        edit = self.params.mode == "filter"
        for doc in docs:
            verdict, text, removed = self._clean(doc)
            if edit and verdict.keep:
                doc["text"] = text
                if removed:
                    self.count("lines_removed", sum(removed.values()))
                    for cause, n in removed.items():
                        self.count(f"lines_removed:{cause}", n)
            yield self.judge(doc, verdict)

    def filter(self, doc: Doc) -> Verdict:
        """The verdict alone (the text is edited only by :meth:`process`)."""
        return self._clean(doc)[0]

    def _clean(self, doc: Doc) -> tuple[Verdict, str, dict[str, int]]:
        """(verdict, cleaned text, lines removed per cause): tfds ``clean_page``, rule for rule."""
        p = self.params
        r = RuleCheck(self.name, p.mode == "annotate")
        words = splitter(doc_lang(doc, p.language))
        bad = self._bad_words()
        end_marks = tuple(p.end_marks)
        kept: list[str] = []
        removed = dict.fromkeys(("too_long_word", "no_terminal_punct", "too_few_words", "javascript", "policy"), 0)
        lines = doc["text"].splitlines()
        for line in lines:
            line = line.strip()
            if p.max_word_length is not None and len(line) > p.max_word_length and any(
                len(w) > p.max_word_length for w in line.split()
            ):
                removed["too_long_word"] += 1
                continue
            if p.remove_citations and "[" in line:
                line = _CITATION.sub("", line)
            if p.filter_no_terminal_punct and (not line.endswith(end_marks) or line.endswith(_ELLIPSIS)):
                removed["no_terminal_punct"] += 1
                continue
            if p.min_words_per_line is not None and len(line.split()) < p.min_words_per_line:
                removed["too_few_words"] += 1
                continue
            lower = line.lower()
            if p.filter_lorem_ipsum and "lorem ipsum" in lower and r.check(True, "lorem_ipsum"):
                return r.verdict(), "", {}
            if p.filter_javascript and "javascript" in lower:
                removed["javascript"] += 1
                continue
            if p.filter_curly_bracket and "{" in line and r.check(True, "curly_bracket"):
                return r.verdict(), "", {}
            if p.filter_policy and any(x in lower for x in _POLICY):
                removed["policy"] += 1
                continue
            if bad is not None and bad.search(lower) and r.check(True, "bad_words"):
                return r.verdict(), "", {}
            kept.append(line)
        s = r.scores
        sentences = s["sentences"] = words.sentences(kept) if p.min_num_sentences is not None else 0
        s["lines_removed_ratio"] = sum(removed.values()) / len(lines) if lines else 0.0
        r.check(p.min_num_sentences is not None and sentences < p.min_num_sentences, "too_few_sentences")
        text = "\n".join(kept).strip()
        r.check(not text, "empty")
        return r.verdict(), text, {k: v for k, v in removed.items() if v}
