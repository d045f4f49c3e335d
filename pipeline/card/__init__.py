"""Dataset cards: ``OUT/README.md`` (a Hugging Face dataset card, where the Hub and ``datasets`` read it) and its
figures in ``OUT/card/``.

A card is derived only from what a job records: ``stats.json`` (every stage's counts, its ``profile`` of the
kept documents, recorded by the write phase: :mod:`pipeline.card.profile`), ``manifest.json``,
``tokenizer.json``, ``documents.json``, ``card/spec.yaml`` (the spec, written by the job) and a bounded
sample of ``rejected/``. Modules: :mod:`.collect` (the facts), :mod:`.figures` (matplotlib, SVG + PNG),
:mod:`.markdown` (the text), :mod:`.languages` (the kept documents' languages), :mod:`.paths` (no local path
published), :mod:`.compare` (one output against earlier ones), :mod:`.build` (all of it,
written into a folder), :mod:`.cli` (``tokenmill card``).
"""
