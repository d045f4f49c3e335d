"""The tokenizer phase: train BPE on the first documents (on a worker) or load ``tokenizer.path``.

The tokenizer is staged as ``tokenizer.json``; the phase's record keeps its sha256, which the write
phase checks the staged file against (:func:`load`) before it tokenizes anything with it.
"""

from __future__ import annotations

import ray
from tokenizers import Tokenizer

from pipeline import storage
from pipeline.job.errors import JobError
from pipeline.job.records import CurateResult, TokenizerRecord
from pipeline.job.tasks import PhaseContext
from pipeline.output.curated import Part, sample_texts, sorted_parts
from pipeline.shard_format import TOKENIZER
from pipeline.spec import JobSpec, TokenizerSpec
from pipeline.tokenize import TokenizerInfo, load_tokenizer, special_tokens, train_bpe


def run(ctx: PhaseContext, curated: CurateResult) -> TokenizerRecord:
    """Make the tokenizer and stage it."""
    # trained on a worker: the driver never holds the corpus sample. max_calls=1: the worker exits after,
    # taking the tokenizers thread pool (every core) with it, so no pack task later runs in a worker
    # whose pool is wider than the one CPU Ray gave it
    task = ray.remote(num_cpus=1, max_retries=1, max_calls=1)(make_tokenizer)
    [(tok_json, info)] = ctx.tasks.get_all([task.remote(ctx.spec, storage.join(ctx.work, "curated"), curated.parts)])
    storage.write_text(storage.join(ctx.stage, TOKENIZER), tok_json)
    return TokenizerRecord(sha256=info.sha256, vocab_size=info.vocab_size)


def load(ctx: PhaseContext, record: TokenizerRecord) -> tuple[str, TokenizerInfo]:
    """The staged tokenizer's JSON and ids, refused if the file changed since the phase made it."""
    path = storage.join(ctx.stage, TOKENIZER)
    tok_json = storage.read_text(path)
    info = tokenizer_info(tok_json, ctx.spec)
    if info.sha256 != record.sha256:
        raise JobError(f"{path} changed since the tokenizer phase; pass --overwrite", "app")
    return tok_json, info


def make_tokenizer(spec: JobSpec, curated_dir: str, parts: list[Part]) -> tuple[str, TokenizerInfo]:
    """Train BPE on the first documents in corpus order (bounded), or load ``tokenizer.path``; returns the
    tokenizer's JSON and its :class:`~pipeline.tokenize.TokenizerInfo` (a Ray task runs it)."""
    tspec = _tokenizer_spec(spec)
    if tspec.path:
        try:
            tok = load_tokenizer(tspec.path)
        except ValueError as exc:
            raise JobError(str(exc), "validation") from None
    else:
        texts = sample_texts(curated_dir, sorted_parts(parts), tspec.train.sample_docs, tspec.train.sample_bytes)
        tok = train_bpe(texts, tspec.train.vocab_size, tspec.train.min_frequency, special_tokens(tspec))
    try:
        return tok.to_str(), TokenizerInfo.resolve(tok, tspec)
    except ValueError as exc:
        raise JobError(str(exc), "validation") from None


def tokenizer_info(tok_json: str, spec: JobSpec) -> TokenizerInfo:
    return TokenizerInfo.resolve(Tokenizer.from_str(tok_json), _tokenizer_spec(spec))


def _tokenizer_spec(spec: JobSpec) -> TokenizerSpec:
    if spec.tokenizer is None:  # the engine runs this phase only for a spec with a tokenizer
        raise JobError("the spec has no tokenizer", "app")
    return spec.tokenizer
