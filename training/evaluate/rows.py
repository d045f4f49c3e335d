"""Per-row scores of one forward pass: many items scored together, each with the trainer's loss.

:func:`training.scoring.token_nll` sums a whole batch, as a validation loss wants; an evaluation needs each item's
own sum. Here the batch runs through the model once and the trainer's loss (``token_loss_sum`` over the labels
the loader made: document ends, ``loss_mask`` and padding excluded) is taken row by row, so an item scored in a
batch gets what it would alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from training.data import IGNORE_INDEX
from training.model import token_loss_sum
from training.scoring import batch_inputs


@dataclass(frozen=True)
class Score:
    """Summed negative log-likelihood in nats of some target tokens, how many, and their bytes by the token table."""

    nll: float
    tokens: int
    bytes: int

    def __add__(self, other: Score) -> Score:
        return Score(self.nll + other.nll, self.tokens + other.tokens, self.bytes + other.bytes)


@torch.no_grad()
def row_scores(model: torch.nn.Module, batch: dict[str, Any], token_bytes: torch.Tensor | None) -> list[Score]:
    """Each row's summed NLL (nats), target count and target bytes (0 without ``token_bytes``)."""
    ids, pos, labels, mask = batch_inputs(batch, torch.device("cpu"))
    logits = model(ids, pos, mask)
    out = []
    for row in range(ids.shape[0]):
        nll = float(token_loss_sum(logits[row:row + 1], labels[row:row + 1]).double())
        targets = labels[row][labels[row] != IGNORE_INDEX].long()
        nbytes = int(token_bytes[targets].sum()) if token_bytes is not None else 0
        out.append(Score(nll, int(targets.numel()), nbytes))
    return out
