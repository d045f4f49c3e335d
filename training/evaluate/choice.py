"""Multiple choice by log-likelihood (MMLU, TruthfulQA MC1): the choice the model finds likeliest after the prompt.

Each choice's log-likelihood is the summed log-probability of its tokens given the prompt (the prompt and the
choice tokenized apart, so a choice's tokens are its own); the item is right when the right choice has the
highest. ``acc_norm`` compares the log-likelihoods per UTF-8 byte of each choice instead, which does not favour
short choices. Ties go to the first choice.
"""

from __future__ import annotations

import numpy as np

from training.evaluate.bench import ChoiceItem
from training.evaluate.results import ItemResult
from training.evaluate.scorer import Scorer


def choice_loglikelihoods(scorer: Scorer, items: list[ChoiceItem]) -> list[list[float]]:
    """Per item, the summed log-probability (nats) of each choice's tokens given the item's prompt."""
    requests = []
    for item in items:
        context = scorer.prefix() + scorer.encode(item.context)
        requests += [(context, scorer.encode(choice)) for choice in item.choices]
    scores = iter(scorer.score_many(requests, min_context=scorer.config.max_seq_len // 2))
    return [[-next(scores).nll for _ in item.choices] for item in items]


def choice_results(scorer: Scorer, items: list[ChoiceItem]) -> list[ItemResult]:
    out = []
    for item, values in zip(items, choice_loglikelihoods(scorer, items), strict=True):
        loglik = np.array(values)
        per_byte = loglik / np.array([max(1, len(c.encode("utf-8"))) for c in item.choices])
        out.append(ItemResult(item.record.benchmark, item.record.id, correct=int(np.argmax(loglik)) == item.answer,
                              correct_norm=int(np.argmax(per_byte)) == item.answer))
    return out
