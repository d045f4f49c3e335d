"""Cancel and publish are one decision, taken in the database: the handshake between a job process and the supervisor.

A cancel that landed between the job process's commit and the supervisor's state change left a job CANCELLED
whose output was published (its retries then failed "already holds a shard set"). The contract now:

1. The job process, its output staged and not cancelled, writes ``RUN_DIR/publish.request`` and waits for
   ``RUN_DIR/publish.answer`` (:func:`ask`); it never touches the database.
2. The supervisor, on its next tick, decides under the job's row lock (:func:`service.store.repo.claim_publish`):
   *refused* if a cancel was accepted (``cancel_requested``), else the claim is recorded (a ``publishing`` event
   of the attempt) and committed; then it writes the answer (:func:`answer`; again on a later tick if it died in
   between: the decision is the database's, the file only carries it).
3. Once the claim is recorded, ``POST /v1/jobs/{id}/cancel`` is a 409 (:func:`service.store.repo.cancel_job`): the
   job ends SUCCEEDED (FAILED only if the commit itself fails), never CANCELLED with its output published. A
   refused job process publishes nothing and ends ``job_failed`` ``cancelled``: a CANCELLED job published nothing,
   and its retry resumes the same work.
4. In the job process, from the moment it is granted (``tokenmill run``, with no service: from the commit's start)
   the engine ignores a cancel (SIGTERM, SIGINT; a second signal still exits at once): see
   :mod:`pipeline.job.decision`.

Files, not a connection: the job process may run on a Ray cluster's head (:mod:`service.runner.ray_jobs`), which
shares the state folder but not the database. Checking for a pending request costs the supervisor two ``stat``
calls per running job and tick.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

REQUEST_FILE = "publish.request"
ANSWER_FILE = "publish.answer"
GRANTED, REFUSED = "granted", "refused"
#: seconds between two looks at the answer: the supervisor's tick (0.5 s by default) dominates the wait
POLL_S = 0.05


def ask(run_dir: Path) -> bool:
    """From the job process: may it publish? Waits for the supervisor's answer (a signal interrupts the wait:
    the caller's cancel)."""
    answer_path = run_dir / ANSWER_FILE
    if not answer_path.exists():
        (run_dir / REQUEST_FILE).touch()
    while not answer_path.exists():
        time.sleep(POLL_S)
    return answer_path.read_text(encoding="utf-8").strip() == GRANTED


def pending(run_dir: str) -> bool:
    """Whether the job process of ``run_dir`` waits for an answer."""
    folder = Path(run_dir)
    return (folder / REQUEST_FILE).exists() and not (folder / ANSWER_FILE).exists()


def answer(run_dir: str, granted: bool) -> None:
    """The supervisor's answer, written whole (a rename) once the decision is committed."""
    tmp = os.path.join(run_dir, f".{ANSWER_FILE}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(GRANTED if granted else REFUSED)
    os.replace(tmp, os.path.join(run_dir, ANSWER_FILE))
