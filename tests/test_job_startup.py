"""A job's start (issue 22): an event the moment it starts its Ray and one when Ray is up, and Ray's output in
``ray.log``, apart from the job's own log, with the warnings that mean nothing on a healthy run demoted.

Unit tests (no Ray): the warning filter, the fold, the CLI's lines, the job log's lines, the log paths, the
``/logs?source=`` route. One real ``tokenmill run`` (a subprocess: its own Ray, started by the engine).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from pipeline.job import events as ev
from pipeline.job.fold import JobSummary
from pipeline.job.summary import JobLog, event_line
from service.progress import LiveRenderer, PlainRenderer
from service.runner.report import ship_rest

ROOT = Path(__file__).resolve().parents[1]

# ---- the warning filter -------------------------------------------------------------------------------


def _logged(own_node: bool, *messages: str) -> str:
    """What a Ray-like logger writes through a handler carrying the filter (``levelname: message`` lines)."""
    from pipeline.job.ray_env import QuietRayWarnings

    quiet = QuietRayWarnings(own_node=own_node)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    handler.addFilter(quiet)
    lg = logging.getLogger(f"ray.data.test_startup_{own_node}")
    lg.propagate = False
    lg.addHandler(handler)
    try:
        for m in messages:
            lg.warning(m)
        lg.error("Progress bars disabled (an error is never demoted)")
    finally:
        lg.removeHandler(handler)
    return out.getvalue()


HANG = "Warning: The Ray cluster currently does not have any available CPUs. The Dataset job will hang unless more CPUs"


def test_the_filter_demotes_only_the_warnings_of_a_healthy_run():
    text = _logged(True, "Failed to determine local IP via 8.8.8.8", "Progress bars disabled. To enable ...",
                   HANG, "The maximum number of concurrent tasks for 'MapBatches(x)' is set to 2, but the operator "
                   "only received 1 input(s).", "a real problem")
    lines = text.splitlines()
    assert lines[:4] == ["INFO: Failed to determine local IP via 8.8.8.8",
                         "INFO: Progress bars disabled. To enable ...", f"INFO: {HANG}", lines[3]]
    assert lines[3].startswith("INFO: The maximum number")
    assert lines[4:] == ["WARNING: a real problem", "ERROR: Progress bars disabled (an error is never demoted)"]


def test_the_hang_warning_stays_a_warning_on_a_cluster_the_job_joined():
    """Another job's actors may hold a cluster's CPUs: there the warning may mean something."""
    assert _logged(False, HANG).splitlines()[0] == f"WARNING: {HANG}"


def test_a_warning_above_the_handler_level_is_dropped_once_demoted():
    """A handler at WARNING (a console) no longer shows a demoted line; one at INFO (ray.log) keeps it."""
    from pipeline.job.ray_env import QuietRayWarnings

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setLevel(logging.WARNING)
    handler.addFilter(QuietRayWarnings(level=handler.level))
    rec = logging.makeLogRecord({"name": "ray", "levelno": logging.WARNING, "levelname": "WARNING",
                                 "msg": "Failed to determine local IP"})
    handler.handle(rec)
    assert out.getvalue() == ""  # the logger checked the level before the filter demoted it: the filter drops it
    assert rec.levelno == logging.INFO


# ---- the fold and the renderers ----------------------------------------------------------------------


def _start_events() -> list[ev.Event]:
    return [ev.StateChanged(state="RUNNING", attempt=1, ts=10.0),
            ev.RayStarting(address="local", num_cpus=2, ts=10.5),
            ev.RayStarted(seconds=4.1, cpus=2, address="127.0.0.1:6379", ts=14.6),
            ev.JobStarted(job="j", spec_hash="h", output="/o", parallelism=2, ts=14.7),
            ev.PhaseChanged(phase="curate", state="started", ts=14.8)]


def test_the_summary_says_starting_ray_until_it_is_up_and_keeps_its_figures():
    s = JobSummary()
    first, starting, started, job_started, curate = _start_events()
    s.apply(first)
    s.apply(starting)
    stored = s.to_dict()  # what the service stores before job_started
    assert stored["phase"] == "ray" and stored["ray"]["state"] == "starting" and stored["ray"]["num_cpus"] == 2
    assert JobSummary.from_dict(stored).to_dict() == stored
    s.apply(started)
    assert s.phase is None and s.ray is not None and (s.ray.state, s.ray.cpus, s.ray.seconds) == ("ready", 2, 4.1)
    s.apply(job_started)
    s.apply(curate)
    assert s.phase == "curate" and s.ray is not None and s.ray.address == "127.0.0.1:6379" and s.ray.started_ts == 10.5
    assert JobSummary.from_dict(s.to_dict()).ray == s.ray
    # the event's JSON form round-trips like the others (what events.jsonl and the service store)
    assert ev.from_dict(json.loads(json.dumps(ev.to_dict(started)))) == started


def test_plain_lines_say_starting_ray_then_ready():
    out = io.StringIO()
    r = PlainRenderer(out=out, err=out)
    for e in _start_events():
        r(e)
    assert out.getvalue().splitlines()[:2] == ["[tokenmill] starting Ray (local, 2 CPUs)",
                                               "[tokenmill] Ray ready in 4.1 s (2 CPUs)"]
    joined = ev.RayStarting(address="10.0.0.1:6379")
    assert r.lines(joined) == [(out, "joining Ray at 10.0.0.1:6379")]
    assert r.lines(ev.RayStarting(address="local")) == [(out, "starting Ray (local, every CPU)")]


def test_the_live_display_has_a_ray_row_while_it_starts():
    console = Console(file=io.StringIO(), width=120, force_terminal=False, color_system=None)
    live = LiveRenderer(console=console, clock=lambda: 13.5)
    starting = _start_events()[:2]
    for e in starting:
        live(e)
    console.print(live.render())
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "starting Ray (local, 2 CPUs)" in text and re.search(r"ray .*starting, 3s elapsed", text), text
    live(_start_events()[2])
    console.file = io.StringIO()
    console.print(live.render())
    assert "starting," not in console.file.getvalue()


def test_the_job_log_holds_tokenmills_lines_and_no_progress(tmp_path):
    log = JobLog(tmp_path / "sub" / "job.log")
    for e in [*_start_events(), ev.PhaseProgress(phase="curate", done=5, total=None, unit="docs"),
              ev.JobFailed(category="infra", message="boom", phase="curate")]:
        log(e)
    lines = (tmp_path / "sub" / "job.log").read_text().splitlines()
    assert [line.split(" [tokenmill] ", 1)[1] for line in lines] == [
        "starting Ray (local, 2 CPUs)", "Ray ready in 4.1 s (2 CPUs)", "job j: 2 worker(s), output /o",
        "curate: started", "failed (infra) in curate: boom"]
    assert event_line(ev.StageCounters(stages={})) is None


def test_ray_log_lies_beside_the_job_log(tmp_path):
    from pipeline.job.tasks import log_paths

    out = str(tmp_path / "out")
    assert log_paths(out, f"{out}/.tokenmill") == (f"{out}/.tokenmill/job.log", f"{out}/.tokenmill/ray.log")
    assert log_paths(out, "x", str(tmp_path / "run" / "job.log")) == (str(tmp_path / "run" / "job.log"),
                                                                    str(tmp_path / "run" / "ray.log"))
    job, ray = log_paths("s3://b/out", "s3://b/out/.tokenmill")
    assert not job.startswith("s3:") and Path(ray).parent == Path(job).parent and Path(ray).name == "ray.log"
    assert log_paths("s3://b/other", "s3://b/other/.tokenmill")[0] != job  # one folder per output


# ---- the service's /logs ------------------------------------------------------------------------------


def test_logs_serve_the_job_log_or_rays(tmp_path):
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.settings import Settings
    from service.store import repo

    root = tmp_path / "data"
    (root / "in").mkdir(parents=True)
    (root / "in" / "a.jsonl").write_text('{"text": "hello"}\n')
    settings = Settings(state_dir=tmp_path / "state", database_url=f"sqlite:///{tmp_path / 'api.db'}",
                        input_roots=(root,), output_roots=(root,), run_supervisor=False)
    app = create_app(settings)
    with TestClient(app) as client:
        with app.state.db.session() as s:
            _, token = repo.create_key(s, "test")
        headers = {"Authorization": f"Bearer {token}"}
        spec = {"name": "j", "inputs": [{"path": str(root / "in" / "*.jsonl")}], "output": {"path": str(root / "o")}}
        job_id = client.post("/v1/jobs", json=spec, headers=headers).json()["id"]
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        with app.state.db.session() as s:
            repo.start_attempt(s, job_id, run_dir=lambda j, n: str(run_dir), host="h")
        (run_dir / "job.log").write_text("tokenmill line\n")
        (run_dir / "ray.log").write_text("Failed to determine local IP\n")
        with app.state.db.session() as s:  # what the job process ships (service.runner.report)
            ship_rest(s, job_id, 1, str(run_dir))
        url = f"/v1/jobs/{job_id}/logs"
        assert client.get(url, headers=headers).text == "tokenmill line\n"
        assert client.get(url, params={"source": "job"}, headers=headers).text == "tokenmill line\n"
        assert client.get(url, params={"source": "ray"}, headers=headers).text == "Failed to determine local IP\n"
        bad = client.get(url, params={"source": "nope"}, headers=headers)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "source"]
        params = client.get("/openapi.json", headers=headers).json()["paths"]["/v1/jobs/{job_id}/logs"]["get"]
        source = next(p for p in params["parameters"] if p["name"] == "source")
        assert source["schema"]["enum"] == ["job", "ray"] and source["schema"]["default"] == "job"


# ---- one real run -------------------------------------------------------------------------------------

#: what Ray writes that must not be in the job's log (tests/test_cli_progress.py has the terminal's list)
RAY_LINE = re.compile(r"Failed to determine local IP|Dataset job will hang|Started a local Ray instance|\.cc:\d+:"
                      r"|ray\.data|py\.warnings|\(raylet\)|pid=\d+")


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_reports_its_ray_start_and_keeps_rays_output_in_ray_log(tmp_path):
    from corpus_fixtures import clean_corpus

    clean_corpus(tmp_path / "in", n_docs=120)
    spec = {"name": "startup", "inputs": [{"path": str(tmp_path / "in" / "*")}], "stages": [{"type": "normalize"}],
            "tokenizer": {"train": {"vocab_size": 400}}, "packing": {"seq_len": 128},
            "output": {"path": str(tmp_path / "out")}, "execution": {"parallelism": 2, "num_cpus": 2}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k != "TOKENMILL_VERBOSE"}
    proc = subprocess.run([sys.executable, "-m", "service.cli", "run", str(tmp_path / "job.yaml")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**env, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "[tokenmill] starting Ray (local, 2 CPUs)", lines[:3]
    assert re.fullmatch(r"\[tokenmill\] Ray ready in \d+\.\d s \(2 CPUs\)", lines[1]), lines[:3]

    private = tmp_path / "out" / ".tokenmill"
    types = [json.loads(line)["type"] for line in (private / "events.jsonl").read_text().splitlines()]
    assert types[:3] == ["ray_starting", "ray_started", "job_started"], types
    assert "phase" not in types[:3] and types.count("ray_starting") == types.count("ray_started") == 1

    job_log = (private / "job.log").read_text()
    assert "[tokenmill] starting Ray (local, 2 CPUs)" in job_log and "[tokenmill] done in" in job_log
    assert not [line for line in job_log.splitlines() if RAY_LINE.search(line)], job_log
    ray_log = (private / "ray.log").read_text()
    assert "Started a local Ray instance" in ray_log
    benign = re.compile(r"Failed to determine local IP|Dataset job will hang|Progress bars disabled")
    # a Python logger's warning line reads "... WARNING name file:line -- message"; the benign ones are INFO now
    assert not [line for line in ray_log.splitlines() if " WARNING " in line and benign.search(line)], ray_log
