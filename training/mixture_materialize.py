"""``tokenmill mix --materialize OUT``: the mixture written as an ordinary shard set, for consumers without
tokenmill. Its samples are the mixture's schedule in order, sample for sample (what the loader reads before
its window shuffle); shards, checksums and manifest as the pipeline writes them."""

from __future__ import annotations

from collections.abc import Iterator

from pipeline import shard_format as fmt
from pipeline import storage
from training.data import LoaderError
from training.mixture_data import MixtureLoader, mixture_samples
from training.synthetic import Packed, write_shard_set

#: positions read at once
_BLOCK = 1 << 16


def _packed(loader: MixtureLoader) -> Iterator[Packed]:
    total = loader.schedule.total
    for lo in range(0, total, _BLOCK):
        for _, sample in mixture_samples(loader.sources, loader.manifests, loader.mixture, lo,
                                         min(total, lo + _BLOCK), loader.prefetch):
            yield sample.input_ids, sample.doc_lens, sample.loss_mask


def materialize(mixture: str, out_dir: str, samples_per_shard: int | None = None,
                bearer_token: str | None = None) -> fmt.Manifest:
    """Write the mixture at ``mixture`` (path or URL) as a shard set in ``out_dir`` (new or empty)."""
    if storage.is_remote(out_dir):
        raise LoaderError(f"{out_dir}: --materialize writes to a local folder")
    if storage.exists(out_dir) and (not storage.is_dir(out_dir) or storage.list_files(out_dir)):
        raise LoaderError(f"{out_dir}: exists and is not an empty folder")
    loader = MixtureLoader(mixture, 1, num_workers=0, shuffle=False, bearer_token=bearer_token)
    first = loader.manifest
    manifest = write_shard_set(
        out_dir, _packed(loader), seq_len=first.seq_len, vocab_size=first.vocab_size,
        samples_per_shard=samples_per_shard or first.samples_per_shard, pad_id=first.pad_id, eos_id=first.eos_id,
        bos_id=first.bos_id, spec_hash=f"mixture:{loader.mixture_sha256}", tokenizer_hash=first.tokenizer_hash,
        meta={"mixture": loader.mixture_sha256[:16]})
    try:  # the tokenizer the tokens were made with, when the first source has one
        data = loader.sources[0].read(fmt.TOKENIZER, 256 << 20)
    except LoaderError:
        return manifest
    storage.write_bytes(storage.join(out_dir, fmt.TOKENIZER), data)
    return manifest
