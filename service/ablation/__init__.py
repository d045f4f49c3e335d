"""``tokenmill ablate``: pipeline variants of one raw input, a proxy model per variant and seed, one report.

One module per job: :mod:`.spec` (the ablation file), :mod:`.plan` (each variant's job spec and the train budget),
:mod:`.split` (the common validation set, held out before any variant's filters), :mod:`.runner` (the steps,
resumable), :mod:`.results` (ablation.json) and :mod:`.report` (REPORT.md and its figures). Training and
evaluation run as subprocesses: service never imports training (tests/test_import_graph.py).
"""
