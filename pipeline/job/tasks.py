"""The Ray plumbing every phase shares: starting Ray, results with their errors translated, cancel.

:class:`RayTasks` holds the job's work in flight: what a cancel stops, and where a task's failure
becomes one :class:`~pipeline.job.errors.JobError` naming the phase. :class:`PhaseContext` is what a
phase gets from the engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import ray
from ray import ObjectRef

from pipeline import storage
from pipeline.job import events as ev
from pipeline.job.deadline import process_deadline
from pipeline.job.errors import JobCancelled, JobError, as_job_error, first_line
from pipeline.job.ray_env import init_ray, ray_info, start_target
from pipeline.spec import JobSpec

T = TypeVar("T")
EventSink = Callable[[ev.Event], None]


def start_ray(spec: JobSpec, log_path: str, emit: EventSink, timeout_s: float = ev.RAY_START_TIMEOUT_S,
              report: Callable[[JobError], object] | None = None) -> bool:
    """Start or join Ray for ``spec`` (True when this call started it), Ray's output to ``log_path``; ``emit``
    gets ``ray_starting`` before and ``ray_started`` once it is up (the seconds between are Ray's own start).

    Ray that is not up within ``timeout_s`` (an address that accepts and never answers holds ``ray.init`` for
    minutes, deaf to signals) ends the process (:func:`pipeline.job.deadline.process_deadline`) from a watchdog
    thread, once ``report`` got the ``infra`` failure ("could not start or join Ray at ADDRESS within 60 s": the
    engine's ``job_failed``) and stderr its ``error:`` line.

    Whatever Ray's start raises is an ``infra`` failure, one line: nothing answering at the address
    (``ConnectionError``), ``TimeoutError``, a local node that timed out during startup or whose GCS or raylet
    never came up (plain ``Exception`` in ``ray._private.node``), ``RuntimeError``/``ValueError`` from
    ``ray.init``, an OS error (no room for Ray's session folder). SIGTERM while ``ray.init`` has its own
    handler in place (``sys.exit``) is a cancel.
    """
    ex = spec.execution
    target = start_target(ex.address)
    emit(ev.RayStarting(address=target, num_cpus=ex.num_cpus if target == "local" else None))
    t0 = time.perf_counter()
    late = (f"could not start a local Ray node within {timeout_s:g} s" if target == "local" else
            f"could not start or join Ray at {target} within {timeout_s:g} s")
    try:
        with process_deadline(timeout_s, partial(_give_up, late, report)):
            own = init_ray(ex.address, ex.num_cpus, log_path=log_path)
    except SystemExit as exc:
        if exc.code not in (signal.SIGTERM, signal.SIGINT):
            raise
        raise JobCancelled("cancelled while Ray was starting") from None
    except Exception as exc:  # noqa: BLE001 - every way a start fails is one line (see above)
        env = os.environ.get("RAY_ADDRESS")
        what = (f"execution.address: cannot connect to {ex.address}" if ex.address else
                f"cannot connect to Ray at {env} (RAY_ADDRESS)" if env else "cannot start a local Ray node")
        detail = first_line(exc) or type(exc).__name__
        if type(exc) not in (Exception, ConnectionError, TimeoutError):  # a plain one says it all itself
            detail = f"{type(exc).__name__}: {detail}"
        raise JobError(f"{what}: {detail}", "infra") from None
    info = ray_info()
    emit(ev.RayStarted(seconds=round(time.perf_counter() - t0, 3), cpus=info.cpus, address=info.address,
                       dashboard=info.dashboard, own=own))
    return own


def _give_up(message: str, report: Callable[[JobError], object] | None) -> None:
    if report is not None:
        report(JobError(message, "infra"))
    with contextlib.suppress(Exception):  # a closed stderr: the event is the outcome all the same
        print(f"error: {message}", file=sys.stderr, flush=True)


#: Ray's own output, beside the job's log (which holds tokenmill's lines only)
RAY_LOG = "ray.log"


def log_paths(output: str, private: str, job_log: str | None = None) -> tuple[str, str]:
    """The job's log and Ray's (``ray.log`` in the same folder): ``job_log`` when given (the service's, in the
    attempt's folder), else the output's ``.tokenmill/job.log``, or for an object-store output a folder in the
    temp folder named by the output (a log is appended to, which an object store cannot do)."""
    if job_log is None and not storage.is_remote(output):
        job_log = storage.join(private, "job.log")
    elif job_log is None:
        tag = hashlib.sha256(output.encode()).hexdigest()[:12]
        job_log = os.path.join(tempfile.gettempdir(), f"tokenmill-{os.getuid()}-{tag}", "job.log")
    return job_log, os.path.join(os.path.dirname(job_log), RAY_LOG)


def stop_ray() -> None:
    ray.shutdown()


def parallelism(requested: int | None) -> int:
    """Workers per stage: the spec's number, else the cluster's CPUs."""
    return requested or max(1, int(ray.cluster_resources().get("CPU", 1)))


class RayTasks:
    """The job's Ray work in flight. ``phase()`` names the phase a failure is reported in."""

    def __init__(self, phase: Callable[[], str | None]):
        self.phase = phase
        self.inflight: list[ObjectRef] = []

    def get(self, ref: ObjectRef[T]) -> T:
        """A task's result; a task's own error becomes a JobError naming what failed."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise as_job_error(cause, self.phase()) from None
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError) as exc:
            raise JobError(f"{self.phase()}: Ray lost a worker: {first_line(exc)}", "infra") from None

    def get_all(self, refs: Iterable[ObjectRef[T]]) -> list[T]:
        """Every result, in order; the refs count as in flight until then."""
        self.inflight = list(refs)
        out = [self.get(r) for r in self.inflight]
        self.inflight = []
        return out

    def submit(self, ref: ObjectRef[T]) -> None:
        """One more task in flight, its result to come from :meth:`next_done`."""
        self.inflight.append(ref)

    def next_done(self, timeout: float) -> list[object]:
        """The results of the tasks that finished within ``timeout`` seconds (at most one; none on a timeout)."""
        if not self.inflight:
            return []
        done, _ = ray.wait(self.inflight, num_returns=1, timeout=timeout)
        for ref in done:
            self.inflight.remove(ref)
        return [self.get(ref) for ref in done]

    def cancel(self) -> None:
        """Ask every task in flight on a cluster the job joined to stop. A local Ray is shut down instead, never
        cancelled task by task: cancelling a task whose reply is on its way aborts the driver inside Ray, even
        without ``force`` (``task_manager.cc``: "Tried to complete task that was not pending", exit 1 with
        nothing printed; seen under load on a SIGINT of ``tokenmill run``)."""
        for ref in self.inflight:
            try:
                ray.cancel(ref, force=False)
            except Exception:  # noqa: BLE001 - finished or already gone
                pass
        self.inflight = []


@dataclass(frozen=True)
class PhaseContext:
    """What a phase works with: the spec, the output's work and stage folders, the workers, events, cancel."""

    spec: JobSpec
    #: ``.tokenmill/work``: what a rerun keeps (curated parts, ranges, the logs of finished work)
    work: str
    #: where outputs are staged until the commit publishes them
    stage: str
    par: int
    emit: EventSink
    check_cancel: Callable[[], None]
    tasks: RayTasks
