"""The trainer side of tokenmill: a shard-set loader, a small Llama, FSDP2/DeepSpeed training, planning.

``training`` imports nothing from ``pipeline`` but the shard contract: its format (``pipeline.shard_format``,
``pipeline.mixture_format``) and its torch-free reading side (``pipeline.shard_source``,
``pipeline.mixture_source``); ``tests/test_import_graph.py`` holds the list.
"""
