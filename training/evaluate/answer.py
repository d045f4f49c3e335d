"""Conditional bits per byte of a reference answer given its prompt (GSM8K solutions, HumanEval solutions).

How surprised the model is by a correct answer, in bits per UTF-8 byte of that answer: no generation, no
parsing, so it ranks small models that cannot yet solve an item. The prompt and the answer are tokenized apart,
so every token of the answer is a target and its bytes are exactly the answer's.
"""

from __future__ import annotations

from training.evaluate.bench import AnswerItem
from training.evaluate.results import ItemResult
from training.evaluate.scorer import Scorer


def answer_results(scorer: Scorer, items: list[AnswerItem]) -> list[ItemResult]:
    requests = [(scorer.prefix() + scorer.encode(i.context), scorer.encode(i.answer)) for i in items]
    scores = scorer.score_many(requests, min_context=scorer.config.max_seq_len // 2)
    return [ItemResult(i.record.benchmark, i.record.id, nll=s.nll, bytes=len(i.answer.encode("utf-8")))
            for i, s in zip(items, scores, strict=True)]
