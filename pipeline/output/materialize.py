"""``tokenmill mix --materialize OUT``: the mixture written as an ordinary shard set, for consumers without
tokenmill. Its samples are the mixture's schedule in order, sample for sample (what the loader reads before
its window shuffle), read as the loader reads them (:mod:`pipeline.mixture_source`); shards, checksums and
manifest by the one shard-set writer (:mod:`pipeline.output.shard_set`)."""

from __future__ import annotations

from collections.abc import Iterator

from pipeline import shard_format as fmt
from pipeline import storage
from pipeline.mixture_source import OpenMixture, mixture_samples, open_mixture
from pipeline.output.shard_set import Packed, write_shard_set
from pipeline.shard_source import ShardReadError

#: positions read at once
_BLOCK = 1 << 16
#: shards fetched ahead of the one being decoded, per source
_PREFETCH = 2


def _packed(opened: OpenMixture) -> Iterator[Packed]:
    total = opened.schedule.total
    for lo in range(0, total, _BLOCK):
        for _, sample in mixture_samples(opened.sources, opened.manifests, opened.mixture, lo,
                                         min(total, lo + _BLOCK), _PREFETCH):
            yield sample.input_ids, sample.doc_lens, sample.loss_mask


def materialize(mixture: str, out_dir: str, samples_per_shard: int | None = None,
                bearer_token: str | None = None) -> fmt.Manifest:
    """Write the mixture at ``mixture`` (path or URL) as a shard set in ``out_dir`` (new or empty);
    :class:`~pipeline.shard_source.ShardReadError` when it cannot."""
    if storage.is_remote(out_dir):
        raise ShardReadError(f"{out_dir}: --materialize writes to a local folder")
    if storage.exists(out_dir) and (not storage.is_dir(out_dir) or storage.list_files(out_dir)):
        raise ShardReadError(f"{out_dir}: exists and is not an empty folder")
    opened = open_mixture(mixture, bearer_token=bearer_token)
    if opened.schedule.total == 0:
        raise ShardReadError(f"{mixture}: the mixture has no samples")
    first = opened.manifests[0]
    manifest = write_shard_set(
        out_dir, _packed(opened), seq_len=first.seq_len, vocab_size=first.vocab_size,
        samples_per_shard=samples_per_shard or first.samples_per_shard, pad_id=first.pad_id, eos_id=first.eos_id,
        bos_id=first.bos_id, spec_hash=f"mixture:{opened.sha256}", tokenizer_hash=first.tokenizer_hash,
        meta={"mixture": opened.sha256[:16]})
    try:  # the tokenizer the tokens were made with, when the first source has one
        data = opened.sources[0].read(fmt.TOKENIZER, 256 << 20)
    except ShardReadError:
        return manifest
    storage.write_bytes(storage.join(out_dir, fmt.TOKENIZER), data)
    return manifest
