"""``blocklist``: drop a document that contains one of a list of words."""

from __future__ import annotations

import re

from pydantic import Field

from tokenmill import Document, FilterParams, FilterStage, Verdict


class BlocklistParams(FilterParams):
    """``FilterParams`` brings ``mode`` (filter or annotate); an unknown key in a spec is refused."""

    words: list[str] = Field(min_length=1, description="drop a document containing any of these words")
    case_sensitive: bool = False


class Blocklist(FilterStage):
    """Keep a document unless it contains a listed word (as a whole word)."""

    name = "blocklist"  # the key of its counters and of meta.filters in annotate mode
    Params = BlocklistParams
    params: BlocklistParams

    def setup(self) -> None:
        """Once per worker: one pattern for every word."""
        flags = 0 if self.params.case_sensitive else re.IGNORECASE
        self.pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, self.params.words)) + r")\b", flags)

    def filter(self, doc: Document) -> Verdict:
        hits = len(self.pattern.findall(doc["text"]))
        if hits:
            self.count("documents_with_listed_words")
        return Verdict(hits == 0, "blocklist:listed_word", {"listed_words": hits})
