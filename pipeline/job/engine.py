"""The job engine: one job = four phases that emit typed events and can be resumed or cancelled.

Phases (``pipeline.job.events.PHASES``):

1. **curate**: read every input and run the stages on Ray; the last step writes the kept documents,
   on the workers, as Parquet parts in ``.tokenmill/work/curated/``.
2. **tokenizer**: train BPE on the first documents (or load ``tokenizer.path``).
3. **write**: tokenize + pack ranges of documents and write shards, all on Ray workers
   (:mod:`pipeline.output.parallel_write`); each finished range and shard is recorded at once.
4. **finalize**: stats, manifest and the documents output are staged, then committed into the
   output folder in one step (:meth:`pipeline.job.output_dir.OutputDir.commit`).

Everything a rerun needs lives in the output's work folder (``.tokenmill/work``): a rerun of the same
spec skips finished phases, ranges and shards (a shard file is neither recomputed nor rewritten),
and ends byte-identical to an uninterrupted run; another spec is refused unless ``overwrite``.
The driver handles counts and names only: documents and tokens stay on the workers.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline import storage
from pipeline.job import events as ev
from pipeline.job.output_dir import (
    OutputError,
    check_not_overlapping,
    describe_os_error,
    open_output_dir,
    os_error_category,
)
from pipeline.job.state import EVENTS, RANGES, SHARDS, JsonlLog, StateError, WorkState, read_jsonl
from pipeline.shard_format import MANIFEST, STATS, TOKENIZER, Manifest, ShardInfo, token_dtype
from pipeline.spec import JobSpec

EventSink = Callable[[ev.Event], None]
#: seconds between two progress / counter events
PROGRESS_EVERY = 1.0


class JobError(RuntimeError):
    """A job that cannot finish: one clear line, and a category (see ``events.FailureCategory``)."""

    category: ev.FailureCategory = "app"

    def __init__(self, message: str, category: ev.FailureCategory | None = None):
        super().__init__(message)
        if category is not None:
            self.category = category


class JobCancelled(JobError):
    category: ev.FailureCategory = "cancelled"


@dataclass
class JobResult:
    output_dir: str
    manifest: Manifest | None
    stats: dict[str, Any] = field(default_factory=dict)


class Job:
    """Run one spec. ``on_event`` gets every event (from the calling thread, and from one progress
    thread while curation runs); ``cancel()`` may be called from any thread or a signal handler."""

    def __init__(self, spec: JobSpec, on_event: EventSink | None = None, log_path: str | None = None):
        self.spec = spec
        self.out = open_output_dir(spec.output.path)
        self._sinks = [on_event] if on_event else []
        self._cancel = threading.Event()
        self._events_log: JsonlLog | None = None
        self._emit_lock = threading.Lock()
        self._log_path = log_path
        self._inflight: list[Any] = []
        self.phase: str | None = None

    # ---- public ------------------------------------------------------------------------------------

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def run(self) -> JobResult:
        spec = self.spec
        try:
            check_not_overlapping(spec.output.path, [i.path for i in spec.inputs])  # local or object store
            with self.out.lock():
                self.out.claim(spec.output.overwrite)
                return self._run_locked()
        except OutputError as exc:
            raise self._fail(JobError(str(exc), exc.category)) from None
        except JobError as exc:
            raise self._fail(exc) from None
        except KeyboardInterrupt:
            raise self._fail(JobCancelled(f"cancelled during {self.phase or 'start'}")) from None
        except OSError as exc:
            raise self._fail(JobError(describe_os_error(exc, exc.filename), os_error_category(exc))) from None
        finally:  # after the failure event, which goes to the log too
            if self._events_log:
                self._events_log.close()
                self._events_log = None

    # ---- the phases --------------------------------------------------------------------------------

    def _run_locked(self) -> JobResult:
        spec = self.spec
        t_start = time.perf_counter()
        work = str(self.out.work)
        spec_hash = spec.content_hash()
        try:
            state = WorkState.open(work, spec_hash)
        except StateError as exc:
            if not spec.output.overwrite:
                raise JobError(str(exc), "validation") from None
            storage.rmtree(work)
            state = WorkState.open(work, spec_hash)
        if state.is_new():
            _clear(work)
            state.save()
        self._events_log = JsonlLog(storage.join(str(self.out.private), EVENTS))
        started_ray = self._start_ray()
        try:
            from pipeline.job.curation import parallelism

            par = parallelism(spec.execution.parallelism)
            self._emit(ev.JobStarted(job=spec.name, spec_hash=spec_hash, output=str(self.out.path), parallelism=par,
                                     resumed_phases=tuple(p for p in ev.PHASES if state.done(p))))
            curated = self._phase("curate", state, lambda: self._curate(state, par))
            if curated["docs"] == 0:
                raise JobError("no document survived the stages: nothing to write", "input")
            written = None
            if spec.tokenizer is not None:
                tok = self._phase("tokenizer", state, lambda: self._tokenizer(state, curated))
                written = self._phase("write", state, lambda: self._write(state, curated, tok, par))
            result = self._finalize(state, curated, written, par, t_start)
        finally:
            self._cancel_inflight()
            if started_ray:
                import ray

                ray.shutdown()
        return result

    def _phase(self, name: str, state: WorkState, body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        done = state.done(name)
        if done is not None:
            self._emit(ev.PhaseChanged(phase=name, state="skipped", seconds=done.get("seconds", 0.0)))
            return done
        self._check_cancel()
        self.phase = name
        self._emit(ev.PhaseChanged(phase=name, state="started"))
        t0 = time.perf_counter()
        record = body()
        record["seconds"] = round(time.perf_counter() - t0, 3)
        state.finish(name, record)
        self._emit(ev.PhaseChanged(phase=name, state="finished", seconds=record["seconds"]))
        return record

    def _curate(self, state: WorkState, par: int) -> dict[str, Any]:
        from pipeline.job.curation import curate

        work, stage = str(self.out.work), str(self.out.stage)
        for folder in (storage.join(work, "curated"), storage.join(work, "groups"), storage.join(stage, "rejected"),
                       storage.join(stage, "index")):
            storage.rmtree(folder)
        storage.makedirs(storage.join(work, "curated"))
        record = curate(self.spec, storage.join(work, "curated"), stage, par, self._emit, self._check_cancel)
        if self.spec.output.split_by and record["docs"]:
            record["groups"] = self._split(record)
        return record

    def _split(self, curated: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """``output.split_by``: the curated parts split by a meta field, on the workers (pipeline/output/groups.py)."""
        import ray

        from pipeline.output.curated import sorted_parts
        from pipeline.output.groups import collect_groups, split_part

        task = ray.remote(num_cpus=1, max_retries=3)(split_part)
        dest = storage.join(str(self.out.work), "groups")
        refs = [task.remote(storage.join(str(self.out.work), "curated"), part, self.spec.output.split_by, dest)
                for part in sorted_parts(curated["parts"])]
        self._inflight = refs
        records = [self._get(r) for r in refs]
        self._inflight = []
        return collect_groups(records)

    def _tokenizer(self, state: WorkState, curated: dict[str, Any]) -> dict[str, Any]:
        import ray

        from pipeline.job.curation import make_tokenizer

        # trained on a worker: the driver never holds the corpus sample. max_calls=1: the worker exits after,
        # taking the tokenizers thread pool (every core) with it, so no pack task later runs in a worker
        # whose pool is wider than the one CPU Ray gave it
        task = ray.remote(num_cpus=1, max_retries=1, max_calls=1)(make_tokenizer)
        ref = task.remote(self.spec, storage.join(str(self.out.work), "curated"), curated["parts"])
        self._inflight = [ref]
        tok_json, info = self._get(ref)
        self._inflight = []
        _write_text(storage.join(str(self.out.stage), TOKENIZER), tok_json)
        return {"sha256": info.sha256, "vocab_size": info.vocab_size}

    def _write(self, state: WorkState, curated: dict[str, Any], tok_rec: dict[str, Any], par: int) -> dict[str, Any]:
        from pipeline.job.curation import tokenizer_info
        from pipeline.output.parallel_write import PackConfig

        spec, work, stage = self.spec, str(self.out.work), str(self.out.stage)
        tok_json = storage.read_text(storage.join(stage, TOKENIZER))
        info = tokenizer_info(tok_json, spec)
        if info.sha256 != tok_rec["sha256"]:
            raise JobError(f"{storage.join(stage, TOKENIZER)} changed since the tokenizer phase; pass --overwrite",
                           "app")
        cfg = PackConfig(spec.packing.seq_len, spec.packing.method, spec.packing.max_open,
                         token_dtype(info.vocab_size).name, spec.output.samples_per_shard)
        groups = curated.get("groups")
        if groups is None:
            return self._write_group(storage.join(work, "curated"), curated["parts"], curated["docs"], work, stage,
                                     tok_json, info, cfg, par, 0, curated["docs"])
        written, before = {}, 0
        for name, group in groups.items():  # one shard set per group, each packed as a whole corpus would be
            written[name] = self._write_group(storage.join(work, "groups", name), group["parts"], group["docs"],
                                              storage.join(work, "split", name), storage.join(stage, name), tok_json,
                                              info, cfg, par, before, curated["docs"])
            before += group["docs"]
        return {"groups": written}

    def _write_group(self, curated_dir: str, parts_rec: list[dict[str, Any]], n_docs: int, work: str,
                     stage: str, tok_json: str, info: Any, cfg: Any, par: int, done_before: int,
                     total_docs: int) -> dict[str, Any]:
        """Pack and write one shard set: the documents of ``curated_dir`` into ``stage/shards``; ranges and
        shards are recorded under ``work`` as they finish (what a rerun keeps)."""
        import ray

        from pipeline.output.curated import sorted_parts
        from pipeline.output.parallel_write import (
            pack_range,
            range_bounds,
            range_file,
            schedule_order,
            shard_slices,
            write_shard_task,
        )

        spec = self.spec
        storage.makedirs(work)
        parts = sorted_parts(parts_rec)
        bounds = range_bounds(n_docs, spec.packing.range_docs)
        ranges_dir, shards_out = storage.join(work, "ranges"), stage
        group = _group_of(stage, str(self.out.stage))
        range_log, shard_log = JsonlLog(storage.join(work, RANGES)), JsonlLog(storage.join(work, SHARDS))
        ranges = {r["range"]: r for r in read_jsonl(storage.join(work, RANGES))
                  if storage.exists(range_file(ranges_dir, r["range"]))}
        shards = {r["index"]: r for r in read_jsonl(storage.join(work, SHARDS)) if _shard_intact(stage, r)}
        for rec in sorted(shards.values(), key=lambda r: r["index"]):
            self._emit(_shard_event(rec, reused=True, group=group))

        pack = ray.remote(num_cpus=1, max_retries=3)(pack_range)
        write = ray.remote(num_cpus=1, max_retries=3)(write_shard_task)
        common = (ray.put(tok_json), info, cfg)
        parts_ref = ray.put(parts)
        todo_ranges = schedule_order([r for r in range(len(bounds)) if r not in ranges], bounds, parts_rec)
        pending: dict[Any, tuple[str, int]] = {}
        launched_shards: set[int] = set(shards)
        prefix_ranges, prefix_samples = 0, 0  # ranges [0, prefix_ranges) have known sample counts
        spp = spec.output.samples_per_shard
        last_report = 0.0

        due: list[tuple[int, list[tuple[int, int, int]], bool]] = []  # shards whose ranges are all packed

        def queue_shards(final: bool) -> None:
            counts = [ranges[r]["samples"] for r in range(prefix_ranges)]
            n_full = prefix_samples // spp
            wanted = list(range(n_full)) + ([n_full] if final and prefix_samples % spp else [])
            for s in wanted:
                if s not in launched_shards:
                    launched_shards.add(s)
                    due.append((s, shard_slices(s, spp, counts), final and s == n_full))

        def advance_prefix() -> None:
            nonlocal prefix_ranges, prefix_samples
            while prefix_ranges < len(bounds) and prefix_ranges in ranges:
                prefix_samples += ranges[prefix_ranges]["samples"]
                prefix_ranges += 1
            queue_shards(final=prefix_ranges == len(bounds))

        advance_prefix()
        # at most `par` tasks at a time, shards first as they come due: parallelism means workers
        while todo_ranges or due or pending:
            self._check_cancel()
            while (due or todo_ranges) and len(pending) < par:
                if due:
                    s, slices, partial = due.pop(0)
                    pending[write.remote(s, slices, ranges_dir, cfg, shards_out, partial)] = ("shard", s)
                else:
                    r = todo_ranges.pop(0)
                    lo, hi = bounds[r]
                    pending[pack.remote(r, lo, hi, curated_dir, parts_ref, *common, ranges_dir)] = ("range", r)
            self._inflight = list(pending)
            if not pending:
                continue
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in done:
                kind, idx = pending.pop(ref)
                rec = self._get(ref)
                if kind == "range":
                    ranges[idx] = rec
                    range_log.append(rec)
                    advance_prefix()
                else:
                    rec["index"] = idx
                    shards[idx] = rec
                    shard_log.append(rec)
                    self._emit(_shard_event(rec, reused=False, group=group))
            if time.monotonic() - last_report >= PROGRESS_EVERY:
                last_report = time.monotonic()
                self._write_progress(ranges, done_before, total_docs)
        self._inflight = []
        range_log.close()
        shard_log.close()
        self._write_progress(ranges, done_before, total_docs)
        return _write_record(spec, [ranges[r] for r in range(len(bounds))],
                             [shards[s] for s in sorted(shards)], info)

    def _write_progress(self, ranges: dict[int, dict[str, Any]], done_before: int, total_docs: int) -> None:
        done = done_before + sum(r["hi"] - r["lo"] for r in ranges.values())
        self._emit(ev.PhaseProgress(phase="write", done=done, total=total_docs, unit="docs"))

    def _finalize(self, state: WorkState, curated: dict[str, Any], written: dict[str, Any] | None, par: int,
                  t_start: float) -> JobResult:
        import json

        spec, stage = self.spec, str(self.out.stage)
        self._check_cancel()
        self.phase = "finalize"
        self._emit(ev.PhaseChanged(phase="finalize", state="started"))
        t0 = time.perf_counter()
        documents = None
        if spec.output.documents:
            documents = self._export_documents(curated)
        manifest = None
        stats = _stats(spec, curated, written, state, documents, par, time.perf_counter() - t_start)
        _write_text(storage.join(stage, STATS), json.dumps(stats, indent=2) + "\n")
        if written is not None and "groups" in written:  # output.split_by: a shard set per group
            tok_text = storage.read_text(storage.join(stage, TOKENIZER))
            for name, rec in written["groups"].items():
                _write_text(storage.join(stage, name, MANIFEST), _manifest(spec, rec).to_json())
                _write_text(storage.join(stage, name, TOKENIZER), tok_text)
        elif written is not None:
            manifest = _manifest(spec, written)
            _write_text(storage.join(stage, MANIFEST), manifest.to_json())
        self._check_cancel()
        self.out.commit()
        _clear(str(self.out.work))
        seconds = round(time.perf_counter() - t0, 3)
        self._emit(ev.PhaseChanged(phase="finalize", state="finished", seconds=seconds))
        out = stats["output"]
        self._emit(ev.JobFinished(output=str(self.out.path), shards=out["shards"], samples=out["samples"],
                                  tokens=out["tokens"], documents=curated["docs"], seconds=stats["seconds"]["total"]))
        return JobResult(self.out.path, manifest, stats)

    def _export_documents(self, curated: dict[str, Any]) -> dict[str, Any]:
        """``documents/part-NNNNNN.{parquet,jsonl}``: ``range_docs`` documents each, in ``ord`` order, so
        the files are the same for any parallelism; listed with checksums in ``documents/index.json``."""
        import json

        import ray

        from pipeline.output.curated import export_documents, sorted_parts
        from pipeline.output.parallel_write import range_bounds

        task = ray.remote(num_cpus=1)(export_documents)
        parts = ray.put(sorted_parts(curated["parts"]))
        bounds = range_bounds(curated["docs"], self.spec.packing.range_docs)
        curated_dir, dest = storage.join(str(self.out.work), "curated"), storage.join(str(self.out.stage), "documents")
        refs = [task.remote(curated_dir, parts, k, lo, hi, dest, self.spec.output.documents)
                for k, (lo, hi) in enumerate(bounds)]
        self._inflight = refs
        listing = [self._get(r) for r in refs]
        self._inflight = []
        index = {"format": 1, "documents": self.spec.output.documents, "rows": sum(p["rows"] for p in listing),
                 "parts": listing}
        _write_text(storage.join(dest, "index.json"), json.dumps(index, indent=2) + "\n")
        return {"format": index["documents"], "parts": len(listing), "rows": index["rows"]}

    # ---- plumbing ----------------------------------------------------------------------------------

    def _start_ray(self) -> bool:
        from pipeline.job.ray_env import init_ray

        ex = self.spec.execution
        log_path = self._log_path or _local_log_path(self.out, self.spec)
        try:
            return init_ray(ex.address, ex.num_cpus, log_path=log_path)
        except (ConnectionError, TimeoutError, ValueError, RuntimeError) as exc:
            where = ex.address or "a local Ray node"
            raise JobError(f"execution.address: cannot connect to {where}: {str(exc).splitlines()[0]}",
                           "infra") from None

    def _get(self, ref: Any) -> Any:
        """A task's result; a task's own error becomes a JobError naming what failed."""
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            if isinstance(cause, JobError):
                raise JobError(str(cause), cause.category) from None
            if isinstance(cause, OSError):
                raise JobError(describe_os_error(cause, cause.filename), "infra") from None
            raise JobError(f"{self.phase}: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}",
                           "app") from None
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError) as exc:
            raise JobError(f"{self.phase}: Ray lost a worker: {str(exc).splitlines()[0]}", "infra") from None

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise JobCancelled(f"cancelled during {self.phase or 'start'}")

    def _cancel_inflight(self) -> None:
        if not self._inflight:
            return
        import ray

        # not force=True: force-killing workers while their tasks complete can abort the driver inside Ray
        # ("Tried to complete task that was not pending", seen under the service); a Python task stops at its next
        # bytecode, and a local Ray is shut down right after anyway
        for ref in self._inflight:
            try:
                ray.cancel(ref, force=False)
            except Exception:  # noqa: BLE001 - finished or already gone
                pass
        self._inflight = []

    def _emit(self, event: ev.Event) -> None:
        with self._emit_lock:
            if self._events_log is not None:
                self._events_log.append(ev.to_dict(event), sync=False)
            for sink in self._sinks:
                sink(event)

    def _fail(self, exc: JobError) -> JobError:
        try:
            self._emit(ev.JobFailed(category=exc.category, message=str(exc), phase=self.phase))
        except Exception:  # noqa: BLE001 - reporting must not hide the failure
            pass
        return exc


# ---- records -> outputs ---------------------------------------------------------------------------


def _clear(work: str) -> None:
    """Empty the work folder (a new job, or one that has been committed)."""
    storage.rmtree(work)
    storage.makedirs(work)


def _write_text(path: str, text: str) -> None:
    storage.write_text(path, text)


def _group_of(stage: str, root: str) -> str:
    """``.`` for the output's own shard set, ``de`` for a group's (``output.split_by``)."""
    return stage[len(root):].strip("/") or "."


def _local_log_path(out: Any, spec: JobSpec) -> str:
    """Ray's logs go to a local file: the output's ``.tokenmill/job.log``, or for an object-store output a
    file in the temp folder named by the output (a log is appended to, which an object store cannot do)."""
    if not storage.is_remote(str(out.path)):
        return storage.join(str(out.private), "job.log")
    import hashlib

    tag = hashlib.sha256(str(out.path).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"tokenmill-{tag}.log")


def _shard_intact(stage: str, rec: dict[str, Any]) -> bool:
    """A recorded shard is kept only if its file is there with the recorded size and sha256."""
    path = storage.join(stage, rec["name"])
    try:
        return storage.size(path) == rec["bytes"] and storage.sha256(path) == rec["sha256"]
    except OSError:
        return False


def _shard_event(rec: dict[str, Any], reused: bool, group: str = ".") -> ev.ShardWritten:
    name = rec["name"] if group == "." else f"{group}/{rec['name']}"  # a path below the output folder
    return ev.ShardWritten(name=name, sha256=rec["sha256"], samples=rec["samples"], tokens=rec["tokens"],
                           writer=rec.get("writer", ""), reused=reused)


def _write_record(spec: JobSpec, ranges: list[dict[str, Any]], shards: list[dict[str, Any]], info: Any
                  ) -> dict[str, Any]:
    from pipeline.output.parallel_write import merge_packing

    return {
        "shards": [{k: r[k] for k in ("name", "samples", "tokens", "sha256", "bytes", "partial")} for r in shards],
        "writers": sorted({r.get("writer", "") for r in shards}),
        "packing": merge_packing(ranges, spec.packing.seq_len, spec.packing.method),
        "has_mask": any(r["has_mask"] for r in ranges),
        "tokenize": {"docs_in": sum(r["hi"] - r["lo"] for r in ranges),
                     "docs_out": sum(r["hi"] - r["lo"] for r in ranges),
                     "bytes_in": sum(r["bytes_in"] for r in ranges),
                     "seconds": round(sum(r["tokenize_seconds"] for r in ranges), 3)},
        "task_seconds": round(sum(r["seconds"] for r in ranges) + sum(r.get("seconds", 0) for r in shards), 3),
        "info": {"vocab_size": info.vocab_size, "bos_id": info.bos_id, "eos_id": info.eos_id, "pad_id": info.pad_id,
                 "add_bos": info.add_bos, "add_eos": info.add_eos, "sha256": info.sha256},
    }


def _merge_written(spec: JobSpec, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The write records of every group as one, for the job's totals in stats.json."""
    from pipeline.output.parallel_write import merge_packing

    packing = merge_packing([{"packing": r["packing"]} for r in records], spec.packing.seq_len, spec.packing.method)
    packing["ranges"] = sum(r["packing"]["ranges"] for r in records)
    tokenize = {k: sum(r["tokenize"][k] for r in records) for k in ("docs_in", "docs_out", "bytes_in")}
    tokenize["seconds"] = round(sum(r["tokenize"]["seconds"] for r in records), 3)
    return {"shards": [s for r in records for s in r["shards"]], "packing": packing, "tokenize": tokenize,
            "writers": sorted({w for r in records for w in r["writers"]})}


def _manifest(spec: JobSpec, written: dict[str, Any]) -> Manifest:
    info = written["info"]
    return Manifest(
        spec_hash=spec.content_hash(),
        tokenizer_hash=info["sha256"],
        seq_len=spec.packing.seq_len,
        dtype=token_dtype(info["vocab_size"]).name,
        vocab_size=info["vocab_size"],
        samples_per_shard=spec.output.samples_per_shard,
        bos_id=info["bos_id"] if info["add_bos"] else None,
        eos_id=info["eos_id"] if info["add_eos"] else None,
        pad_id=info["pad_id"],
        has_loss_mask=written["has_mask"],
        shards=[ShardInfo(**s) for s in written["shards"]],
        extra={"job": spec.name, "packing": written["packing"], "add_bos": info["add_bos"],
               "add_eos": info["add_eos"]},
    )


def _stats(spec: JobSpec, curated: dict[str, Any], written: dict[str, Any] | None, state: WorkState,
           documents: dict[str, Any] | None, par: int, total_s: float) -> dict[str, Any]:
    stages = dict(curated["stages"])
    seconds = {"curation": curated.get("seconds", 0.0)}
    output: dict[str, Any] = {"shards": 0, "samples": 0, "tokens": 0}
    stats: dict[str, Any] = {"job": spec.name}
    if written is not None and "groups" in written:
        groups = written["groups"]
        stats["groups"] = {name: {"documents": curated["groups"][name]["docs"], "shards": len(rec["shards"]),
                                  "samples": sum(s["samples"] for s in rec["shards"]),
                                  "tokens": sum(s["tokens"] for s in rec["shards"]), "packing": rec["packing"]}
                           for name, rec in groups.items()}
        written = _merge_written(spec, list(groups.values()))
    if written is not None:
        stages["90-tokenize"] = {"docs_in": written["tokenize"]["docs_in"], "docs_out": written["tokenize"]["docs_out"],
                                 "dropped": {}, "bytes_in": written["tokenize"]["bytes_in"], "bytes_out": 0,
                                 "seconds": written["tokenize"]["seconds"]}
        output = {"shards": len(written["shards"]), "samples": sum(s["samples"] for s in written["shards"]),
                  "tokens": sum(s["tokens"] for s in written["shards"])}
        seconds["tokenizer"] = state.done("tokenizer")["seconds"]
        seconds["tokenize_pack_write"] = state.done("write")["seconds"]
        stats["packing"] = written["packing"]
        stats["writers"] = len(written["writers"])
    seconds["total"] = round(total_s, 3)
    stats["stages"] = [{"stage": k, **v} for k, v in sorted(stages.items())]
    stats["output"] = output
    if documents is not None:
        stats["documents"] = documents
    stats["seconds"] = seconds
    write_s = seconds.get("tokenize_pack_write", 0.0)
    stats["throughput"] = {"docs_per_s": round(curated["docs"] / max(total_s, 1e-9), 1),
                           "tokens_per_s": round(output["tokens"] / max(write_s, 1e-9), 1) if write_s else 0.0}
    stats["parallelism"] = par
    return stats


def run_job(spec: JobSpec, on_event: EventSink | None = None) -> JobResult:
    """Run ``spec`` to the end (the engine behind ``tokenmill run``)."""
    return Job(spec, on_event=on_event).run()


__all__ = ["Job", "JobCancelled", "JobError", "JobResult", "run_job"]
