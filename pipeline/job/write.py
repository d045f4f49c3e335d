"""The write phase: tokenize, pack and write shards on Ray workers, with output independent of the worker count.

Two kinds of task, both fixed by the spec and the data alone:

1. **Pack a range** (:func:`pack_range`). The curated corpus (in ``ord`` order) is cut into ranges of
   ``range_docs`` documents. A task tokenizes and packs its range on its own (best-fit restarts at every
   range boundary) and writes the packed sequences to ``ranges/range-NNNNNN.arrow``.
2. **Write a shard** (:func:`write_shard_task`). Once the sample counts of every range before it are
   known, shard ``s`` holds global samples ``[s * samples_per_shard, (s + 1) * samples_per_shard)``, read
   from the one or two range files that hold them; sample keys are global positions.

So shards keep equal sample counts (only the last is partial) and the shard contract and the loader stay
as they were; the driver handles only counts and file names. On the driver, :class:`ShardPlan` knows
which shards are due and :class:`_ShardSetTasks` keeps ``parallelism`` tasks running, shards first as
they come due, recording each finished range and shard at once (what a rerun keeps). With
``output.split_by`` each group is a shard set of its own, packed as a whole corpus would be.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import ray
from tokenizers import Tokenizer

from pipeline import storage
from pipeline.card.profile import KeptProfile, merge_profiles
from pipeline.documents import text_bytes
from pipeline.job import events as ev
from pipeline.job import tokenizer
from pipeline.job.records import (
    CurateResult,
    GroupRecord,
    Packing,
    RangeRecord,
    ShardRecord,
    TokenizerRecord,
    TokenizeTotals,
    WriteResult,
)
from pipeline.job.state import RANGES, SHARDS, JsonlLog, read_jsonl
from pipeline.job.tasks import PhaseContext
from pipeline.output.curated import Part, read_rows, sorted_parts, worker_name
from pipeline.output.shard_set import ShardSetWriter
from pipeline.packing import PackedSequence, make_packer
from pipeline.shard_format import ShardInfo, token_dtype
from pipeline.tokenize import DocEncoder, TokenizerInfo

#: seconds between two progress events
PROGRESS_EVERY = 1.0
#: documents tokenized per encode call inside a range task
ENCODE_BATCH = 256
#: a range estimated at this many times the median range goes first (a long-document outlier)
OUTLIER = 4.0
RANGE_SCHEMA = pa.schema([
    ("input_ids", pa.large_list(pa.int32())),
    ("doc_lens", pa.list_(pa.int32())),
    ("loss_mask", pa.large_list(pa.uint8())),
    ("doc_ids", pa.list_(pa.string())),
    ("ords", pa.list_(pa.int64())),
])

_ENCODERS: dict[str, DocEncoder] = {}


@dataclass(frozen=True)
class PackConfig:
    seq_len: int
    method: str
    max_open: int
    dtype: str
    samples_per_shard: int
    #: the first file index of each spec input: the kept documents' profile counts per input (pipeline/card/profile.py)
    input_starts: tuple[int, ...] = ()


# ---- the phase (on the driver) -----------------------------------------------------------------------


def run(ctx: PhaseContext, curated: CurateResult, tok: TokenizerRecord) -> list[WriteResult]:
    """Every group's shard set, in group order (one unnamed group without ``output.split_by``), then the
    validation split's (``output.validation``)."""
    idle = IdleClock(ctx.par)
    tok_json, info = tokenizer.load(ctx, tok)
    p = ctx.spec.packing
    cfg = PackConfig(p.seq_len, p.method, p.max_open, token_dtype(info.vocab_size).name,
                     ctx.spec.output.samples_per_shard, curated.input_starts)
    results, before = [], 0
    groups = [*curated.groups, *([curated.validation.group] if curated.validation else [])]  # OUT/validation/ last
    total = sum(g.docs for g in groups)
    for group in groups:
        results.append(_ShardSetTasks(ctx, group, tok_json, info, cfg, before, total, idle).run())
        before += group.docs
    return results


class IdleClock:
    """Worker-seconds the phase had no task for: the integral of ``workers - tasks in flight`` over time, from the
    phase's start (the tokenizer's load, fewer ranges left than workers, the tail after the last task). Measured
    on the driver as the scheduler runs, so that ``stats.json`` says where the phase's time went (``idle``)
    rather than leaving it to a remainder."""

    def __init__(self, workers: int):
        self.workers = workers
        self.seconds = 0.0
        self._last = time.perf_counter()

    def tick(self, inflight: int) -> float:
        """Count the time since the last tick with ``inflight`` tasks running; returns the total so far."""
        now = time.perf_counter()
        self.seconds += max(0, self.workers - inflight) * (now - self._last)
        self._last = now
        return self.seconds


@dataclass(frozen=True)
class DueShard:
    """A shard whose ranges are all packed: ``(range, first, end)`` row slices of their files."""

    index: int
    slices: list[tuple[int, int, int]]


class ShardPlan:
    """Which shards can be written: shard ``s`` needs the sample counts of every range before its samples.

    State: the ranges packed so far, the prefix ``[0, prefix)`` of ranges whose counts are all known (and
    the samples they hold), the shards due (ranges packed, task not started) and the shards started or kept.
    """

    def __init__(self, n_ranges: int, samples_per_shard: int, ranges: dict[int, RangeRecord], kept: Iterable[int]):
        self.n_ranges, self.samples_per_shard = n_ranges, samples_per_shard
        self.ranges = ranges
        self.started: set[int] = set(kept)
        self.prefix, self.prefix_samples = 0, 0
        self.due: deque[DueShard] = deque()
        self._advance()

    @property
    def docs_packed(self) -> int:
        return sum(r.docs for r in self.ranges.values())

    def add(self, rec: RangeRecord) -> None:
        """A range is packed: the shards it completes come due."""
        self.ranges[rec.index] = rec
        self._advance()

    def _advance(self) -> None:
        while self.prefix < self.n_ranges and self.prefix in self.ranges:
            self.prefix_samples += self.ranges[self.prefix].samples
            self.prefix += 1
        final = self.prefix == self.n_ranges  # every count known: the partial last shard is due too
        spp = self.samples_per_shard
        counts = [self.ranges[r].samples for r in range(self.prefix)]
        n_full = self.prefix_samples // spp
        for s in list(range(n_full)) + ([n_full] if final and self.prefix_samples % spp else []):
            if s not in self.started:
                self.started.add(s)
                self.due.append(DueShard(s, shard_slices(s, spp, counts)))


class _ShardSetTasks:
    """Pack and write one shard set on Ray workers: the documents of ``group`` into its stage folder (each shard by
    :class:`~pipeline.output.shard_set.ShardSetWriter`, in :func:`write_shard_task`); ranges and shards are
    recorded under its work folder as they finish."""

    def __init__(self, ctx: PhaseContext, group: GroupRecord, tok_json: str, info: TokenizerInfo, cfg: PackConfig,
                 done_before: int, total_docs: int, idle: IdleClock):
        self.ctx, self.group, self.tok_json, self.info, self.cfg = ctx, group, tok_json, info, cfg
        self.idle, self.idle_before = idle, idle.seconds
        self.dispatch = 0.0
        self.work, self.stage = group.work_dir(ctx.work), group.stage_dir(ctx.stage)
        self.ranges_dir = storage.join(self.work, "ranges")
        self.parts = sorted_parts(group.parts)
        self.bounds = range_bounds(group.docs, ctx.spec.packing.range_docs)
        self.done_before, self.total_docs = done_before, total_docs
        self.shards: dict[int, ShardRecord] = {}
        self.plan = ShardPlan(len(self.bounds), cfg.samples_per_shard, {}, ())  # until _resume reads what is kept

    def run(self) -> WriteResult:
        storage.makedirs(self.work)
        range_log, shard_log = JsonlLog(storage.join(self.work, RANGES)), JsonlLog(storage.join(self.work, SHARDS))
        try:
            self._resume()
            self._schedule(range_log, shard_log)
        finally:
            range_log.close()
            shard_log.close()
        self._progress()
        return self._result()

    def _resume(self) -> None:
        """Keep the ranges whose files are there and the shards intact on disk (reported as reused)."""
        ranges = {rec.index: rec for rec in map(RangeRecord.from_json, read_jsonl(storage.join(self.work, RANGES)))
                  if storage.exists(range_file(self.ranges_dir, rec.index))}
        self.shards = {rec.index: rec for rec in map(ShardRecord.from_json, read_jsonl(storage.join(self.work, SHARDS)))
                       if _shard_intact(self.stage, rec.shard)}
        for rec in sorted(self.shards.values(), key=lambda r: r.index):
            self.ctx.emit(_shard_event(rec, reused=True, group=self.group.label))
        self.plan = ShardPlan(len(self.bounds), self.cfg.samples_per_shard, ranges, self.shards)

    def _schedule(self, range_log: JsonlLog, shard_log: JsonlLog) -> None:
        """At most ``parallelism`` tasks at a time, shards first as they come due: parallelism means workers."""
        ctx, plan, tasks = self.ctx, self.plan, self.ctx.tasks
        pack = ray.remote(num_cpus=1, max_retries=3)(pack_range)
        write = ray.remote(num_cpus=1, max_retries=3)(write_shard_task)
        tok_ref, parts_ref = ray.put(self.tok_json), ray.put(self.parts)
        todo = schedule_order([r for r in range(len(self.bounds)) if r not in plan.ranges], self.bounds, self.parts)
        last_report = 0.0
        submitted: dict[tuple[str, int], float] = {}
        while todo or plan.due or tasks.inflight:
            ctx.check_cancel()
            while (plan.due or todo) and len(tasks.inflight) < ctx.par:
                self.idle.tick(len(tasks.inflight))
                if plan.due:
                    s = plan.due.popleft()
                    submitted[("shard", s.index)] = time.time()
                    tasks.submit(write.remote(s.index, s.slices, self.ranges_dir, self.cfg, self.stage))
                else:
                    r = todo.pop(0)
                    submitted[("range", r)] = time.time()
                    lo, hi = self.bounds[r]
                    tasks.submit(pack.remote(r, lo, hi, self.group.curated_dir(ctx.work), parts_ref, tok_ref,
                                             self.info, self.cfg, self.ranges_dir))
            running = len(tasks.inflight)
            done = tasks.next_done(timeout=0.5)
            self.idle.tick(running)
            for rec in done:
                if isinstance(rec, RangeRecord | ShardRecord):  # from its submission to its start: Ray's dispatch
                    sent = submitted.pop(("range" if isinstance(rec, RangeRecord) else "shard", rec.index), rec.started)
                    self.dispatch += max(0.0, rec.started - sent)
                if isinstance(rec, RangeRecord):
                    range_log.append(rec.to_json())
                    plan.add(rec)
                elif isinstance(rec, ShardRecord):
                    shard_log.append(rec.to_json())
                    self.shards[rec.index] = rec
                    ctx.emit(_shard_event(rec, reused=False, group=self.group.label))
            if time.monotonic() - last_report >= PROGRESS_EVERY:
                last_report = time.monotonic()
                self._progress()

    def _progress(self) -> None:
        self.ctx.emit(ev.PhaseProgress(phase="write", done=self.done_before + self.plan.docs_packed,
                                       total=self.total_docs, unit="docs"))

    def _result(self) -> WriteResult:
        spec = self.ctx.spec
        ranges = [self.plan.ranges[r] for r in range(len(self.bounds))]
        shards = [self.shards[s] for s in sorted(self.shards)]
        idle = self.idle.tick(0) - self.idle_before
        return WriteResult(
            group=self.group.name, shards=[s.shard for s in shards], writers=sorted({s.writer for s in shards}),
            packing=Packing.merge([r.packing for r in ranges], spec.packing.seq_len, spec.packing.method),
            has_mask=any(r.has_mask for r in ranges),
            tokenize=TokenizeTotals(sum(r.docs for r in ranges), sum(r.bytes_in for r in ranges),
                                    round(sum(r.tokenize_seconds for r in ranges), 3)),
            task_seconds=round(sum(r.seconds for r in ranges) + sum(s.seconds for s in shards), 3), info=self.info,
            shard_seconds=round(sum(s.seconds for s in shards), 3), idle_seconds=round(idle, 3),
            dispatch_seconds=round(self.dispatch, 3),
            profile=merge_profiles([r.profile for r in ranges]),
        )


def _shard_intact(stage: str, shard: ShardInfo) -> bool:
    """A recorded shard is kept only if its file is there with the recorded size and sha256."""
    path = storage.join(stage, shard.name)
    try:
        return storage.size(path) == shard.bytes and storage.sha256(path) == shard.sha256
    except OSError:
        return False


def _shard_event(rec: ShardRecord, reused: bool, group: str = ".") -> ev.ShardWritten:
    s = rec.shard
    name = s.name if group == "." else f"{group}/{s.name}"  # a path below the output folder
    return ev.ShardWritten(name=name, sha256=s.sha256, samples=s.samples, tokens=s.tokens, writer=rec.writer,
                           reused=reused)


# ---- the plan of ranges (pure) -----------------------------------------------------------------------


def range_bounds(n_docs: int, range_docs: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + range_docs, n_docs)) for lo in range(0, n_docs, range_docs)]


def schedule_order(todo: list[int], bounds: list[tuple[int, int]], parts: list[Part]) -> list[int]:
    """The order to launch range tasks in: outliers first (ranges estimated at >= :data:`OUTLIER` x the
    median range's text bytes, largest first), then the others in index order.

    Ranges hold a fixed number of documents, so a range of long documents can carry a third of the corpus
    (bench/e2e.py: 63 of 179 MB in one range of 45). Started late, it would leave the other workers idle
    for its whole run; started first, the small ranges fill in around it (longest-processing-time-first).
    Ranges of ordinary sizes keep index order, so shards still come out steadily as ranges finish (a shard
    waits for every range before it). The order decides when a range runs, never what it holds: the output
    does not change. Sizes are estimated from the curated parts' rows and bytes (documents of a part taken
    as equally long), which the driver already has.
    """
    ordered = sorted_parts(parts)
    edges = np.concatenate([[0], np.cumsum([p.rows for p in ordered])]).astype(np.float64)
    cum = np.concatenate([[0], np.cumsum([p.bytes for p in ordered])]).astype(np.float64)
    if len(edges) < 2 or not bounds:
        return list(todo)
    at = np.interp(np.asarray(bounds, dtype=np.float64), edges, cum)
    size = at[:, 1] - at[:, 0]
    cut = OUTLIER * max(float(np.median(size)), 1.0)
    big = sorted((r for r in todo if size[r] >= cut), key=lambda r: (-size[r], r))
    return big + [r for r in todo if size[r] < cut]


def shard_slices(s: int, samples_per_shard: int, range_samples: list[int]) -> list[tuple[int, int, int]]:
    """``(range, first, end)`` row slices of the range files that make up shard ``s``."""
    lo, hi = s * samples_per_shard, (s + 1) * samples_per_shard
    out, start = [], 0
    for r, n in enumerate(range_samples):
        end = start + n
        if end > lo and start < hi:
            out.append((r, max(lo, start) - start, min(hi, end) - start))
        start = end
        if start >= hi:
            break
    return out


def range_file(folder: str, r: int) -> str:
    return storage.join(os.fspath(folder), f"range-{r:06d}.arrow")


# ---- the tasks (on the workers) ----------------------------------------------------------------------


def worker_encoder(tok_json: str, info: TokenizerInfo) -> DocEncoder:
    """One parsed tokenizer per worker process (a task reuses it across ranges)."""
    enc = _ENCODERS.get(info.sha256)
    if enc is None:
        # Ray gave this task one CPU: tokenizers' own thread pool would take every core of the machine
        # and the job's workers would fight over them (read when the pool starts, on first use)
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        enc = _ENCODERS[info.sha256] = DocEncoder(Tokenizer.from_str(tok_json), info)
    return enc


def pack_range(r: int, lo: int, hi: int, curated: str, parts: list[Part], tok_json: str, info: TokenizerInfo,
               cfg: PackConfig, ranges_dir: str) -> RangeRecord:
    """Tokenize and pack documents ``[lo, hi)``; write the range file; return its record."""
    t0, started = time.perf_counter(), time.time()
    table = read_rows(curated, parts, lo, hi, columns=["id", "ord", "text", "segments", "meta"])
    encoder = worker_encoder(tok_json, info)
    packer = make_packer(cfg.method, cfg.seq_len, cfg.max_open)
    seqs: list[PackedSequence] = []
    ids_col, ord_col = table.column("id").to_pylist(), table.column("ord").to_pylist()
    profile = KeptProfile(cfg.input_starts)
    t_tok = 0.0
    for b in range(0, table.num_rows, ENCODE_BATCH):
        chunk = table.slice(b, ENCODE_BATCH)
        t1 = time.perf_counter()
        texts = chunk.column("text").to_pylist()
        encoded = encoder.encode(texts, chunk.column("segments").to_pylist())
        t_tok += time.perf_counter() - t1
        metas = chunk.column("meta").to_pylist()
        for j, (ids, mask) in enumerate(encoded):
            seqs.extend(packer.add(ids_col[b + j], ids, mask, ord_col[b + j]))
            profile.add(ord_col[b + j], texts[j], len(ids), metas[j])
    seqs.extend(packer.flush())
    has_mask = _write_range(seqs, range_file(ranges_dir, r))
    st = packer.stats
    return RangeRecord(index=r, lo=lo, hi=hi, samples=len(seqs), tokens=st.tokens, has_mask=has_mask,
                       packing=Packing(st.method, st.seq_len, st.docs, st.docs_cut, st.sequences, st.tokens),
                       bytes_in=text_bytes(table), tokenize_seconds=round(t_tok, 3),
                       seconds=round(time.perf_counter() - t0, 3), writer=worker_name(), profile=profile.to_json(),
                       started=started)


def _write_range(seqs: list[PackedSequence], path: str) -> bool:
    """The packed sequences as one Arrow file; returns whether any has a loss mask."""
    arrays = [s.arrays(np.dtype(np.int32)) for s in seqs]  # (ids, doc_lens, loss mask or None) per sample
    out = pa.table({
        "input_ids": pa.array([a[0] for a in arrays], RANGE_SCHEMA.field("input_ids").type),
        "doc_lens": pa.array([a[1] for a in arrays], RANGE_SCHEMA.field("doc_lens").type),
        "loss_mask": pa.array([a[2] for a in arrays], RANGE_SCHEMA.field("loss_mask").type),
        "doc_ids": pa.array([[p.doc_id for p in s.pieces] for s in seqs], RANGE_SCHEMA.field("doc_ids").type),
        "ords": pa.array([[p.ord for p in s.pieces] for s in seqs], RANGE_SCHEMA.field("ords").type),
    }, schema=RANGE_SCHEMA)
    with storage.open_output(path) as sink, ipc.new_file(sink, RANGE_SCHEMA) as writer:
        writer.write_table(out)
    return any(a[2] is not None for a in arrays)


def write_shard_task(s: int, slices: list[tuple[int, int, int]], ranges_dir: str, cfg: PackConfig,
                     out_dir: str) -> ShardRecord:
    """Write shard ``s`` from its range-file slices (the one shard-set writer, started at shard ``s``: full, or the
    last and partial); return its manifest entry and who wrote it."""
    t0, started = time.perf_counter(), time.time()
    dtype = np.dtype(cfg.dtype)
    limit = np.iinfo(dtype).max
    writer = ShardSetWriter(out_dir, cfg.samples_per_shard, dtype, first_shard=s)
    for r, a, b in slices:
        path = range_file(ranges_dir, r)
        with (storage.open_input(path) if storage.is_remote(path) else pa.memory_map(path)) as src:
            t = ipc.open_file(src).read_all().slice(a, b - a).combine_chunks()
        ids_col, mask_col = t.column("input_ids").chunk(0), t.column("loss_mask").chunk(0)
        offs, vals = ids_col.offsets.to_numpy(), ids_col.values.to_numpy()
        moffs, mvals = mask_col.offsets.to_numpy(), mask_col.values.to_numpy(zero_copy_only=False)
        lens, doc_ids, ords = (t.column(c).to_pylist() for c in ("doc_lens", "doc_ids", "ords"))
        valid = mask_col.is_valid().to_pylist()
        for i in range(t.num_rows):
            ids = vals[offs[i]:offs[i + 1]]
            if len(ids) and int(ids.max()) > limit:
                raise ValueError(f"token id {int(ids.max())} does not fit the shard dtype {dtype.name}")
            mask = mvals[moffs[i]:moffs[i + 1]] if valid[i] else None
            writer.add_sample(ids.astype(dtype), lens[i], mask, {"doc_ids": doc_ids[i], "ords": ords[i]})
    writer.close()
    (info,) = writer.shards
    return ShardRecord(index=s, shard=info, writer=worker_name(), seconds=round(time.perf_counter() - t0, 3),
                       started=started)
