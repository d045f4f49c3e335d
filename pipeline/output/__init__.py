"""Everything that writes or commits an output, and reading one back.

- The output folder or prefix and its safety rules: ``open_store.py`` (:func:`open_output_dir`, the inputs check,
  the rules), ``store.py`` (the ``OutputStore`` protocol and the claim/commit logic both backends share),
  ``local_store.py`` (``OutputDir``: ``flock``, rename), ``object_store.py`` (``ObjectOutputDir``: lease, copy),
  ``layout.py`` (published names, marker and journal records, ``OutputError``).
- Shard sets: ``shard_set.py``, the one shard-set writer (the job's tasks, a mixture's ``--materialize`` in
  ``materialize.py``, benchmarks and tests).
- Documents: ``curated.py`` (the curated parts and the ``documents`` output), ``documents_meta.py`` (``meta`` as a
  struct), ``groups.py`` (``output.split_by``), ``documents_reader.py`` (a ``documents`` output read back as input).
- ``inspect.py``: a finished output read back and verified.
"""
