"""``tokenmill eval``: score a trainer checkpoint on held-out text and on the benchmarks the decontaminate stage
checks against, and, given the job that made the training data, on the benchmark items that job did not find.

One module per kind of task (:mod:`.heldout`: bits per byte of text; :mod:`.choice`: multiple choice by
log-likelihood; :mod:`.answer`: bits per byte of a reference answer given its prompt), all scored by
:mod:`.scorer` with the trainer's own loss (``token_loss_sum`` per item, :mod:`.rows`); :mod:`.bench` reads the
benchmark files, :mod:`.contamination` the job's record, :mod:`.report` writes the JSON and the table.
"""
