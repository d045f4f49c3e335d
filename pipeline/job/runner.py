"""Run a job: read -> stages -> tokenizer -> tokenize -> pack -> shards, on Ray.

The heavy work (reading, stages, tokenization) runs in Ray workers; the driver streams token ids in
document order, packs them and writes shards, so its memory is bounded by one shard plus the
packer's open sequences. Order is restored by ``ord`` wherever a stage shuffles, which is what
makes the shards byte-identical whatever the parallelism.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.data import ActorPoolStrategy

from pipeline.dedup.index import DedupIndexError
from pipeline.job.progress import StageProgress
from pipeline.job.ray_env import init_ray
from pipeline.job.stats import StageRecorder, StatsActor
from pipeline.job.udfs import BatchStageRunner, ReadFiles, TokenizeBatch
from pipeline.output.shard_writer import ShardSetWriter, write_manifest
from pipeline.packing import make_packer
from pipeline.readers import expand_inputs
from pipeline.shard_format import STATS, TOKENIZER, Manifest, atomic_write_bytes, token_dtype
from pipeline.spec import JobSpec
from pipeline.stages import DatasetStage, StageContext, stage_class
from pipeline.tokenize import TokenizerInfo, load_tokenizer, special_tokens, train_bpe

Progress = Callable[[str], None]


class JobError(RuntimeError):
    """A job that cannot run as specified (output exists, tokenizer unusable...): one clear line."""


@dataclass
class JobResult:
    output_dir: Path
    manifest: Manifest
    stats: dict[str, Any] = field(default_factory=dict)


OWNED = ("shards", "rejected", "index", "manifest.json", "stats.json", "tokenizer.json")


def _prepare_output(spec: JobSpec) -> Path:
    out = Path(spec.output.path)
    if (out / "manifest.json").exists() and not spec.output.overwrite:
        raise JobError(f"output.path: {out} already holds a shard set (set output.overwrite: true to replace it)")
    present = [name for name in OWNED if (out / name).exists()]
    if present and not spec.output.overwrite:
        raise JobError(f"output.path: {out} already has {', '.join(present)} (set output.overwrite: true to replace)")
    if spec.tokenizer.path and Path(spec.tokenizer.path).resolve().is_relative_to(out.resolve()):
        raise JobError(f"tokenizer.path: {spec.tokenizer.path} lies inside output.path, which the job rewrites")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in OWNED:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    except OSError as exc:
        raise JobError(f"output.path: cannot prepare {out}: {exc.strerror or exc}") from None
    return out


def _parallelism(spec: JobSpec) -> int:
    if spec.execution.parallelism:
        return spec.execution.parallelism
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def run_job(spec: JobSpec, progress: Progress | None = None) -> JobResult:
    say = progress or (lambda msg: None)
    t_start = time.perf_counter()
    out = _prepare_output(spec)
    try:
        init_ray(spec.execution.address, spec.execution.num_cpus)
    except (ConnectionError, TimeoutError, ValueError, RuntimeError) as exc:
        where = spec.execution.address or "a local Ray node"
        raise JobError(f"execution.address: cannot connect to {where}: {str(exc).splitlines()[0]}") from None
    par = _parallelism(spec)
    stats_actor = StatsActor.remote()
    rejected_dir = str(out / "rejected") if spec.output.write_rejected else None

    def recorder(key: str) -> StageRecorder:
        return StageRecorder(key, stats_actor, rejected_dir)

    files = expand_inputs(spec.inputs)
    say(f"reading {len(files)} input file(s) and running {len(spec.stages)} stage(s) with {par} worker(s)")
    t0 = time.perf_counter()
    with StageProgress(stats_actor, say):  # dataset stages run eagerly inside apply()
        try:
            ds = _curate(spec, files, out, par, recorder).materialize()
        except DedupIndexError as exc:
            raise JobError(str(exc)) from None
    curated_docs = ds.count()
    curation_s = time.perf_counter() - t0
    say(f"curation done: {curated_docs} documents kept in {curation_s:.1f}s")
    if curated_docs == 0:
        raise JobError("no document survived the stages: nothing to tokenize")

    tok, info = _tokenizer(spec, ds, say)
    tok_json = tok.to_str()
    atomic_write_bytes(out / TOKENIZER, tok_json.encode())

    tokens = ds.map_batches(
        TokenizeBatch, fn_constructor_args=(tok_json, info, recorder("90-tokenize")),
        batch_size=spec.execution.batch_size, batch_format="pyarrow", compute=ActorPoolStrategy(size=par),
    )
    dtype = token_dtype(info.vocab_size)
    packer = make_packer(spec.packing.method, spec.packing.seq_len, spec.packing.max_open)
    writer = ShardSetWriter(out, spec.output.samples_per_shard, dtype)
    t0 = time.perf_counter()
    last_report = t0
    has_mask = False
    for doc_id, ids, mask, ord_ in _token_docs(tokens):
        has_mask = has_mask or mask is not None
        for seq in packer.add(doc_id, ids, mask, ord_):
            if writer.add(seq) and time.perf_counter() - last_report > 5:
                last_report = time.perf_counter()
                say(f"packed {packer.stats.docs} docs, {packer.stats.tokens} tokens, {len(writer.shards)} shard(s)")
    for seq in packer.flush():
        writer.add(seq)
    writer.close()
    pack_s = time.perf_counter() - t0

    manifest = Manifest(
        spec_hash=spec.content_hash(),
        tokenizer_hash=info.sha256,
        seq_len=spec.packing.seq_len,
        dtype=dtype.name,
        vocab_size=info.vocab_size,
        samples_per_shard=spec.output.samples_per_shard,
        bos_id=info.bos_id if info.add_bos else None,
        eos_id=info.eos_id if info.add_eos else None,
        pad_id=info.pad_id,
        has_loss_mask=has_mask,
        shards=writer.shards,
        extra={"job": spec.name, "packing": packer.stats.as_dict(), "add_bos": info.add_bos,
               "add_eos": info.add_eos},
    )
    stages = ray.get(stats_actor.snapshot.remote())
    total_s = time.perf_counter() - t_start
    stats = {
        "job": spec.name,
        "stages": [{"stage": k, **v} for k, v in sorted(stages.items())],
        "packing": packer.stats.as_dict(),
        "output": {"shards": len(writer.shards), "samples": manifest.total_samples,
                   "tokens": manifest.total_tokens},
        "seconds": {"curation": round(curation_s, 3), "tokenize_pack_write": round(pack_s, 3),
                    "total": round(total_s, 3)},
        "throughput": {"docs_per_s": round(curated_docs / total_s, 1),
                       "tokens_per_s": round(manifest.total_tokens / max(pack_s, 1e-9), 1)},
        "parallelism": par,
    }
    atomic_write_bytes(out / STATS, (json.dumps(stats, indent=2) + "\n").encode())
    write_manifest(out, manifest)
    return JobResult(out, manifest, stats)


def _curate(spec: JobSpec, files: list, out: Path, par: int, recorder: Callable[[str], StageRecorder]) -> Any:
    """The curation graph: read every file, then each stage in spec order."""
    ds = ray.data.from_items(
        [{"file_index": i, "path": p, "input": inp.model_dump_json()} for i, inp, p in files],
        override_num_blocks=max(1, len(files)),
    )
    ds = ds.map_batches(
        ReadFiles, fn_constructor_args=(recorder("00-read"),), batch_size=1, batch_format="pyarrow",
        compute=ActorPoolStrategy(size=min(par, max(1, len(files)))),
    )
    for i, stage_spec in enumerate(spec.stages, start=1):
        cls = stage_class(stage_spec.type)
        params = spec.stage_params(i - 1)
        ctx = StageContext(spec.name, str(out), i, str(out / "index"), spec.execution.seed)
        key = f"{i:02d}-{cls.name}"
        if isinstance(cls, type) and issubclass(cls, DatasetStage):
            ds = cls(params, ctx).apply(ds, recorder(key))
            if cls.reorders:
                ds = ds.sort("ord")
        else:
            ds = ds.map_batches(
                BatchStageRunner, fn_constructor_args=(cls, params.model_dump_json(), ctx, recorder(key)),
                batch_size=spec.execution.batch_size, batch_format="pyarrow",
                compute=ActorPoolStrategy(size=par), **_ray_resources(cls.resources),
            )
    return ds


def _token_docs(tokens: Any) -> Iterator[tuple[str, np.ndarray, np.ndarray | None, int]]:
    """Stream (id, token ids, loss mask or None, ord) in corpus order from the tokenized dataset."""
    for batch in tokens.iter_batches(batch_format="pyarrow", batch_size=None, prefetch_batches=2):
        ids_col, mask_col = batch.column("ids"), batch.column("mask")
        doc_ids, ords = batch.column("id").to_pylist(), batch.column("ord").to_pylist()
        for j in range(batch.num_rows):
            m = mask_col[j]
            mask = m.values.to_numpy(zero_copy_only=False) if m.is_valid else None
            yield doc_ids[j], ids_col[j].values.to_numpy(zero_copy_only=False), mask, ords[j]


def _tokenizer(spec: JobSpec, ds: Any, say: Progress):
    tspec = spec.tokenizer
    if tspec.path:
        tok = load_tokenizer(tspec.path)
        say(f"loaded tokenizer {tspec.path}")
    else:
        texts = _sample_texts(ds, tspec.train.sample_docs, tspec.train.sample_bytes)
        say(f"training byte-level BPE (vocab {tspec.train.vocab_size}) on {len(texts)} documents")
        tok = train_bpe(texts, tspec.train.vocab_size, tspec.train.min_frequency, special_tokens(tspec))
    try:
        info = TokenizerInfo.resolve(tok, tspec)
    except ValueError as exc:
        raise JobError(str(exc)) from None
    return tok, info


def _sample_texts(ds: Any, max_docs: int, max_bytes: int) -> list[str]:
    """The first documents in corpus order, up to a byte budget: deterministic, and bounded."""
    texts: list[str] = []
    size = 0
    for batch in ds.limit(max_docs).iter_batches(batch_format="pyarrow", batch_size=1024):
        for text in batch.column("text").to_pylist():
            texts.append(text)
            size += len(text)
            if size >= max_bytes:
                return texts
    return texts


def _ray_resources(resources: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "num_cpus" in resources:
        out["num_cpus"] = resources["num_cpus"]
    if "num_gpus" in resources:
        out["num_gpus"] = resources["num_gpus"]
    extra = {k: v for k, v in resources.items() if k not in ("num_cpus", "num_gpus")}
    if extra:
        out["resources"] = extra
    return out
