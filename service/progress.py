"""The CLI's live view of a job: the engine's events in, a rate and an ETA per phase out.

Two renderers share one model (:class:`JobView`: the job's :class:`pipeline.job.fold.JobSummary`, the fold
the control plane shows too, plus a rate window per phase; fed only by events, so every rate and ETA comes
from event timestamps and can be tested without a clock or Ray):

- :class:`LiveRenderer`, on a terminal: a `rich <https://rich.readthedocs.io>`_ Live display with a row
  for Ray while it starts, one row per phase (bar, count, rate, ETA or elapsed), one row per curation stage
  (its bar: documents it has taken of those the stage before passed on) and the shards written with their
  tokens/s. Curate's bar is the documents done (through the last stage, or dropped on the way) of those read;
- :class:`PlainRenderer`, everywhere else (CI, pipes, tests): ``[tokenmill] ...`` lines, Ray's start
  (``starting Ray (local, 2 CPUs)``, ``Ray ready in 4.1 s``), phase start and finish, and at most one progress
  line every ``every`` seconds (event time) with the rate since the phase started, warnings on stderr;
  never an escape code.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from pipeline.job import events as ev
from pipeline.job.fold import JobSummary, ProgressFigures
from pipeline.job.summary import ray_started_text, ray_starting_text

PREFIX = "[tokenmill]"
#: seconds of recent progress a rate is measured over (older progress says little about the ETA)
RATE_WINDOW = 20.0
#: words after a phase's count in a progress line
_VERB = {"curate": "read"}
#: the readers' key in stage counters (pipeline.job.graph.READ_KEY; that module imports Ray)
_READ_KEY = "00-read"


# ---- formatting ---------------------------------------------------------------------------------------


def fmt_count(n: int | float) -> str:
    return f"{int(n):,}"


def fmt_rate(x: float) -> str:
    """3 significant-ish digits with k/M/G: ``3.1k``, ``250k``, ``1.2M``."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            v = x / div
            return f"{v:.1f}{suffix}" if v < 100 else f"{v:.0f}{suffix}"
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def fmt_amount(n: int | float) -> str:
    """A large amount, short: ``950``, ``61.6k``, ``2.0M``."""
    return fmt_count(n) if n < 1000 else fmt_rate(n)


def fmt_duration(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _count(value: object) -> int:
    """A stage counter's value as a count (0 for one that is missing or not a number)."""
    return int(value) if isinstance(value, int | float) else 0


def _stage_label(key: str) -> str:
    """``03-exact_dedup`` -> ``exact_dedup``."""
    head, sep, tail = key.partition("-")
    return tail if sep and head.isdigit() else key


# ---- the model ----------------------------------------------------------------------------------------


@dataclass
class PhaseView:
    """One phase on screen: its state and figures from the job's :class:`JobSummary`, and the recent progress
    reports its rate and ETA are measured over (a display's window, not a figure of the job)."""

    name: str
    summary: JobSummary
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=256))

    @property
    def state(self) -> str:
        """pending | started | finished | skipped"""
        figures = self.summary.phases.get(self.name)
        return figures.state if figures else "pending"

    @property
    def started(self) -> float | None:
        return self.summary.phase_started(self.name)

    @property
    def seconds(self) -> float | None:
        """How long the phase took, once it has finished or was skipped."""
        figures = self.summary.phases.get(self.name)
        return figures.seconds if figures and figures.state in ("finished", "skipped") else None

    @property
    def progress(self) -> ProgressFigures:
        """The phase's latest progress report (nothing done of no known total before the first)."""
        return self.summary.progress.get(self.name) or ProgressFigures(done=0, total=None, unit="")

    def rate(self) -> float | None:
        """Units per second over the last :data:`RATE_WINDOW` seconds of progress (since the phase
        started when only one report is that recent); None before two points in time are known."""
        if not self.samples:
            return None
        t_last, d_last = self.samples[-1]
        recent = [(t, d) for t, d in self.samples if t >= t_last - RATE_WINDOW]
        t0, d0 = recent[0]
        started = self.started
        if t0 >= t_last and started is not None:
            t0, d0 = started, 0
        if t_last <= t0:
            return None
        return max(0.0, (d_last - d0) / (t_last - t0))

    def eta(self) -> float | None:
        """Seconds left at the current rate; None without a total or a rate."""
        rate, p = self.rate(), self.progress
        if p.total is None or not rate:
            return None
        return max(0, p.total - p.done) / rate

    def elapsed(self, now: float) -> float:
        if self.seconds is not None:
            return self.seconds
        started = self.started
        return max(0.0, now - started) if started is not None else 0.0


class JobView:
    """What the events have said so far about one job (a :class:`JobSummary`), and how to say it. Thread-safe:
    events come from the driver's main thread and a progress thread, and a live display reads it from its
    refresh thread."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.summary = JobSummary()
        self.phases = {p: PhaseView(p, self.summary) for p in ev.PHASES}
        self.now = 0.0
        self.cancelling = False
        #: the curation stages' keys in spec order (``job_started`` says; else those that have reported)
        self.stage_keys: tuple[str, ...] = ()

    def apply(self, event: ev.Event) -> None:
        with self.lock:
            self.now = max(self.now, event.ts)
            self.summary.apply(event)
            if isinstance(event, ev.JobStarted):
                self.stage_keys = event.stages
            if isinstance(event, ev.PhaseProgress) and event.phase in self.phases:
                self.phases[event.phase].samples.append((event.ts, event.done))

    def funnel(self) -> list[tuple[str, int]]:
        """(stage, documents out) in stage order: read, then each curation stage (0 before it reports)."""
        with self.lock:
            read = _count((self.summary.stages.get(_READ_KEY) or {}).get("docs_out"))
            return [("read", read), *((stage, kept) for stage, _, _, kept in self.stage_rows())]

    def stage_rows(self) -> list[tuple[str, int, int, int]]:
        """(stage, documents taken, documents the stage before passed on, documents kept) per curation stage in
        spec order, a stage that has not reported yet included (0 taken)."""
        with self.lock:
            stages = self.summary.stages
            keys = self.stage_keys or tuple(sorted(k for k in stages if k != _READ_KEY and not k.startswith("90-")))
            upstream = _count((stages.get(_READ_KEY) or {}).get("docs_out"))
            rows = []
            for key in keys:
                counts = stages.get(key) or {}
                docs_in, docs_out = _count(counts.get("docs_in")), _count(counts.get("docs_out"))
                rows.append((_stage_label(key), docs_in, upstream, docs_out))
                upstream = docs_out
            return rows

    def curate_work(self) -> tuple[int, int] | None:
        """(documents done, documents read) in curate: a document is done once the last stage has taken it or
        a stage before dropped it (the documents read less those waiting before a stage). None before the
        readers have reported."""
        with self.lock:
            read = self.summary.stages.get(_READ_KEY)
            if read is None:
                return None
            n_read = _count(read.get("docs_out"))
            waiting = sum(max(0, upstream - taken) for _, taken, upstream, _ in self.stage_rows())
            return max(0, n_read - waiting), n_read

    def curate_rate(self) -> float | None:
        """Documents done per second since curate started (by event time); None before a second has passed."""
        with self.lock:
            work, started = self.curate_work(), self.phases["curate"].started
            if work is None or started is None:
                return None
            elapsed = self.phases["curate"].elapsed(self.now)
            return work[0] / elapsed if elapsed > 0 else None

    def curate_text(self) -> str:
        """``12,000 docs read, 9,000 done (75%), 1.5k docs/s``: done is through every stage (or dropped)."""
        with self.lock:
            work = self.curate_work()
            if work is None:
                return self.progress_text("curate")
            done, n_read = work
            parts = [f"{fmt_count(n_read)} docs read"]
            if self.stage_rows():
                parts.append(f"{fmt_count(done)} done" + (f" ({done / n_read:.0%})" if n_read else ""))
            rate = self.curate_rate()
            if rate is not None and done:
                parts.append(f"{fmt_rate(rate)} docs/s")
            return ", ".join(parts)

    def tokens_per_s(self) -> float | None:
        """Tokens of newly written shards per second of the write phase so far."""
        with self.lock:
            ph, new_tokens = self.phases["write"], self.summary.new_tokens
            if ph.started is None or not new_tokens:
                return None
            elapsed = ph.elapsed(self.now)
            return new_tokens / elapsed if elapsed > 0 else None

    def progress_text(self, phase: str) -> str:
        """``12,345 docs read, 3.1k docs/s`` / ``3/10 ranges (30%), 0.8 ranges/s, ETA 9s``."""
        with self.lock:
            ph = self.phases[phase]
            p = ph.progress
            unit = p.unit or "items"
            if p.total is not None:
                pct = f" ({p.done / p.total:.0%})" if p.total else ""
                parts = [f"{fmt_count(p.done)}/{fmt_count(p.total)} {unit}{pct}"]
            else:
                verb = _VERB.get(phase)
                parts = [f"{fmt_count(p.done)} {unit}" + (f" {verb}" if verb else "")]
            rate = ph.rate()
            if rate is not None and p.done:  # no "0.0/s" before anything is done
                parts.append(f"{fmt_rate(rate)} {unit}/s")
            eta = ph.eta()
            if eta is not None and p.total is not None and p.done < p.total:
                parts.append(f"ETA {fmt_duration(eta)}")
            return ", ".join(parts)

    def write_text(self) -> str:
        """``5 shards, 1.2M tokens, 250k tokens/s`` (and how many were kept from an earlier run)."""
        with self.lock:
            s = self.summary
            parts = [f"{fmt_count(s.shards.written + s.shards.reused)} shard(s)"]
            if s.shards.reused:
                parts[0] += f" ({fmt_count(s.shards.reused)} kept from an earlier run)"
            parts.append(f"{fmt_amount(s.tokens)} tokens")
            tps = self.tokens_per_s()
            if tps is not None:
                parts.append(f"{fmt_rate(tps)} tokens/s")
            if len(s.writers) > 1:
                parts.append(f"{len(s.writers)} writers")
            return ", ".join(parts)

    def funnel_text(self) -> str:
        return " > ".join(f"{name} {fmt_count(n)}" for name, n in self.funnel())

    def finished_text(self, phase: str) -> str:
        """What a finished phase did, for its closing line."""
        with self.lock:
            ph = self.phases[phase]
            text = f"done in {ph.seconds or 0.0:.1f}s"
            if phase == "curate" and self.summary.stages:
                funnel = self.funnel()
                if funnel:
                    text += f", {fmt_count(funnel[0][1])} docs read, {fmt_count(funnel[-1][1])} kept"
                    if ph.seconds:
                        text += f", {fmt_rate(funnel[0][1] / ph.seconds)} docs/s"
            elif phase == "write":
                text += f", {self.write_text()}"
            return text


# ---- renderers ----------------------------------------------------------------------------------------


class PlainRenderer:
    """``[tokenmill] ...`` lines: for logs, pipes and CI. Progress lines are throttled by event time (a replayed
    job, ``submit --follow``, prints what a live one would have), at most one every ``every`` seconds."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, every: float = 5.0) -> None:
        self._out, self._err = out, err
        self.every = every
        self.view = JobView()
        #: event time of the last progress line, or of the last phase's start
        self._last: float | None = None

    # context manager for symmetry with LiveRenderer
    def __enter__(self) -> PlainRenderer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    @property
    def out(self) -> TextIO:
        return self._out or sys.stdout

    @property
    def err(self) -> TextIO:
        return self._err or sys.stderr

    def __call__(self, event: ev.Event) -> None:
        with self.view.lock:
            self.view.apply(event)
            for stream, line in self.lines(event):
                print(f"{PREFIX} {line}", file=stream, flush=True)

    def lines(self, event: ev.Event) -> list[tuple[TextIO, str]]:
        """The lines ``event`` calls for (after it has been applied to the view)."""
        v, out = self.view, self.out
        if isinstance(event, ev.RayStarting):
            return [(out, ray_starting_text(event))]
        if isinstance(event, ev.RayStarted):
            return [(out, ray_started_text(event))]
        if isinstance(event, ev.JobStarted):
            lines = [(out, f"job {event.job}: {event.parallelism} worker(s), output {event.output}")]
            if event.resumed_phases:
                lines.append((out, f"resuming: {', '.join(event.resumed_phases)} already done by an earlier run"))
            return lines
        if isinstance(event, ev.PhaseChanged):
            if event.state == "started":
                self._last = event.ts
                return [(out, f"{event.phase}: started")]
            if event.state == "skipped":
                return [(out, f"{event.phase}: skipped (done by an earlier run)")]
            return [(out, f"{event.phase}: {v.finished_text(event.phase)}")]
        if isinstance(event, ev.PhaseProgress | ev.StageCounters | ev.ShardWritten):
            return self._progress()
        if isinstance(event, ev.LogLine):
            if event.level == "info":
                return [(out, event.message)]
            return [(self.err, f"{event.level}: {event.message}")]
        return []  # counters feed the view; the CLI reports the end (summary table) and failures itself

    def _progress(self) -> list[tuple[TextIO, str]]:
        """The running phase's progress line, unless one was printed less than ``every`` seconds ago."""
        v = self.view
        phase = v.summary.phase
        if phase not in v.phases or (self._last is not None and v.now - self._last < self.every):
            return []
        self._last = v.now
        if phase == "curate":
            line = f"curate: {v.curate_text()}" + (f"; {v.funnel_text()}" if v.summary.stages else "")
        elif phase == "write":
            head = f"{v.progress_text(phase)}; " if v.phases[phase].samples else ""
            line = f"write: {head}{v.write_text()}"
        else:
            line = f"{phase}: {v.progress_text(phase)}"
        return [(self.out, line)]

    def cancelling(self) -> None:
        """Called from a signal handler: one write, no locks (the main thread may hold them)."""
        _write_fd(self.err, f"{PREFIX} cancelling (press Ctrl-C again to stop at once)\n")


class LiveRenderer:
    """A rich Live display on a terminal: one row per phase, the stage funnel, the shards written."""

    def __init__(self, console: Any = None, refresh_per_second: float = 4.0, verbose: bool = False,
                 clock: Callable[[], float] | None = None) -> None:
        self.console = console or Console()
        self.view = JobView()
        self._clock = clock or time.time
        # in verbose mode Ray's Python loggers print to sys.stderr: let rich print them above the display.
        # Otherwise nothing else prints, and rich must not hold sys.stderr (the Ray log routing rebinds it).
        self._live = Live(console=self.console, refresh_per_second=refresh_per_second, transient=False,
                          redirect_stdout=verbose, redirect_stderr=verbose, get_renderable=self.render)

    def __enter__(self) -> LiveRenderer:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()

    def __call__(self, event: ev.Event) -> None:
        self.view.apply(event)
        if isinstance(event, ev.LogLine) and event.level != "info":
            self.console.print(f"[yellow]{event.level}:[/] {event.message}", markup=True, highlight=False)
        elif isinstance(event, ev.LogLine):
            self.console.print(event.message, markup=False, highlight=False)
        elif isinstance(event, ev.RayStarting | ev.RayStarted):
            text = ray_starting_text(event) if isinstance(event, ev.RayStarting) else ray_started_text(event)
            self.console.print(text, markup=False, highlight=False)
        elif isinstance(event, ev.JobStarted):
            note = f", resuming ({', '.join(event.resumed_phases)} done)" if event.resumed_phases else ""
            self.console.print(f"job {event.job}: {event.parallelism} worker(s), output {event.output}{note}",
                               markup=False, highlight=False)

    def cancelling(self) -> None:
        self.view.cancelling = True  # shown at the next refresh; a signal handler must not print here

    def render(self) -> Any:
        v = self.view
        now = max(v.now, self._clock())
        grid = Table.grid(padding=(0, 1))
        grid.add_column(min_width=9)
        grid.add_column(width=30)
        grid.add_column()
        with v.lock:
            ray = v.summary.ray
            if ray is not None and ray.state == "starting" and ray.started_ts is not None:  # until Ray is up
                grid.add_row(Text("ray", style="bold"), ProgressBar(total=None, width=30, pulse=True),
                             Text(f"starting, {fmt_duration(max(0.0, now - ray.started_ts))} elapsed"))
            for name, ph in v.phases.items():
                if ph.state == "pending":
                    grid.add_row(Text(name, style="dim"), "", Text("waiting", style="dim"))
                    continue
                grid.add_row(Text(name, style="bold"), *self._phase_row(name, now))
                if name == "curate" and ph.state == "started":
                    for stage, taken, offered, kept in v.stage_rows():
                        grid.add_row(Text(f"  {stage}"), ProgressBar(total=offered or None, completed=taken, width=30,
                                                                      pulse=not offered),
                                     Text(f"{fmt_count(taken)} in, {fmt_count(kept)} kept"))
            if v.summary.stages and v.phases["curate"].state != "started":
                grid.add_row("stages", "", Text(v.funnel_text(), overflow="fold"))
            if v.cancelling:
                grid.add_row(Text("cancel", style="bold red"), "", Text("cancelling (Ctrl-C again to stop at once)"))
        return grid

    def _phase_row(self, name: str, now: float) -> tuple[ProgressBar, Text]:
        """A started, finished or skipped phase's bar and status. Curate's bar: documents done of those read."""
        v = self.view
        ph = v.phases[name]
        if ph.state in ("finished", "skipped"):
            status = "skipped (done by an earlier run)" if ph.state == "skipped" else v.finished_text(name)
            return ProgressBar(total=1, completed=1, width=30), Text(status)
        work = v.curate_work() if name == "curate" else None
        if work is not None:
            bar = ProgressBar(total=work[1] or None, completed=work[0], width=30, pulse=not work[1])
            status = v.curate_text()
        else:
            running_total = ph.progress.total or None
            bar = ProgressBar(total=running_total, completed=ph.progress.done, width=30, pulse=running_total is None)
            status = v.progress_text(name) if ph.samples else ""
        status = ", ".join(s for s in (status, f"{fmt_duration(ph.elapsed(now))} elapsed") if s)
        if name == "write":
            status += f"; {v.write_text()}"
        return bar, Text(status)


def make_renderer(verbose: bool = False, stream: TextIO | None = None) -> PlainRenderer | LiveRenderer:
    """The live display on a terminal, plain lines otherwise (``TERM=dumb`` counts as no terminal)."""
    stream = stream or sys.stdout
    if _is_tty(stream) and os.environ.get("TERM", "") != "dumb":
        return LiveRenderer(verbose=verbose)
    return PlainRenderer()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _write_fd(stream: TextIO, text: str) -> None:
    """One ``os.write`` (safe in a signal handler, unlike print on a stream the main thread may be using)."""
    try:
        os.write(stream.fileno(), text.encode("utf-8", "replace"))
    except (AttributeError, OSError, ValueError):  # no file descriptor (a test's StringIO)
        pass
