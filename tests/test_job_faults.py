"""The job's last fault paths (issue 23): Ray that cannot be started or reached, and how any failure is named.

- ``tokenmill run`` whose Ray cannot start (a node that timed out during startup, simulated at ``ray.init``
  with the exception Ray raises) or cannot be reached (``--address 127.0.0.1:1``): one ``error:`` line,
  exit 1 (``infra``), and a ``job_failed`` event with category ``infra`` in ``OUT/.tokenmill/events.jsonl``.
- :func:`pipeline.job.errors.as_job_error`: an OS error however deep Ray wrapped it (a full disk is ``infra``),
  a user's path error ``validation``, anything else ``app`` in one line.
A really full disk (a tmpfs) is tests/test_output_dir.py's case 13; a lost job process's Ray, reaped by the
supervisor, tests/test_service_api.py and tests/test_service_e2e.py.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import ray._private.node

from pipeline.job.errors import JobCancelled, JobError, as_job_error
from pipeline.output.layout import OutputError

ROOT = Path(__file__).resolve().parent.parent
#: what ``ray._private.node.Node`` raises when its raylet does not register in time (checked against Ray below)
STARTUP_TIMEOUT = ("The current node timed out during startup. This could happen because some of the raylet "
                   "failed to startup or the GCS has become overloaded.")
#: ``tokenmill run`` with ``ray.init`` raising that exception, as Ray's own start does under heavy load
TIMED_OUT_CLI = f"""
import sys, ray
def init(*args, **kwargs):
    raise Exception({STARTUP_TIMEOUT!r})
ray.init = init
from service.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_simulated_timeout_is_the_one_ray_raises():
    """The simulation below raises what Ray's node start raises: a plain ``Exception`` with this message."""
    source = Path(ray._private.node.__file__).read_text()
    found = re.search(r"raise (\w+)\(\s*\"The current node timed out during startup\. This \"\s*\"could happen because "
                      r"some of the raylet failed to \"\s*\"startup or the GCS has become overloaded\.\"", source)
    assert found and found.group(1) == "Exception"


def _spec(tmp_path: Path) -> Path:
    (tmp_path / "in.jsonl").write_text('{"text": "hello world"}\n')
    spec = {"name": "faults", "inputs": [{"path": str(tmp_path / "in.jsonl")}],
            "output": {"path": str(tmp_path / "out")}, "execution": {"parallelism": 1}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _run_cli(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_TMPDIR": str(tmp_path / "ray")}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _failure(tmp_path: Path) -> dict:
    events = [json.loads(line) for line in (tmp_path / "out" / ".tokenmill" / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events] == ["ray_starting", "job_failed"]  # before any phase: Ray never came up
    return events[-1]


@pytest.mark.parametrize("how", ["timed out during startup", "unreachable address"])
def test_ray_that_cannot_start_or_be_reached_is_one_infra_line_and_a_job_failed_event(tmp_path, how):
    spec = _spec(tmp_path)
    if how == "unreachable address":
        run = _run_cli(["-m", "service.cli", "run", str(spec), "--address", "127.0.0.1:1"], tmp_path)
        expected = "error: execution.address: cannot connect to 127.0.0.1:1: nothing answers at 127.0.0.1:1"
    else:
        run = _run_cli(["-c", TIMED_OUT_CLI, "run", str(spec)], tmp_path)
        expected = f"error: cannot start a local Ray node: {STARTUP_TIMEOUT}"
    assert run.returncode == 1, run.stderr  # infra: a failure of the machine, not of the spec
    assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith(expected), run.stderr
    failed = _failure(tmp_path)
    assert failed["category"] == "infra" and run.stderr.startswith(f"error: {failed['message']}")


class _RayTaskError(RuntimeError):
    """Like ``ray.exceptions.RayTaskError``: its text is the remote traceback, ``cause`` what the task raised."""

    def __init__(self, cause: BaseException):
        super().__init__("ray::write_shard_task() (pid=1, ip=127.0.0.1)\nTraceback ...")
        self.cause = cause


def _ray_data_oserror(code: int) -> OSError:
    """A stage's OSError as Ray Data hands it on: its retry note appended to the arguments (it becomes the
    file name once pickled), behind a RayTaskError."""
    exc = OSError(code, os.strerror(code), "Failed to apply UDF transform after 1/1 attempts.\nTo change ...")
    return _RayTaskError(exc)


@pytest.mark.parametrize("exc, category, message", [
    (_ray_data_oserror(errno.ENOSPC), "infra", "curate: No space left on device"),
    (_RayTaskError(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/o/shards/x.tar")), "infra",
     f"cannot write /o/shards/x.tar: {os.strerror(errno.EDQUOT)}"),
    (RuntimeError("wrapped").with_traceback(None), "app", "curate: RuntimeError: wrapped"),
    (_RayTaskError(JobError("tokenizer.path: no such file", "validation")), "validation",
     "tokenizer.path: no such file"),
    (_RayTaskError(ValueError("token id 70000 does not fit\nmore")), "app",
     "curate: ValueError: token id 70000 does not fit"),
    (OutputError("output.path: not a folder"), "validation", "output.path: not a folder"),
    (KeyboardInterrupt(), "cancelled", "cancelled during curate"),
])
def test_any_failure_becomes_one_job_error_with_its_category(exc, category, message):
    err = as_job_error(exc, "curate")
    assert (err.category, str(err)) == (category, message)
    assert isinstance(err, JobCancelled) == (category == "cancelled")


def test_an_os_error_behind_another_exception_is_found_and_a_user_error_is_validation():
    try:
        try:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), "/o/big")
        except OSError as inner:
            raise RuntimeError("writer failed") from inner
    except RuntimeError as outer:
        assert (as_job_error(outer, "write").category, str(as_job_error(outer, "write"))) == \
            ("infra", f"cannot write /o/big: {os.strerror(errno.EFBIG)}")
    assert as_job_error(ValueError("tokenizer.eos: not in the vocabulary"), "write", (ValueError,)).category == \
        "validation"
