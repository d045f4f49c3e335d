"""The records the phases hand each other, as dataclasses; JSON only where they are saved.

The saved points: each finished phase's record in the work folder's ``state.json``, one line per packed
range and written shard in ``ranges.jsonl`` / ``shards.jsonl`` (:mod:`pipeline.job.state`), and the
published ``stats.json`` and ``manifest.json``. ``to_json`` / ``from_json`` are called there only, and
give the shapes those files have always had.

``output.split_by`` is no special case: a job writes a list of shard sets (:class:`GroupRecord`), one per
group, where a job without ``split_by`` has one unnamed group; the write phase returns one
:class:`WriteResult` per group.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from pipeline import storage
from pipeline.job.state import JsonObject
from pipeline.output.curated import Part
from pipeline.shard_format import ShardInfo
from pipeline.tokenize import TokenizerInfo

#: every stage's counters as the stats actor sums them, ``{stage: {docs_in, docs_out, dropped, ...}}``
Counters = dict[str, dict[str, object]]
_SHARD_FIELDS = tuple(f.name for f in fields(ShardInfo))


# ---- curate ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupRecord:
    """One shard set to write: the output's own (``name`` ``""``) or one ``output.split_by`` value's."""

    name: str
    parts: list[Part]

    @property
    def docs(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def label(self) -> str:
        """``.`` for the output's own shard set, else the group's folder (``de``)."""
        return self.name or "."

    def curated_dir(self, work: str) -> str:
        """Where its curated parts are: the curate phase's, or the split's ``groups/<name>``."""
        return storage.join(work, "groups", self.name) if self.name else storage.join(work, "curated")

    def work_dir(self, work: str) -> str:
        """Where its ranges and ``ranges.jsonl`` / ``shards.jsonl`` are kept until the commit."""
        return storage.join(work, "split", self.name) if self.name else work

    def stage_dir(self, stage: str) -> str:
        """Where its shards, manifest and tokenizer are staged (``OUT/<name>/`` once published)."""
        return group_stage_dir(stage, self.name)


def group_stage_dir(stage: str, name: str) -> str:
    """The stage folder of shard set ``name`` (``""``: the output's own)."""
    return storage.join(stage, name) if name else stage


def whole(parts: list[Part]) -> list[GroupRecord]:
    """The groups of a job without ``output.split_by``: every part in one unnamed group."""
    return [GroupRecord("", parts)]


@dataclass(frozen=True)
class ValidationRecord:
    """``output.validation``: the held-out documents' parts (``work/groups/validation``), the training documents
    dropped as near duplicates of one, and what the documents were keyed by (pipeline/output/validation.py)."""

    parts: list[Part]
    dropped: int
    key: str

    @property
    def docs(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def group(self) -> GroupRecord:
        """The shard set the write phase packs (``OUT/validation/``)."""
        return GroupRecord("validation", self.parts)

    def to_json(self) -> JsonObject:
        return {"parts": [p.to_json() for p in self.parts], "docs": self.docs, "dropped": self.dropped,
                "key": self.key}

    @classmethod
    def from_json(cls, data: JsonObject) -> ValidationRecord:
        return cls([Part.from_json(p) for p in data["parts"]], int(data["dropped"]), str(data["key"]))


@dataclass(frozen=True)
class CurateResult:
    """What the curate phase kept: the curated parts, their groups, every stage's counters."""

    parts: list[Part]
    stages: Counters
    #: input files read
    files: int
    #: runs of the phase it took (Ray lost work it could not rebuild in the others)
    attempts: int
    #: per stage, the reports Ray repeated (ignored: each batch counts once)
    repeated_reports: dict[str, int]
    groups: list[GroupRecord]
    #: per spec input: ``{path, format, files, bytes, sha256, start}`` (``sha256`` over each file's path below
    #: the input and size; ``start`` its first file index, ``ord >> 40``): the card's sources (stats.json ``inputs``)
    inputs: tuple[JsonObject, ...] = ()
    #: worker-seconds of the phase's own steps outside every stage: ``write_parts`` (the kept documents written)
    overhead: dict[str, float] = field(default_factory=dict)
    #: ``output.validation``: the held-out documents (``parts`` are then the training documents only)
    validation: ValidationRecord | None = None

    @property
    def input_starts(self) -> tuple[int, ...]:
        return tuple(int(i["start"]) for i in self.inputs)

    @property
    def docs(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def writers(self) -> list[str]:
        return sorted({p.writer for p in self.parts})

    @property
    def split(self) -> bool:
        """Whether the groups are ``output.split_by`` values (else one unnamed group)."""
        return any(g.name for g in self.groups)

    def to_json(self) -> JsonObject:
        data: JsonObject = {"parts": [p.to_json() for p in self.parts], "docs": self.docs, "stages": self.stages,
                            "files": self.files, "writers": self.writers, "attempts": self.attempts,
                            "repeated_reports": self.repeated_reports, "inputs": list(self.inputs),
                            "overhead": self.overhead}
        if self.split:
            data["groups"] = {g.name: {"parts": [p.to_json() for p in g.parts], "docs": g.docs} for g in self.groups}
        if self.validation is not None:
            data["validation"] = self.validation.to_json()
        return data

    @classmethod
    def from_json(cls, data: JsonObject) -> CurateResult:
        parts = [Part.from_json(p) for p in data["parts"]]
        groups = [GroupRecord(name, [Part.from_json(p) for p in g["parts"]]) for name, g in data["groups"].items()
                  ] if "groups" in data else whole(parts)
        return cls(parts, data["stages"], int(data["files"]), int(data["attempts"]),
                   dict(data.get("repeated_reports") or {}), groups,
                   tuple(data.get("inputs") or ()), dict(data.get("overhead") or {}),
                   ValidationRecord.from_json(data["validation"]) if "validation" in data else None)


# ---- tokenizer ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizerRecord:
    """The tokenizer the job staged: the write phase checks the file against ``sha256`` before using it."""

    sha256: str
    vocab_size: int

    def to_json(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: JsonObject) -> TokenizerRecord:
        return cls(str(data["sha256"]), int(data["vocab_size"]))


# ---- write -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Packing:
    """Packing totals over ``ranges`` ranges (one range's, or merged: :meth:`merge`)."""

    method: str
    seq_len: int
    #: documents packed, and those cut at a sequence's end (their rest starts the next sequence)
    docs: int = 0
    docs_cut: int = 0
    #: packed sequences and the tokens in them (utilization = tokens / (sequences * seq_len))
    sequences: int = 0
    tokens: int = 0
    ranges: int = 1

    @classmethod
    def merge(cls, parts: list[Packing], seq_len: int, method: str) -> Packing:
        return cls(method, seq_len, sum(p.docs for p in parts), sum(p.docs_cut for p in parts),
                   sum(p.sequences for p in parts), sum(p.tokens for p in parts), sum(p.ranges for p in parts))

    def to_json(self) -> JsonObject:
        """As ``stats.json`` and the manifest's ``extra.packing`` show it."""
        return {"method": self.method, "seq_len": self.seq_len, "docs": self.docs, "docs_cut": self.docs_cut,
                "cut_fraction": round(self.docs_cut / self.docs, 6) if self.docs else 0.0,
                "sequences": self.sequences, "tokens": self.tokens,
                "utilization": round(self.tokens / (self.sequences * self.seq_len), 6) if self.sequences else 0.0,
                "ranges": self.ranges}

    @classmethod
    def from_json(cls, data: JsonObject) -> Packing:
        return cls(str(data["method"]), int(data["seq_len"]), int(data["docs"]), int(data["docs_cut"]),
                   int(data["sequences"]), int(data["tokens"]), int(data.get("ranges", 1)))


@dataclass(frozen=True)
class RangeRecord:
    """A packed range: documents ``[lo, hi)`` of a shard set, as ``samples`` packed sequences in its range file."""

    index: int
    lo: int
    hi: int
    samples: int
    tokens: int
    has_mask: bool
    packing: Packing
    bytes_in: int
    tokenize_seconds: float
    seconds: float
    writer: str
    #: the kept documents' profile (:class:`pipeline.card.profile.KeptProfile`); None in an older work folder
    profile: JsonObject | None = None
    #: when its task started (wall clock): the driver's submit time to it is Ray's dispatch (WriteResult)
    started: float = 0.0

    @property
    def docs(self) -> int:
        return self.hi - self.lo

    def to_json(self) -> JsonObject:
        data = asdict(self)
        data["range"] = data.pop("index")
        data["packing"] = {k: v for k, v in self.packing.to_json().items() if k != "ranges"}
        return data

    @classmethod
    def from_json(cls, data: JsonObject) -> RangeRecord:
        return cls(int(data["range"]), int(data["lo"]), int(data["hi"]), int(data["samples"]), int(data["tokens"]),
                   bool(data["has_mask"]), Packing.from_json(data["packing"]), int(data["bytes_in"]),
                   float(data["tokenize_seconds"]), float(data["seconds"]), str(data.get("writer", "")),
                   data.get("profile"), float(data.get("started", 0.0)))


@dataclass(frozen=True)
class ShardRecord:
    """A written shard: its manifest entry, its index in the shard set, who wrote it and how long it took."""

    index: int
    shard: ShardInfo
    writer: str
    seconds: float
    #: when its task started (wall clock), as :attr:`RangeRecord.started`
    started: float = 0.0

    def to_json(self) -> JsonObject:
        return {**asdict(self.shard), "index": self.index, "writer": self.writer, "seconds": self.seconds,
                "started": self.started}

    @classmethod
    def from_json(cls, data: JsonObject) -> ShardRecord:
        return cls(int(data["index"]), ShardInfo(**{k: data[k] for k in _SHARD_FIELDS if k in data}),
                   str(data.get("writer", "")), float(data.get("seconds", 0.0)), float(data.get("started", 0.0)))


@dataclass(frozen=True)
class TokenizeTotals:
    """What the write phase tokenized: every document it got (none is dropped there)."""

    docs: int
    bytes_in: int
    seconds: float

    @classmethod
    def merge(cls, parts: list[TokenizeTotals]) -> TokenizeTotals:
        return cls(sum(p.docs for p in parts), sum(p.bytes_in for p in parts), round(sum(p.seconds for p in parts), 3))

    def to_json(self) -> JsonObject:
        return {"docs_in": self.docs, "docs_out": self.docs, "bytes_in": self.bytes_in, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: JsonObject) -> TokenizeTotals:
        return cls(int(data["docs_in"]), int(data["bytes_in"]), float(data["seconds"]))


@dataclass(frozen=True)
class WriteResult:
    """One shard set written (a group's; ``group`` ``""`` for the output's own): what its manifest says."""

    group: str
    shards: list[ShardInfo]
    writers: list[str]
    packing: Packing
    has_mask: bool
    tokenize: TokenizeTotals
    #: seconds of every range and shard task, summed
    task_seconds: float
    info: TokenizerInfo
    #: of ``task_seconds``, the shard tasks' (the rest is the range tasks': read, tokenize, pack)
    shard_seconds: float = 0.0
    #: worker-seconds with no task to run (:class:`pipeline.job.write.IdleClock`); 0 in an older work folder
    idle_seconds: float = 0.0
    #: seconds between a task's submission and its start, summed: Ray's dispatch (a worker's start, the
    #: function's import, fetching its arguments)
    dispatch_seconds: float = 0.0
    #: its ranges' profiles merged (:func:`pipeline.card.profile.merge_profiles`)
    profile: JsonObject | None = None

    def to_json(self) -> JsonObject:
        return {"shards": [asdict(s) for s in self.shards], "writers": self.writers, "packing": self.packing.to_json(),
                "has_mask": self.has_mask, "tokenize": self.tokenize.to_json(), "task_seconds": self.task_seconds,
                "shard_seconds": self.shard_seconds, "idle_seconds": self.idle_seconds,
                "dispatch_seconds": self.dispatch_seconds,
                "info": asdict(self.info), "profile": self.profile}

    @classmethod
    def from_json(cls, group: str, data: JsonObject) -> WriteResult:
        return cls(group=group, shards=[ShardInfo(**s) for s in data["shards"]], writers=list(data["writers"]),
                   packing=Packing.from_json(data["packing"]), has_mask=bool(data["has_mask"]),
                   tokenize=TokenizeTotals.from_json(data["tokenize"]), task_seconds=float(data["task_seconds"]),
                   shard_seconds=float(data.get("shard_seconds", 0.0)),
                   idle_seconds=float(data.get("idle_seconds", 0.0)),
                   dispatch_seconds=float(data.get("dispatch_seconds", 0.0)),
                   info=TokenizerInfo(**data["info"]), profile=data.get("profile"))


def written_to_json(results: list[WriteResult]) -> JsonObject:
    """The write phase's record: one shard set's, or ``{"groups": {name: ...}}`` for ``output.split_by``."""
    if len(results) == 1 and not results[0].group:
        return results[0].to_json()
    return {"groups": {r.group: r.to_json() for r in results}}


def written_from_json(data: JsonObject) -> list[WriteResult]:
    if "groups" in data:
        return [WriteResult.from_json(name, rec) for name, rec in data["groups"].items()]
    return [WriteResult.from_json("", data)]


# ---- finalize: stats.json ----------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputTotals:
    shards: int = 0
    samples: int = 0
    tokens: int = 0

    @classmethod
    def of(cls, shards: list[ShardInfo]) -> OutputTotals:
        return cls(len(shards), sum(s.samples for s in shards), sum(s.tokens for s in shards))


@dataclass(frozen=True)
class GroupStats:
    """One ``output.split_by`` group's line in ``stats.json``."""

    documents: int
    output: OutputTotals
    packing: Packing

    def to_json(self) -> JsonObject:
        return {"documents": self.documents, **asdict(self.output), "packing": self.packing.to_json()}


@dataclass(frozen=True)
class DocumentsRecord:
    """The ``documents/`` output: its format, files and rows."""

    format: str
    parts: int
    rows: int


@dataclass(frozen=True)
class Seconds:
    """Seconds per phase; ``tokenizer`` and ``write`` are None for a job without a tokenizer."""

    curation: float
    total: float
    tokenizer: float | None = None
    write: float | None = None

    def to_json(self) -> JsonObject:
        data: JsonObject = {"curation": self.curation}
        if self.tokenizer is not None:
            data["tokenizer"] = self.tokenizer
        if self.write is not None:
            data["tokenize_pack_write"] = self.write
        data["total"] = self.total
        return data


@dataclass(frozen=True)
class Stats:
    """``stats.json``: the job's counts per stage, its output, packing, seconds and throughput."""

    job: str
    stages: Counters
    output: OutputTotals
    seconds: Seconds
    docs_per_s: float
    tokens_per_s: float
    parallelism: int
    groups: dict[str, GroupStats] | None = None
    packing: Packing | None = None
    writers: int | None = None
    documents: DocumentsRecord | None = None
    #: the kept documents' profile (:mod:`pipeline.card.profile`), for the dataset card; a job with shards only
    profile: JsonObject | None = None
    #: the spec's inputs as read (:attr:`CurateResult.inputs`)
    inputs: tuple[JsonObject, ...] = ()
    #: per phase, worker-seconds measured outside the stages: curation's ``write_parts`` (the kept documents
    #: written as Parquet parts), ``start_workers``, ``materialize``, ``finish`` and ``between_tasks``
    #: (:meth:`coverage`); the write phase's ``idle`` (no task to run) and ``dispatch`` (a task submitted,
    #: not started yet), as its scheduler measured them
    overhead: dict[str, dict[str, float]] | None = None
    #: ``output.validation``: the split's documents, samples, tokens and shards, the training documents dropped as
    #: near duplicates of a held-out one, and the key (pipeline/output/validation.py)
    validation: JsonObject | None = None

    def to_json(self) -> JsonObject:
        """The keys in the order ``stats.json`` has always had them."""
        data: JsonObject = {"job": self.job}
        if self.groups is not None:
            data["groups"] = {name: g.to_json() for name, g in self.groups.items()}
        if self.packing is not None:
            data["packing"] = self.packing.to_json()
        if self.writers is not None:
            data["writers"] = self.writers
        data["stages"] = [{"stage": k, **v} for k, v in sorted(self.stages.items())]
        data["output"] = asdict(self.output)
        if self.validation is not None:
            data["validation"] = self.validation
        if self.documents is not None:
            data["documents"] = asdict(self.documents)
        data["seconds"] = self.seconds.to_json()
        data["throughput"] = {"docs_per_s": self.docs_per_s, "tokens_per_s": self.tokens_per_s}
        data["parallelism"] = self.parallelism
        if self.overhead:
            data["overhead"] = self.overhead
        data["coverage"] = self.coverage()
        if self.inputs:
            data["inputs"] = [{k: v for k, v in i.items() if k != "start"} for i in self.inputs]
        if self.profile is not None:
            data["profile"] = self.profile
        return data

    def coverage(self) -> dict[str, float]:
        """Per phase, the stages' seconds and the phase's measured ``overhead`` over the worker-seconds the phase
        had (its wall x ``parallelism``): how much of a phase the figures explain. Every stage reports what its
        tasks and workers spent (batches, setup and the start of a worker process it was the first in, a dedup
        stage's every task; ``90-tokenize``, the write phase's stage, every range and shard task). The write
        phase's scheduler measures the worker-seconds it had no task for and each task's wait for Ray to start
        it; curation measures the readers' wait for Ray Data to start them (``start_workers``), the workers' wait
        for the driver after each dataset a dedup stage materializes (``materialize``) and after the last part
        (``finish``), the part writer (``write_parts``), and the stretches when no task of the phase ran anywhere
        (``between_tasks``: Ray Data starting an operator, the driver between a dedup stage's rounds). What is left
        is a worker's wait while another one works: Ray's dispatch of its next task, the end of a pool's work."""
        def share(seconds: float, wall: float | None) -> float | None:
            return round(seconds / (wall * self.parallelism), 3) if wall else None

        def seconds(entry: dict[str, object]) -> float:
            value = entry.get("seconds", 0.0)
            return float(value) if isinstance(value, int | float) else 0.0

        curate = sum((seconds(v) for k, v in self.stages.items() if k != "90-tokenize"), 0.0)
        curate += sum((self.overhead or {}).get("curation", {}).values())
        out = {"curation": share(curate, self.seconds.curation)}
        if "90-tokenize" in self.stages:
            overhead = sum((self.overhead or {}).get("tokenize_pack_write", {}).values())
            out["tokenize_pack_write"] = share(seconds(self.stages["90-tokenize"]) + overhead, self.seconds.write)
        return {k: v for k, v in out.items() if v is not None}
