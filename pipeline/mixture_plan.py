"""Plan a mixture: from a spec and the manifests of its sources to ``mixture.json`` (samples per source).

Token shares count **non-padding tokens** (what the manifests' ``tokens`` hold: the sum of each sample's
``doc_lens``). A source's planned samples are its token target over its mean tokens per sample, so every
source's share of the mixture's tokens is its target whatever its fill; the interleave
(:mod:`pipeline.mixture_format`) then spreads them evenly. Reading the manifests (local, object store,
HTTP, control plane) is the caller's: this module only plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pipeline.mixture_format import MAX_TOTAL_SAMPLES, Mixture, MixtureSource
from pipeline.mixture_spec import MixtureSpec, SourceSpec
from pipeline.problems import Problem, SpecError
from pipeline.shard_format import Manifest

#: what every source must share with the first, so that one model reads them all
SHARED = ("tokenizer_hash", "seq_len", "dtype", "vocab_size", "pad_id")


@dataclass
class ResolvedSource:
    """A spec's source once its manifest was read: where (pinned: a ``latest`` resolved), and its bytes' sha256."""

    spec: SourceSpec
    location: str
    manifest: Manifest
    manifest_sha256: str
    pinned: dict[str, Any] = field(default_factory=dict)


def check_compatible(sources: list[ResolvedSource]) -> None:
    """Refuse sources that one model cannot read together, naming the two that differ."""
    first = sources[0]
    for i, s in enumerate(sources[1:], start=1):
        for key in SHARED:
            a, b = getattr(first.manifest, key), getattr(s.manifest, key)
            if a != b:
                raise SpecError.one(("sources", i), f"{s.spec.name} and {first.spec.name} differ in {key} "
                                    f"({str(b)[:16]} vs {str(a)[:16]}): sources must share tokenizer, seq_len "
                                    "and dtype", "mixture")


def _cap(s: ResolvedSource) -> float:
    """The most non-padding tokens the source may give (inf without max_epochs)."""
    me = s.spec.max_epochs
    return math.inf if me is None else s.manifest.total_tokens * me


def _targets(spec: MixtureSpec, sources: list[ResolvedSource]) -> list[float]:
    """Non-padding tokens each source should give."""
    budget = {i: float(s.spec.tokens) for i, s in enumerate(sources) if s.spec.tokens is not None}
    weights = {i: float(s.spec.weight) for i, s in enumerate(sources) if s.spec.weight is not None}
    if spec.total_tokens is None:
        # as large as the weighted sources allow, each read at most max_epochs (default once)
        pool = min((s.manifest.total_tokens * (s.spec.max_epochs or 1.0) / (weights[i] / sum(weights.values()))
                    for i, s in enumerate(sources) if i in weights), default=0.0)
    else:
        pool = spec.total_tokens - sum(budget.values())
        if weights and pool <= 0:
            raise SpecError.one(("total_tokens",), f"{spec.total_tokens} leaves nothing for the weighted sources "
                                f"after the token budgets ({int(sum(budget.values()))})", "mixture")
    targets = [0.0] * len(sources)
    for i, t in budget.items():
        targets[i] = t
    fixed: set[int] = set(budget)
    free = dict(weights)
    while True:  # weighted sources share the pool; with fill: redistribute, capped ones give way
        rest = pool - sum(targets[i] for i in fixed if i in weights)
        total_w = sum(free.values())
        for i, w in free.items():
            targets[i] = rest * w / total_w if total_w else 0.0
        over = [i for i in range(len(sources)) if targets[i] > _cap(sources[i]) * (1 + 1e-9)]
        if not over:
            return targets
        if spec.fill == "error":
            i = over[0]
            s = sources[i]
            raise SpecError.one(("sources", i, "max_epochs"), f"{s.spec.name} would be read "
                                f"{targets[i] / s.manifest.total_tokens:.3g} times, more than max_epochs "
                                f"{s.spec.max_epochs:g} (or set fill: redistribute)", "mixture")
        for i in over:
            targets[i] = _cap(sources[i])
            fixed.add(i)
            free.pop(i, None)
        if not free:
            raise SpecError.one(("total_tokens",), "every weighted source is at its max_epochs: the sources "
                                "cannot fill the mixture", "mixture")


def plan_mixture(spec: MixtureSpec, sources: list[ResolvedSource]) -> Mixture:
    """The mixture file for ``spec``; :class:`SpecError` naming the field when it cannot be planned."""
    if len(sources) != len(spec.sources):
        raise ValueError("one resolved source per spec source")
    check_compatible(sources)
    targets = _targets(spec, sources)
    total = sum(targets)
    entries = []
    for i, (s, target) in enumerate(zip(sources, targets, strict=True)):
        m = s.manifest
        mean = m.total_tokens / m.total_samples
        samples = max(1, round(target / mean))
        if s.spec.max_epochs is not None:
            samples = min(samples, max(1, math.floor(m.total_samples * s.spec.max_epochs)))
        tokens = min(max(round(samples * mean), samples), samples * m.seq_len)
        if samples > MAX_TOTAL_SAMPLES:
            raise SpecError.one(("sources", i), f"{s.spec.name}: {samples} samples, more than a mixture holds",
                                "mixture")
        entries.append(MixtureSource(
            name=s.spec.name, location=s.location, manifest_sha256=s.manifest_sha256,
            target_share=round(target / total, 9) if total else 0.0, samples=samples,
            available_samples=m.total_samples, tokens=tokens, epochs=round(samples / m.total_samples, 6),
            pinned=s.pinned))
    first = sources[0].manifest
    try:
        return Mixture(seed=spec.seed, seq_len=first.seq_len, dtype=first.dtype, vocab_size=first.vocab_size,
                       tokenizer_hash=first.tokenizer_hash, pad_id=first.pad_id, sources=entries,
                       spec=spec.model_dump(mode="json", exclude_none=True)).validate()
    except ValueError as exc:
        raise SpecError([Problem(("sources",), str(exc), "mixture")]) from None
