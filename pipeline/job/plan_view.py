"""``tokenmill run --dry-run``: what a job would read, do and ask of Ray, without starting Ray or writing a byte.

The spec is validated as ``run`` validates it (by the caller); here its inputs are matched to files (local or in an
object store, with their sizes), its stages listed in order with the parameters the spec sets, and the workers the
curate graph would start computed by the graph's own rules (:mod:`pipeline.job.pools`) for the parallelism Ray would
give it: ``execution.parallelism``, else a local node's CPUs (``execution.num_cpus`` or the machine's); on a cluster
(``execution.address``, ``RAY_ADDRESS``) its CPUs are known only once joined.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pipeline import storage
from pipeline.job.pools import fused_into_readers, reader_actors
from pipeline.readers import expand_inputs
from pipeline.readers.paths import source_name
from pipeline.spec import JobSpec
from pipeline.stages import DatasetStage, stage_class

#: files listed by name per input; the rest are counted
SHOWN_FILES = 10


@dataclass(frozen=True)
class MatchedFile:
    name: str  #: below its input (:func:`pipeline.readers.paths.source_name`)
    size: int | None  #: bytes; None when it cannot be read


@dataclass(frozen=True)
class Pool:
    """One operator of the curate graph: what runs in it, its workers (None: one per CPU of a cluster not joined
    yet) and what each asks of Ray."""

    what: str
    actors: int | None
    resources: dict[str, float]
    tasks: bool = False  #: a dataset stage: Ray tasks it schedules itself, not a pool of actors


def match_inputs(spec: JobSpec) -> list[list[MatchedFile]]:
    """Per input, the files it matches with their sizes (a stat or an object's HEAD each)."""
    out: list[list[MatchedFile]] = [[] for _ in spec.inputs]
    for _, inp, path in expand_inputs(spec.inputs):
        try:
            size: int | None = storage.size(path)
        except OSError:
            size = None
        out[next(i for i, s in enumerate(spec.inputs) if s is inp)].append(
            MatchedFile(source_name(inp.path, path), size))
    return out


def parallelism(spec: JobSpec) -> tuple[int | None, str]:
    """The workers per stage Ray would give the job (:func:`pipeline.job.tasks.parallelism`) and why."""
    ex = spec.execution
    if ex.parallelism:
        return ex.parallelism, "execution.parallelism"
    address = ex.address or os.environ.get("RAY_ADDRESS")
    if address:
        return None, f"one per CPU of the cluster at {address}, known once joined"
    if ex.num_cpus:
        return ex.num_cpus, "execution.num_cpus of a local Ray"
    return local_cpus(), "the CPUs of a local Ray on this machine"


def local_cpus() -> int:
    """The CPUs a local Ray node would have: Ray's own count (container limits included)."""
    try:
        from ray._private.utils import get_num_cpus  # lazy: importing Ray starts nothing, but costs a second

        return max(1, int(get_num_cpus()))
    except (ImportError, AttributeError):
        return os.cpu_count() or 1


def pools(spec: JobSpec, files: int, par: int | None) -> list[Pool]:
    """The curate graph's operators in order, as :class:`pipeline.job.graph._Graph` builds them: consecutive
    batch stages asking the same resources share one pool; the first such run joins the readers' pool when
    :func:`fused_into_readers` says so; a dataset stage (dedup) schedules its own Ray tasks."""
    out: list[Pool] = []
    chain: list[str] = []
    chain_res: dict[str, float] = {}
    for i, stage in enumerate(spec.stages, start=1):
        cls = stage_class(stage.type)
        label = f"{i}. {cls.name}"
        if isinstance(cls, type) and issubclass(cls, DatasetStage):
            _flush(out, chain, chain_res, files, par)
            out.append(Pool(f"{label} (a dataset stage)", None, {"num_cpus": 1}, tasks=True))
            chain, chain_res = [], {}
            continue
        if chain and dict(cls.resources) != chain_res:
            _flush(out, chain, chain_res, files, par)
            chain = []
        chain, chain_res = [*chain, label], dict(cls.resources)
    _flush(out, chain, chain_res, files, par)
    return out


def _flush(out: list[Pool], chain: list[str], res: dict[str, float], files: int, par: int | None) -> None:
    if not out:  # the readers come first
        fuse = par is not None and fused_into_readers(bool(chain), res, files, par)
        what = "read" + (f" + {', '.join(chain)} in the readers' workers" if fuse else "")
        out.append(Pool(what, reader_actors(par, files) if par else None, {"num_cpus": 1}))
        if fuse:
            return
    if chain:
        out.append(Pool(", ".join(chain), par, {"num_cpus": 1, **res}))


def render(spec: JobSpec) -> str:
    """The dry run's text: the spec, its inputs and files, its stages, the Ray workers, the output."""
    matched = match_inputs(spec)
    lines = [f"spec {spec.name!r} is valid (spec hash {spec.content_hash()[:12]}); --dry-run: nothing is written",
             "", "inputs:"]
    for inp, files in zip(spec.inputs, matched, strict=True):
        lines += _input_lines(inp.path, inp.format, inp.limit, files)
    every = [f for files in matched for f in files]
    lines.append(f"  total: {len(every)} file{'s' if len(every) != 1 else ''}, {_size(every)}")
    lines += ["", "stages:"] + [f"  {i}. {s.type}  {_params(s.params)}" for i, s in enumerate(spec.stages, 1)]
    if not spec.stages:
        lines.append("  (none: every document read is kept)")
    par, why = parallelism(spec)
    lines += ["", f"Ray: {par or 'N'} worker{'s' if par != 1 else ''} per stage ({why}); "
              "memory: none reserved per worker", *_fit_note(spec, par)]
    for pool in pools(spec, len(every), par):
        each = ", ".join(_resource(k, v) for k, v in pool.resources.items())
        count = f"{pool.actors} actor{'s' if pool.actors != 1 else ''}" if pool.actors else "N actors"
        lines.append(f"  {pool.what}: {'Ray tasks' if pool.tasks else count} x {each}")
    lines += _after_curate(spec, par)
    return "\n".join(lines)


def _fit_note(spec: JobSpec, par: int | None) -> list[str]:
    """A line when a local Ray would have fewer CPUs than one pool's workers (each asks for one)."""
    if par is None or spec.execution.address or os.environ.get("RAY_ADDRESS"):
        return []
    cpus = spec.execution.num_cpus or local_cpus()
    if par <= cpus:
        return []
    return [f"  note: a local Ray here has {cpus} CPU{'s' if cpus != 1 else ''}, fewer than a pool's {par} workers: "
            f"--parallelism {cpus} fits it"]


def _input_lines(path: str, fmt: str, limit: int | None, files: list[MatchedFile]) -> list[str]:
    head = f"  {path} ({fmt}): {len(files)} file{'s' if len(files) != 1 else ''}, {_size(files)}"
    out = [head + (f"; only its first {limit} documents are read" if limit else "")]
    out += [f"    {f.name}  {_size([f])}" for f in files[:SHOWN_FILES]]
    if len(files) > SHOWN_FILES:
        out.append(f"    ... and {len(files) - SHOWN_FILES} more")
    return out


def _after_curate(spec: JobSpec, par: int | None) -> list[str]:
    tasks = f"up to {par} at once" if par else "one per CPU at once"
    out = []
    if spec.tokenizer is not None:
        tok = spec.tokenizer
        out.append(f"  tokenizer: {'load ' + tok.path if tok.path else f'train (vocab {tok.train.vocab_size})'}:"
                   " 1 task x 1 CPU")
        out.append(f"  pack and write shards (seq_len {spec.packing.seq_len}): tasks x 1 CPU, {tasks}")
    extra = [f"documents: {spec.output.documents}"] if spec.output.documents else []
    extra += [f"split_by: {spec.output.split_by}"] if spec.output.split_by else []
    state = "exists" if storage.exists(spec.output.path) else "new"
    more = f" ({', '.join(extra)})" if extra else ""
    return [*out, "", f"output: {spec.output.path} ({state}{', overwrite' if spec.output.overwrite else ''}){more}"]


def _resource(key: str, amount: float) -> str:
    """``1 CPU``, ``2 GPUs``, ``1 accel``: a Ray resource of one worker."""
    name = {"num_cpus": "CPU", "num_gpus": "GPU"}.get(key, key)
    return f"{amount:g} {name}{'s' if amount != 1 and key in ('num_cpus', 'num_gpus') else ''}"


def _params(params: dict[str, object]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "(defaults)"


def _size(files: list[MatchedFile]) -> str:
    if any(f.size is None for f in files):
        return "size unknown"
    n = float(sum(f.size or 0 for f in files))
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
