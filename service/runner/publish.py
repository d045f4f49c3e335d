"""Cancel and publish are one decision, taken in the database: the handshake between a job process and the supervisor.

A cancel that landed between the job process's commit and the supervisor's state change left a job CANCELLED
whose output was published (its retries then failed "already holds a shard set"). The contract now:

1. The job process, its output staged and not cancelled, sets its attempt's ``publish_requested_at`` and waits
   for ``publish_answer`` (:func:`ask`).
2. The leading supervisor, on its next tick, decides under the job's row lock and writes the answer in the same
   transaction (:func:`decide`, :func:`service.store.repo.claim_publish`): *refused* if a cancel was accepted
   (``cancel_requested``), else *granted*, and the claim is recorded (a ``publishing`` event of the attempt).
3. Once the claim is recorded, ``POST /v1/jobs/{id}/cancel`` is a 409 (:func:`service.store.repo.cancel_job`): the
   job ends SUCCEEDED (FAILED only if the commit itself fails), never CANCELLED with its output published. A
   refused job process publishes nothing and ends ``job_failed`` ``cancelled``: a CANCELLED job published nothing,
   and its retry resumes the same work.
4. In the job process, from the moment it is granted (``tokenmill run``, with no service: from the commit's start)
   the engine ignores a cancel (SIGTERM, SIGINT; a second signal still exits at once): see
   :mod:`pipeline.job.decision`.

The request and the answer are columns of the attempt's row (:mod:`service.runner.report`), so the job process
may run anywhere that reaches the database (a Ray cluster's head), and a new leader answers a request the last
one did not.
"""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from service.runner.report import publish_answer, request_publish
from service.store import repo
from service.store.db import Database
from service.store.models import Attempt, Job

GRANTED, REFUSED = "granted", "refused"
#: seconds between two looks at the answer: the supervisor's tick (0.5 s by default) dominates the wait
POLL_S = 0.1


def ask(db: Database, job_id: str, attempt: int) -> bool:
    """From the job process: may it publish? Waits for the supervisor's answer (a signal interrupts the wait:
    the caller's cancel); a database that does not answer is waited for, as a leader that is away is."""
    asked = False
    while True:
        try:
            if not asked:
                request_publish(db, job_id, attempt)
                asked = True
            answer = publish_answer(db, job_id, attempt)
        except Exception:  # noqa: BLE001 - the database is away: the decision waits for it
            answer = None
        if answer is not None:
            return answer == GRANTED
        time.sleep(POLL_S)


def decide(s: Session, job: Job, att: Attempt) -> None:
    """From the supervisor, under the job's row lock: answer the attempt's pending request, if any."""
    if att.publish_requested_at is not None and att.publish_answer is None:
        att.publish_answer = GRANTED if repo.claim_publish(s, job, att.number) else REFUSED
