"""The CLI's progress view and its quiet default (issue 8, items 1 and 6).

The renderer is fed scripted events with timestamps we choose (no Ray, no clock), so rates and ETAs are
exact. The CLI's exit codes are checked against a fake job. One real run of ``tokenmill run`` on a small
generated corpus checks that nothing of Ray's own logging reaches the terminal.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from pipeline.job import events as ev
from service.commands import demo, run
from service.progress import JobView, LiveRenderer, PlainRenderer, fmt_duration, fmt_rate, make_renderer

ANSI = re.compile(r"\x1b\[")
T0 = 1_000_000.0


def _render(events: list[ev.Event], every: float = 5.0) -> tuple[list[str], list[str]]:
    out, err = io.StringIO(), io.StringIO()
    r = PlainRenderer(out=out, err=err, every=every)
    for e in events:
        r(e)
    return out.getvalue().splitlines(), err.getvalue().splitlines()


def _counters(read: int, kept: int) -> ev.StageCounters:
    return ev.StageCounters(stages={
        "00-read": {"docs_in": read, "docs_out": read},
        "01-normalize": {"docs_in": read, "docs_out": read},
        "02-exact_dedup": {"docs_in": read, "docs_out": kept},
    }, ts=0)


def _job(events_after_start: list[ev.Event]) -> list[ev.Event]:
    return [ev.JobStarted(job="j", spec_hash="h", output="/o", parallelism=2, ts=T0), *events_after_start]


# ---- formatting and the model ---------------------------------------------------------------------------


def test_number_and_duration_formats():
    assert [fmt_rate(x) for x in (0.5, 42, 3100, 250_000, 1_200_000)] == ["0.5", "42.0", "3.1k", "250k", "1.2M"]
    assert [fmt_duration(s) for s in (9.4, 65, 3725)] == ["9s", "1m05s", "1h02m"]


def test_rate_uses_recent_progress_and_eta_the_rest_of_the_total():
    v = JobView()
    v.apply(ev.PhaseChanged(phase="write", state="started", ts=T0))
    # slow start (1 range in 100 s), then 2 ranges/s: the rate is the recent one, not the average
    for t, done in ((100, 1), (110, 21), (120, 41)):
        v.apply(ev.PhaseProgress(phase="write", done=done, total=141, unit="ranges", ts=T0 + t))
    ph = v.phases["write"]
    assert ph.rate() == pytest.approx(2.0)
    assert ph.eta() == pytest.approx(50.0)
    assert v.progress_text("write") == "41/141 ranges (29%), 2.0 ranges/s, ETA 50s"


def test_a_single_report_is_rated_from_the_phase_start_and_no_total_means_no_eta():
    v = JobView()
    v.apply(ev.PhaseChanged(phase="curate", state="started", ts=T0))
    v.apply(ev.PhaseProgress(phase="curate", done=12_345, total=None, unit="docs", ts=T0 + 4))
    assert v.progress_text("curate") == "12,345 docs read, 3.1k docs/s"
    assert v.phases["curate"].eta() is None


def test_nothing_done_shows_no_rate_and_all_done_no_eta():
    v = JobView()
    v.apply(ev.PhaseChanged(phase="write", state="started", ts=T0))
    v.apply(ev.PhaseProgress(phase="write", done=0, total=4, unit="ranges", ts=T0 + 1))
    assert v.progress_text("write") == "0/4 ranges (0%)"
    v.apply(ev.PhaseProgress(phase="write", done=4, total=4, unit="ranges", ts=T0 + 3))
    assert v.progress_text("write") == "4/4 ranges (100%), 2.0 ranges/s"


# ---- plain lines ---------------------------------------------------------------------------------------


def _stages(read: int, normalize: tuple[int, int] | None = None, dedup: tuple[int, int] | None = None, ts: float = 0
            ) -> ev.StageCounters:
    """Counters as the stats actor sends them: a stage that has not reported yet is missing."""
    stages: dict[str, dict[str, object]] = {"00-read": {"docs_in": read, "docs_out": read}}
    for key, counts in (("01-normalize", normalize), ("02-exact_dedup", dedup)):
        if counts is not None:
            stages[key] = {"docs_in": counts[0], "docs_out": counts[1]}
    return ev.StageCounters(stages=stages, ts=ts)


def _curate_job(*after: ev.Event) -> list[ev.Event]:
    """A job whose stages are normalize then exact_dedup; the readers are done at +6 while the stages work on."""
    return [
        ev.JobStarted(job="j", spec_hash="h", output="/o", parallelism=2, stages=("01-normalize", "02-exact_dedup"),
                      ts=T0),
        ev.PhaseChanged(phase="curate", state="started", ts=T0 + 1),
        _stages(3000, ts=T0 + 2),  # < 5 s after the start: throttled
        ev.PhaseProgress(phase="curate", done=3000, total=None, unit="docs", ts=T0 + 2),
        _stages(12_000, (12_000, 12_000), ts=T0 + 6),
        ev.PhaseProgress(phase="curate", done=12_000, total=None, unit="docs", ts=T0 + 6),
        _stages(12_000, (12_000, 12_000), (6000, 5800), ts=T0 + 8),  # throttled
        ev.PhaseProgress(phase="curate", done=12_000, total=None, unit="docs", ts=T0 + 8),
        _stages(12_000, (12_000, 12_000), (12_000, 11_600), ts=T0 + 11),
        ev.PhaseProgress(phase="curate", done=12_000, total=None, unit="docs", ts=T0 + 11),
        *after,
    ]


def test_plain_lines_one_every_few_seconds_with_the_rate_since_the_start_and_no_line_per_shard():
    events = _curate_job(
        ev.PhaseChanged(phase="curate", state="finished", seconds=11.0, ts=T0 + 12),
        ev.PhaseChanged(phase="tokenizer", state="skipped", seconds=3.0, ts=T0 + 12),
        ev.PhaseChanged(phase="write", state="started", ts=T0 + 13),
        ev.ShardWritten(name="shards/shard-000000.tar", sha256="a", samples=1024, tokens=1_000_000, writer="h:1",
                        reused=True, ts=T0 + 13),
        ev.ShardWritten(name="shards/shard-000003.tar", sha256="b", samples=1024, tokens=500_000, writer="h:2",
                        ts=T0 + 15),
        ev.PhaseProgress(phase="write", done=3, total=10, unit="ranges", ts=T0 + 15),
        ev.ShardWritten(name="shards/shard-000004.tar", sha256="c", samples=1024, tokens=500_000, writer="h:3",
                        ts=T0 + 17),  # 4 s after the phase's start: throttled
        ev.PhaseProgress(phase="write", done=5, total=10, unit="ranges", ts=T0 + 19),
        ev.LogLine(level="warning", message="input x.jsonl: 3 bad lines", ts=T0 + 19),
        ev.PhaseChanged(phase="write", state="finished", seconds=6.0, ts=T0 + 19),
    )
    out, err = _render(events)
    assert all(line.startswith("[tokenmill] ") for line in out + err)
    out = [line.removeprefix("[tokenmill] ") for line in out]
    assert out == [
        "job j: 2 worker(s), output /o",
        "curate: started",
        # read, normalized, none through exact_dedup yet: nothing is done, and no "0.0 docs/s"
        "curate: 12,000 docs read, 0 done (0%); read 12,000 > normalize 12,000 > exact_dedup 0",
        # the readers finished long ago; 12,000 done in the 10 s since the start
        "curate: 12,000 docs read, 12,000 done (100%), 1.2k docs/s; "
        "read 12,000 > normalize 12,000 > exact_dedup 11,600",
        "curate: done in 11.0s, 12,000 docs read, 11,600 kept, 1.1k docs/s",
        "tokenizer: skipped (done by an earlier run)",
        "write: started",
        # ranges: 3 at +15, 5 at +19 -> 0.5/s, 5 left -> 10 s; tokens: 1M new in 6 s of the phase
        "write: 5/10 ranges (50%), 0.5 ranges/s, ETA 10s; 3 shard(s) (1 kept from an earlier run), 2.0M tokens, "
        "167k tokens/s, 3 writers",
        "write: done in 6.0s, 3 shard(s) (1 kept from an earlier run), 2.0M tokens, 167k tokens/s, 3 writers",
    ]
    assert [line.removeprefix("[tokenmill] ") for line in err] == ["warning: input x.jsonl: 3 bad lines"]
    # the throttle is a parameter: with none, each of the 3 counter and 3 progress reports after the readers' last is
    # a line
    assert sum(line.startswith("[tokenmill] curate: 12,000 docs read") for line in _render(events, every=0)[0]) == 6


def test_curate_bar_is_the_documents_done_and_each_stage_has_its_own_bar():
    from rich.console import Console
    from rich.progress_bar import ProgressBar

    console = Console(file=io.StringIO(), width=160, force_terminal=False, color_system=None)
    r = LiveRenderer(console=console, clock=lambda: T0 + 6)
    for e in _curate_job()[:6]:  # up to +6: read and normalized, exact_dedup not started
        r(e)
    bars = [(c.completed, c.total) for c in r.render().columns[1].cells if isinstance(c, ProgressBar)]
    # curate, normalize (took all 12,000 read), exact_dedup (took none of the 12,000 normalize kept)
    assert bars[:3] == [(0, 12_000), (12_000, 12_000), (0, 12_000)]
    assert r.view.curate_work() == (0, 12_000)
    for e in _curate_job()[6:]:
        r(e)
    assert r.view.curate_work() == (12_000, 12_000)
    console.print(r.render())
    text = console.file.getvalue()
    assert "12,000 docs read, 12,000 done (100%), 1.2k docs/s" in text and "exact_dedup" in text
    assert "12,000 in, 11,600 kept" in text


def test_resumed_job_says_which_phases_were_done():
    out, _ = _render([ev.JobStarted(job="j", spec_hash="h", output="/o", parallelism=1,
                                    resumed_phases=("curate", "tokenizer"), ts=T0)])
    assert out[1] == "[tokenmill] resuming: curate, tokenizer already done by an earlier run"


def test_plain_output_has_no_escape_codes_and_a_pipe_gets_plain_lines(monkeypatch):
    monkeypatch.delenv("TERM", raising=False)
    assert isinstance(make_renderer(stream=io.StringIO()), PlainRenderer)
    out, err = _render(_job([ev.PhaseChanged(phase="curate", state="started", ts=T0),
                             ev.LogLine(level="warning", message="w", ts=T0)]))
    assert not any(ANSI.search(line) for line in out + err)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_live_display_unless_dumb(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    assert isinstance(make_renderer(stream=_Tty()), LiveRenderer)
    monkeypatch.setenv("TERM", "dumb")
    assert isinstance(make_renderer(stream=_Tty()), PlainRenderer)


def test_live_renderer_draws_every_phase_with_rate_and_eta():
    from rich.console import Console

    console = Console(file=io.StringIO(), width=160, force_terminal=False, color_system=None)
    r = LiveRenderer(console=console, clock=lambda: T0 + 16)
    for e in _job([ev.PhaseChanged(phase="curate", state="finished", seconds=8.0, ts=T0 + 9),
                   ev.PhaseChanged(phase="write", state="started", ts=T0 + 10),
                   ev.PhaseProgress(phase="write", done=3, total=10, unit="ranges", ts=T0 + 12),
                   ev.PhaseProgress(phase="write", done=5, total=10, unit="ranges", ts=T0 + 16)]):
        r(e)
    console.print(r.render())
    text = console.file.getvalue()
    assert "5/10 ranges (50%), 0.5 ranges/s, ETA 10s, 6s elapsed" in text
    assert "curate" in text and "done in 8.0s" in text and "tokenizer" in text and "waiting" in text


# ---- the CLI around a job ------------------------------------------------------------------------------


class _FakeJob:
    """Stands in for pipeline.job.engine.Job: emits a few events, then does what the test says."""

    outcome: BaseException | None = None
    instances: list[_FakeJob] = []

    def __init__(self, spec, on_event=None, log_path=None, **_):
        self.on_event, self.cancelled = on_event, threading.Event()
        _FakeJob.instances.append(self)

    def cancel(self):
        self.cancelled.set()

    def run(self):
        from pipeline.job.errors import JobCancelled

        self.on_event(ev.JobStarted(job="fake", spec_hash="h", output="/o", parallelism=1))
        self.on_event(ev.PhaseChanged(phase="curate", state="started"))
        if self.outcome == "signal":  # the CLI's handler calls cancel(), then interrupts the blocked driver,
            try:                      # which the real Job turns into JobCancelled
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt:
                assert self.cancelled.is_set()
                raise JobCancelled("cancelled during curate") from None
            raise AssertionError("the signal did not interrupt the job")
        raise self.outcome


@pytest.fixture
def fake_job(monkeypatch, tmp_path):
    from pipeline.job import engine
    from pipeline.spec import parse_spec

    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    spec = parse_spec({"name": "fake", "inputs": [{"path": str(tmp_path / "in.jsonl")}],
                       "output": {"path": str(tmp_path / "out")}})
    monkeypatch.setattr(engine, "Job", _FakeJob)
    # a job run in this process by an earlier test (tokenmill.run, ablate) left Ray's log routed: the fake job
    # starts no Ray, so its errors name no Ray log, as in a fresh `tokenmill run` process
    monkeypatch.delitem(sys.modules, "pipeline.job.ray_env", raising=False)
    _FakeJob.instances.clear()
    return spec


@pytest.mark.parametrize("category, code", [("validation", 2), ("input", 2), ("app", 1), ("infra", 1)])
def test_job_error_is_one_line_with_an_exit_code_by_category(fake_job, capsys, category, code):
    from pipeline.job.errors import JobError

    _FakeJob.outcome = JobError("output.path: something is wrong", category)
    assert run.run_spec(fake_job) == code
    err = capsys.readouterr().err
    assert err.splitlines() == ["error: output.path: something is wrong"]


def test_sigint_cancels_the_job_and_exits_130(fake_job, capsys):
    _FakeJob.outcome = "signal"
    before = signal.getsignal(signal.SIGINT)
    assert run.run_spec(fake_job) == 130
    assert _FakeJob.instances[0].cancelled.is_set()
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "cancelled: cancelled during curate" and "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored


def test_verbose_flag_is_accepted_by_run_and_demo():
    assert run.build_parser().parse_args(["s.yaml", "--verbose"]).verbose
    assert demo.build_parser().parse_args(["--verbose"]).verbose
    assert not run.build_parser().parse_args(["s.yaml"]).verbose


# ---- quiet by default ------------------------------------------------------------------------------------

_ROUTING_SCRIPT = r"""
import logging, os, sys, warnings
import ray
from pipeline.job import ray_env

ray_env.route_ray_logs(sys.argv[1])
os.write(2, b"[2026-01-01 00:00:00,000 W 1 1] network_util.cc:330: Failed to determine local IP\n")
logging.getLogger("ray").warning("ray python logger line")
logging.getLogger("ray.data").info("ray data info line")
warnings.warn_explicit("old ray api", DeprecationWarning, os.path.join(os.path.dirname(ray.__file__), "x.py"), 1)
ray._private.worker.print_to_stdstream({"lines": ["A worker died"], "pid": "raylet", "is_err": False}, False)
print("ours on stderr", file=sys.stderr)
print("ours on stdout")
warnings.warn("a warning of ours")
ray_env.route_ray_logs(sys.argv[2])  # a second job in the same process: its own log
logging.getLogger("ray.data").warning("second job ray data line")
os.write(2, b"second job native line\n")
ray_env.restore_ray_logs()
os.write(2, b"native after restore\n")
"""


def test_ray_output_goes_to_the_log_and_ours_to_the_terminal(tmp_path):
    """Each way Ray writes (native fd 2, its loggers, its warnings, relayed raylet messages) ends in the log;
    Python's own stderr and stdout stay on the terminal, and restore_ray_logs gives fd 2 back."""
    log, log2 = tmp_path / "job.log", tmp_path / "job2.log"
    proc = subprocess.run([sys.executable, "-W", "always", "-c", _ROUTING_SCRIPT, str(log), str(log2)],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ours on stdout\n"
    err = proc.stderr.splitlines()
    assert err[0] == "ours on stderr" and "a warning of ours" in err[1] and err[-1] == "native after restore", err
    assert not any("ray" in line.lower() or "Failed" in line for line in err), err
    text = log.read_text()
    for needle in ("Failed to determine local IP", "ray python logger line", "ray data info line", "old ray api",
                   "(raylet) A worker died"):
        assert needle in text, needle
    assert "ours" not in text and "after restore" not in text and "second job" not in text
    text2 = log2.read_text()
    assert "second job ray data line" in text2 and "second job native line" in text2 and "after restore" not in text2


# ---- one real run: quiet by default ----------------------------------------------------------------------

RAY_LOG_LINE = [
    re.compile(r"^\[?[WEIF]\d{4} "),  # glog, classic prefix
    re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ [WEIF] \d+ \d+\]"),  # Ray's C++ core: [2026-... W 123 123] file.cc
    re.compile(r"\.cc:\d+:"),
    re.compile(r"\((raylet|gcs_server|pid=\d+)"),
    re.compile(r"\(\w+ pid=\d+"),  # log_to_driver: (MapWorker pid=123) ...
    re.compile(r"Failed to determine local IP"),
    re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+\s+(INFO|WARNING|ERROR|DEBUG) \S+\.py:\d+ -- "),  # Ray's Python loggers
    re.compile(r"\b(INFO|WARNING)\b.*\bray\b", re.IGNORECASE),
    re.compile(r"DeprecationWarning|FutureWarning|RayDeprecationWarning"),
]


@pytest.mark.ray
@pytest.mark.slow
def test_run_prints_no_ray_log_line_and_the_summary(tmp_path):
    from corpus_fixtures import clean_corpus

    clean_corpus(tmp_path / "in", n_docs=400)
    spec = {"name": "quiet", "inputs": [{"path": str(tmp_path / "in" / "*")}],
            "stages": [{"type": "normalize"}, {"type": "exact_dedup"}],
            "tokenizer": {"train": {"vocab_size": 600}}, "packing": {"seq_len": 256},
            "output": {"path": str(tmp_path / "out"), "samples_per_shard": 64}, "execution": {"parallelism": 2}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k != "TOKENMILL_VERBOSE"}
    proc = subprocess.run([sys.executable, "-m", "service.cli", "run", str(tmp_path / "job.yaml")],
                          capture_output=True, text=True, timeout=300, env={**env, "PYTHONUNBUFFERED": "1"})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    noise = [line for line in text.splitlines() if any(p.search(line) for p in RAY_LOG_LINE)]
    assert noise == [], "\n".join(noise[:20])
    assert not ANSI.search(text)
    for needle in ("00-read", "01-normalize", "utilization", "tokens in", "docs/s end to end", "written to"):
        assert needle in proc.stdout, needle
    assert "[tokenmill] curate: started" in proc.stdout and "[tokenmill] write: done in" in proc.stdout
    assert "[tokenmill] shard " not in proc.stdout  # no line per shard: the write lines count them
    # Ray's output went to ray.log, beside the job's own log (tokenmill's lines only)
    private = tmp_path / "out" / ".tokenmill"
    assert "Started a local Ray instance" in (private / "ray.log").read_text()
    assert "Started a local Ray instance" not in (private / "job.log").read_text()
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["stages"][0]["docs_out"] == 400
    assert Path(tmp_path / "out" / "manifest.json").exists()
