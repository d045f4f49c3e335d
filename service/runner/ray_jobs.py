"""Attempts as Ray Jobs API submissions: the driver runs on the cluster, the service submits, follows, stops.

With ``ray_jobs_url`` set (``TOKENMILL_RAY_JOBS_URL``, ``tokenmill serve --ray-jobs-url http://head:8265``, the
dashboard's REST API on the head) the supervisor submits each attempt with
:class:`ray.job_submission.JobSubmissionClient` instead of starting a local process. The entrypoint is the local mode's
own: ``python -m service.runner.job_process --job ID --attempt N --run-dir DIR --log-output``, so the job behaves the
same (admission, engine, events, exit codes, SIGTERM = cancel); Ray's ``RAY_ADDRESS`` in the driver's environment makes
the engine join the cluster instead of starting a node.


How the driver reports back: **through the database, as in the local mode** (:mod:`service.runner.report`:
its run in, its events, logs and publish request out), named by ``TOKENMILL_DATABASE_URL`` in the submission's
environment, *without its password* (the Jobs API shows a submission's environment to whoever reaches the
dashboard): the cluster supplies it (``PGPASSWORD``, a ``.pgpass`` file, a client certificate). The driver's
own folder (``job.log``, ``ray.log``) is in the head's temporary folder; nothing is shared with the service's
disk. Requirements: the head reaches the database; tokenmill is installed on the cluster (the same image) with
``python`` on its ``PATH``; the job's inputs and outputs are reachable from every Ray node, as with any cluster.

Identity: the submission id is ``tokenmill-<job id>-<attempt>``, derived rather than stored, so a
restarted service re-attaches by it, and an attempt whose submission never reached the cluster (the
service died in between) reads as lost (resumed as a new attempt), as a local process that was never
started would. Cancel is ``stop_job``: Ray sends the driver SIGTERM (the job cancels, reports
``cancelled``) and SIGKILL after ``RAY_JOB_STOP_WAIT_TIME_S``, set to the service's ``cancel_grace_s``.
A submission that ends without a terminal event is lost (FAILED: resumed, then FAILED(infra) after
``max_lost``) or, STOPPED from outside the service, CANCELLED. While the Jobs API does not answer, a
running attempt counts as alive (nothing is decided on a network error; a warning is logged). A cluster
with token auth: ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH`` in the service's environment.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from service.runner.process import Ended, ProcessRef

log = logging.getLogger("tokenmill.ray_jobs")

ENTRYPOINT_MODULE = "service.runner.job_process"
#: seconds one request to the Jobs API may take (the supervisor's thread must not hang on a lost head)
REQUEST_TIMEOUT_S = 30.0
RUNNING = frozenset({"PENDING", "RUNNING"})


def submission_id(job_id: str, number: int) -> str:
    return f"tokenmill-{job_id}-{number}"


def entrypoint(job_id: str, number: int, run_dir: Path, python: str = "python") -> str:
    return shlex.join([python, "-m", ENTRYPOINT_MODULE, "--job", job_id, "--attempt", str(number),
                       "--run-dir", str(run_dir), "--log-output"])


def auth_headers(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The bearer token of a cluster with token auth (``RAY_AUTH_TOKEN``, else the file at
    ``RAY_AUTH_TOKEN_PATH``), read here: Ray's client reads its auth mode once per process."""
    env = os.environ if environ is None else environ
    token = env.get("RAY_AUTH_TOKEN")
    if not token and env.get("RAY_AUTH_TOKEN_PATH"):
        try:
            token = Path(env["RAY_AUTH_TOKEN_PATH"]).read_text(encoding="utf-8")
        except OSError:
            token = None
    return {"Authorization": f"Bearer {token.strip()}"} if token and token.strip() else {}


def _client_class() -> Any:
    from ray.job_submission import JobSubmissionClient  # lazy: imports ray (0.4 s), only with a Jobs API URL

    class Client(JobSubmissionClient):
        """The Jobs API client with a timeout on every request (Ray's own has none)."""

        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", REQUEST_TIMEOUT_S)
            return super()._do_request(method, endpoint, **kwargs)

    return Client


class RayJobs:
    """The supervisor's :class:`service.runner.process.Executor` for the Ray Jobs API."""

    def __init__(self, url: str, env: Mapping[str, str] | None = None, stop_wait_s: float = 60.0,
                 python: str = "python"):
        self.url, self.python = url, python
        self.env = {**(env or {}), "RAY_JOB_STOP_WAIT_TIME_S": str(max(1, round(stop_wait_s)))}
        self._client: Any = None
        self._submitted: set[str] = set()
        self._forced: set[str] = set()
        self._last: dict[str, Any] = {}  # submission id -> its last JobDetails (None: the Jobs API has none)

    @property
    def client(self) -> Any:
        if self._client is None:  # connects (and checks the cluster's version) on creation: lazily
            self._client = _client_class()(self.url, headers=auth_headers())
        return self._client

    def launch(self, job_id: str, number: int, run_dir: Path) -> ProcessRef | None:
        sid = submission_id(job_id, number)
        try:
            self.client.submit_job(entrypoint=entrypoint(job_id, number, run_dir, self.python), submission_id=sid,
                                   runtime_env={"env_vars": self.env},
                                   metadata={"tokenmill_job": job_id, "tokenmill_attempt": str(number)})
        except Exception as exc:  # noqa: BLE001 - refused, unreachable, auth: the attempt did not start
            self._client = None
            raise OSError(f"the Ray Jobs API at {self.url} refused the submission {sid}: {exc}") from exc
        self._submitted.add(sid)
        return None  # no pid: the submission id is derived from the attempt

    def _info(self, att: Any) -> Any:
        sid = submission_id(att.job_id, att.number)
        try:
            info = self.client.get_job_info(sid)
        except RuntimeError as exc:
            if "status code 404" not in str(exc):
                raise
            info = None
        self._last[sid] = info
        return info

    def alive(self, att: Any) -> bool:
        try:
            info = self._info(att)
        except Exception as exc:  # noqa: BLE001 - no answer is no news: decide nothing
            self._client = None
            log.warning("the Ray Jobs API at %s did not answer for %s: %s", self.url,
                        submission_id(att.job_id, att.number), exc)
            return True
        return info is not None and str(_status(info)) in RUNNING

    def started_here(self, att: Any) -> bool:
        return submission_id(att.job_id, att.number) in self._submitted

    def name(self, att: Any) -> str:
        return f"the Ray job submission {submission_id(att.job_id, att.number)} ({self.url})"

    def cancel(self, att: Any, force: bool) -> None:
        """``stop_job``: Ray's own SIGTERM, then SIGKILL after the grace (``RAY_JOB_STOP_WAIT_TIME_S``)."""
        sid = submission_id(att.job_id, att.number)
        if force:  # Ray kills it after its grace; ask once more in case the first request was lost
            if sid in self._forced:
                return
            self._forced.add(sid)
        try:
            self.client.stop_job(sid)
        except Exception as exc:  # noqa: BLE001 - asked again once the grace is over; say why
            self._client = None
            log.warning("stop_job %s failed: %s", sid, exc)

    def folder_here(self, att: Any) -> str | None:
        return None  # the driver's folder is on the head: what it shipped is what there is

    def ended(self, att: Any) -> Ended:
        sid = submission_id(att.job_id, att.number)
        self._submitted.discard(sid)
        self._forced.discard(sid)
        info = self._last.pop(sid, None)
        if info is None:
            return Ended(None, f"the Ray Jobs API at {self.url} has no submission {sid}")
        status = _status(info)
        code = getattr(info, "driver_exit_code", None)
        message = (getattr(info, "message", None) or "").strip().splitlines()
        how = f"the Ray Jobs API reports {status} for {sid}" + (f": {message[0]}" if message else "")
        return Ended(code, how, stopped=status == "STOPPED")


def _status(info: Any) -> str:
    status = info.status
    return str(getattr(status, "value", status))
