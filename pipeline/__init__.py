"""Curation pipeline: readers, stages, tokenizer, packer and shard writer, run on Ray.

Kept import-light on purpose: `training` imports `pipeline.shard_format` and must not pull Ray in.
"""
