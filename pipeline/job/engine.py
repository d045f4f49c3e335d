"""The job engine: one job = four phases that emit typed events and can be resumed or cancelled.

The engine only sequences: the order of the phases, what a rerun skips, cancel, failure translation and
Ray's start and stop. Each phase is a module that gets a :class:`~pipeline.job.tasks.PhaseContext` and
the typed records of the phases before it (:mod:`pipeline.job.records`):

1. **curate** (:mod:`pipeline.job.curate`, graph in :mod:`pipeline.job.graph`): read and run the stages on
   Ray; the workers write the kept documents as Parquet parts in ``.tokenmill/work/curated/``.
2. **tokenizer** (:mod:`pipeline.job.tokenizer`): train BPE on the first documents (or load ``tokenizer.path``).
3. **write** (:mod:`pipeline.job.write`): pack ranges and write shards on the workers, each recorded at once.
4. **finalize** (:mod:`pipeline.job.finalize`): stats, manifests, documents staged, then committed in one step.

Everything a rerun needs lives in the output's work folder (``.tokenmill/work``, :mod:`pipeline.job.state`;
a failure drops the rest, :mod:`pipeline.job.leftovers`): a rerun of the same spec skips finished phases,
ranges and shards (a shard file is neither recomputed nor rewritten) and ends byte-identical to an
uninterrupted run; another spec is refused unless ``overwrite``. The driver handles counts and names only.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

from pipeline import storage
from pipeline.job import events as ev
from pipeline.job import leftovers
from pipeline.job.decision import CancelOrPublish
from pipeline.job.errors import JobCancelled, JobError, as_job_error
from pipeline.job.records import CurateResult, TokenizerRecord, written_from_json, written_to_json
from pipeline.job.state import EVENTS, JsonlLog, JsonObject, StateError, WorkState
from pipeline.output.open_store import check_not_overlapping, open_output_dir
from pipeline.shard_format import Manifest
from pipeline.spec import JobSpec
from pipeline.tokenize import TokenizerError

EventSink = Callable[[ev.Event], None]
R = TypeVar("R")


@dataclass
class JobResult:
    output_dir: Path | str  #: the output folder (a Path for a local one, the URI of an object-store one)
    manifest: Manifest | None
    stats: JsonObject = field(default_factory=dict)  #: ``stats.json`` as written


class Job:
    """Run one spec. ``on_event`` gets every event (from the calling thread, and from one progress
    thread while curation runs); ``cancel()`` may be called from any thread or a signal handler. ``log_path``:
    the job's log, tokenmill's lines (default ``OUT/.tokenmill/job.log``); Ray's output goes to ``ray.log`` by it."""

    def __init__(self, spec: JobSpec, on_event: EventSink | None = None, log_path: str | None = None,
                 ray_start_timeout_s: float | None = None, owner: str | None = None,
                 may_publish: Callable[[], bool] | None = None):
        self.spec = spec
        self._decision = CancelOrPublish(may_publish)  # may_publish: the service's decision (service.runner.publish)
        #: the team a service runs the job for: recorded in a new output's marker, and another's is refused
        self.owner = owner
        self.ray_start_timeout_s = ray_start_timeout_s or ev.RAY_START_TIMEOUT_S
        self.out = open_output_dir(spec.output.path)
        self._sinks = [on_event] if on_event else []
        self._events_log: JsonlLog | None = None
        self._emit_lock = threading.Lock()
        self._log_path = log_path
        self._state: WorkState | None = None
        self.phase: str | None = None

    def cancel(self) -> bool:
        """Ask the job to stop; False (and ignored) once it publishes (:mod:`pipeline.job.decision`)."""
        return self._decision.cancel()

    @property
    def cancelled(self) -> bool:
        return self._decision.cancelled

    def run(self) -> JobResult:
        """Run the job; a failure drops what a rerun won't reuse and is reported once (:func:`.errors.as_job_error`)."""
        spec = self.spec
        try:
            check_not_overlapping(spec.output.path, [i.path for i in spec.inputs])  # local or object store
            with self.out.lock():
                self.out.claim(spec.output.overwrite, self.owner)
                try:
                    return self._run_locked()
                except BaseException:  # under the lock, Ray stopped; another spec's work is refused, not touched
                    if self._state is not None:
                        leftovers.drop(str(self.out.path), str(self.out.work), str(self.out.stage), self._state)
                    raise
        except (Exception, KeyboardInterrupt) as exc:
            raise self._fail(as_job_error(exc, self.phase, (TokenizerError,))) from None
        finally:  # after the failure event, which goes to the log too
            if self._events_log:
                with contextlib.suppress(OSError):  # a full disk: the event went to the sinks all the same
                    self._events_log.close()
                self._events_log = None

    def _run_locked(self) -> JobResult:
        # lazy: Ray and Ray Data (~1 s), not for `import pipeline.job.engine`; a signal meanwhile is a cancel
        from pipeline.job import curate, finalize, graph, summary, tasks, tokenizer, write

        spec, t_start = self.spec, time.perf_counter()
        try:  # a rerun continues the work folder; another spec's is refused unless overwrite
            state = self._state = WorkState.for_job(str(self.out.work), spec.content_hash(), spec.output.overwrite)
        except StateError as exc:
            raise JobError(str(exc), "validation") from None
        self._events_log = JsonlLog(storage.join(str(self.out.private), EVENTS))
        job_log, ray_log = tasks.log_paths(str(self.out.path), str(self.out.private), self._log_path)
        self._sinks.append(summary.JobLog(job_log))  # tokenmill's lines; Ray's output goes to ray_log
        started_ray = tasks.start_ray(spec, ray_log, self._emit, self.ray_start_timeout_s, self._fail)
        ray_tasks = tasks.RayTasks(lambda: self.phase)
        try:
            par = tasks.parallelism(spec.execution.parallelism)
            ctx = tasks.PhaseContext(spec, str(self.out.work), str(self.out.stage), par, self._emit,
                                     self._check_cancel, ray_tasks)
            self._emit(ev.JobStarted(job=spec.name, spec_hash=state.spec_hash, output=str(self.out.path),
                                     parallelism=par, resumed_phases=tuple(p for p in ev.PHASES if state.done(p)),
                                     stages=graph.stage_keys(spec)))
            curated = self._phase("curate", state, lambda: curate.run(ctx), CurateResult.to_json,
                                  CurateResult.from_json)
            if curated.docs == 0:
                raise JobError("no document survived the stages: nothing to write", "input")
            written = None
            if spec.tokenizer is not None:
                tok = self._phase("tokenizer", state, lambda: tokenizer.run(ctx, curated), TokenizerRecord.to_json,
                                  TokenizerRecord.from_json)
                written = self._phase("write", state, lambda: write.run(ctx, curated, tok), written_to_json,
                                      written_from_json)
            self._enter("finalize")
            t0 = time.perf_counter()
            publish = partial(self._decision.publish, self.out.commit, self._check_cancel)
            stats, manifest = finalize.run(ctx, state, curated, written, t_start, publish)
            self._emit(ev.PhaseChanged(phase="finalize", state="finished", seconds=round(time.perf_counter() - t0, 3)))
            self._emit(ev.JobFinished(output=str(self.out.path), shards=stats.output.shards,
                                      samples=stats.output.samples, tokens=stats.output.tokens,
                                      documents=curated.docs, seconds=stats.seconds.total))
            out = str(self.out.path)
            return JobResult(out if storage.is_remote(out) else Path(out), manifest, stats.to_json())
        finally:  # a local Ray's shutdown ends its tasks; a cluster's are cancelled (tasks.RayTasks.cancel)
            if started_ray:
                tasks.stop_ray()
            else:
                ray_tasks.cancel()

    def _phase(self, name: ev.Phase, state: WorkState, body: Callable[[], R], dump: Callable[[R], JsonObject],
               load: Callable[[JsonObject], R]) -> R:
        """Run a phase and save its record, or skip it when an earlier run finished it (its saved record)."""
        saved = state.done(name)
        if saved is not None:
            self._emit(ev.PhaseChanged(phase=name, state="skipped", seconds=state.seconds(name)))
            return load(saved)
        self._enter(name)
        t0 = time.perf_counter()
        record = body()
        seconds = round(time.perf_counter() - t0, 3)
        state.finish(name, dump(record), seconds)
        self._emit(ev.PhaseChanged(phase=name, state="finished", seconds=seconds))
        return record

    def _enter(self, name: ev.Phase) -> None:
        self._check_cancel()
        self.phase = name
        self._emit(ev.PhaseChanged(phase=name, state="started"))

    def _check_cancel(self) -> None:
        if self._decision.cancelled:
            raise JobCancelled(f"cancelled during {self.phase or 'start'}")

    def _emit(self, event: ev.Event, final: bool = False) -> None:
        """To the events log and every sink; the ``final`` event reaches the sinks even if the log fails (disk full)."""
        with self._emit_lock:
            try:
                if self._events_log is not None:
                    self._events_log.append(ev.to_dict(event), sync=final)
            except OSError:
                if not final:
                    raise
            for sink in self._sinks:
                sink(event)

    def _fail(self, exc: JobError) -> JobError:
        with contextlib.suppress(Exception):  # reporting must not hide the failure
            self._emit(ev.JobFailed(category=exc.category, message=str(exc), phase=self.phase), final=True)
        return exc


def run_job(spec: JobSpec, on_event: EventSink | None = None) -> JobResult:
    """Run ``spec`` to the end (the engine behind ``tokenmill run``)."""
    return Job(spec, on_event=on_event).run()


__all__ = ["Job", "JobCancelled", "JobError", "JobResult", "run_job"]
