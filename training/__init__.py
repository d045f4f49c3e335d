"""The trainer side of tokenmill: a shard-set loader, a small Llama, FSDP2/DeepSpeed training, planning.

``training`` imports nothing from ``pipeline`` but the shard contract (``pipeline.shard_format``).
"""
