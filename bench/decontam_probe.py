"""A contamination probe harder than whole items: benchmark pieces, perturbed, in clean carrier documents.

The shared ``contamination_probe`` splices whole items only, so a detector that needs most of an item
passes it. This builder makes, from ``../shared/corpora/bench/*`` and clean carriers from
``../shared/corpora/english`` and ``code``, one positive document per (benchmark, item, kind):

=============  ==========================================================================================
kind           what is inserted between two lines of a carrier
=============  ==========================================================================================
verbatim       the whole item as it is shown in the wild (MMLU with ``A.``-``D.`` labels and ``Answer: B``,
               TruthfulQA as ``Q:``/``A:``)
reflowed       the whole item re-wrapped at another width (prose) or re-indented with 2 spaces / tabs (code)
lowercased     the whole item in lower case
question       the question or prompt alone
answer         the answer alone: GSM8K's solution, HumanEval's ``canonical_solution``, MMLU's labelled
               choices, TruthfulQA's best answer
half           a contiguous half of the item's lines (of its words, for a one-line item), at a random offset
fenced         the whole item inside a markdown code fence
lead_in        the whole item after a one-line lead-in ("Can someone help me with this one?")
=============  ==========================================================================================

**What counts as evidence.** A piece is inserted only when it could be told apart from ordinary text.
Words here are ``\\w+`` runs of two or more characters, or one digit: a single letter (an option label
``B.``, ``l`` or ``x`` in code, the article "a") identifies nothing. A whole item or field needs at least
``FIELD_FLOOR`` (8) words holding a letter, GPT-3's shortest contamination n-gram (Brown et al. 2020,
app. C); a fragment (``half``) needs ``FRAGMENT_FLOOR`` (13) words, the n-gram of GPT-3 and
lm-evaluation-harness: a shorter piece of a longer item is a phrase that ordinary text may hold. A piece
whose words are those of the same piece of ``STOCK`` (3) or more items of its benchmark is stock text (the
``Wrong, Not wrong`` choices of 900 MMLU moral scenarios), not a trace of one item. Pieces left out are
counted per kind, benchmark and reason (``left_out``), never silently dropped. The floors are properties
of the evidence, not of any detector's parameters.

Negatives (``clean``) are carrier windows with nothing inserted, and **hard negatives**: for every
HumanEval entry point a short function of that name and signature with another body, inside a code
carrier; arithmetic word problems in GSM8K's format with made-up names and numbers; multiple-choice
questions in MMLU's format and stems ("Which of the following ...") on made-up topics; Q&A prose with
TruthfulQA's ``Q:``/``A:`` shape. Everything is drawn from one seeded RNG: the same data give the
same probe.
"""

from __future__ import annotations

import random
import re
import textwrap
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("verbatim", "reflowed", "lowercased", "question", "answer", "half", "fenced", "lead_in")
FIELD_FLOOR = 8
FRAGMENT_FLOOR = 13
STOCK = 3
BENCH_FILES = {"gsm8k": "gsm8k_test.jsonl.gz", "humaneval": "humaneval.jsonl.gz", "mmlu": "mmlu_test.jsonl.gz",
               "truthfulqa": "truthfulqa.jsonl.gz"}
#: clean carriers: English prose and documentation, and code (HumanEval pieces go into Python files)
PROSE_CARRIERS = ("english/python_docs.jsonl.gz", "english/usr_share_doc.jsonl.gz", "english/debian_handbook.jsonl.gz",
                  "english/debian_docs.jsonl.gz", "english/manpages_en.jsonl.gz", "english/gutenberg.jsonl.gz",
                  "english/jargon.jsonl.gz")
CODE_CARRIERS = ("code/code.jsonl.gz",)
LEAD_INS = ("Can someone help me with this one?", "Here is a question from my homework:", "Practice problem 3.",
            "Found this in an old quiz, the answer surprised me.", "Interview question I got last week:",
            "From the study guide (do not share):", "Solve the following.", "Q3 from the worksheet",
            "My attempt is below, is it right?", "Today's puzzle:")
_WORD = re.compile(r"\w\w+|\d")


@dataclass
class Probe:
    """The probe's documents and what was left out: ``docs`` rows have ``id``, ``text``, ``label`` (1/0),
    ``kind`` (a perturbation, or ``clean`` / ``hard:<what>``), ``benchmark`` and ``item`` (positives)."""

    docs: list[dict] = field(default_factory=list)
    left_out: Counter = field(default_factory=Counter)  # (kind, benchmark, "short" | "stock") -> pieces
    eligible: Counter = field(default_factory=Counter)  # (kind, benchmark) -> pieces that could be inserted


def letter_words(text: str) -> int:
    return sum(not w.isdigit() for w in _WORD.findall(text))


def n_words(text: str) -> int:
    return len(_WORD.findall(text))


# ---- how an item looks in the wild ------------------------------------------------------------------------

def parts(bench: str, rec: dict) -> tuple[str, str, str]:
    """``(whole item, question, answer)`` of a benchmark record, rendered as a web page would show them."""
    if bench == "gsm8k":
        return f"{rec['question']}\n{rec['answer']}", rec["question"], rec["answer"]
    if bench == "humaneval":
        return rec["prompt"] + rec["canonical_solution"], rec["prompt"], rec["canonical_solution"]
    if bench == "mmlu":
        choices = "\n".join(f"{'ABCD'[i]}. {c}" for i, c in enumerate(rec["choices"]))
        return f"{rec['question']}\n{choices}\nAnswer: {rec['answer']}", rec["question"], choices
    if bench == "truthfulqa":
        return f"Q: {rec['question']}\nA: {rec['best_answer']}", rec["question"], rec["best_answer"]
    raise ValueError(f"no renderer for benchmark {bench!r}")


def perturb(kind: str, bench: str, rec: dict, rng: random.Random) -> str | None:
    """The piece of ``kind`` for one record, or None when it is under its evidence floor."""
    whole, question, answer = parts(bench, rec)
    code = bench == "humaneval"
    if kind == "question":
        piece = question
    elif kind == "answer":
        piece = answer
    elif kind == "half":
        piece = _half(whole, rng)
        return piece if n_words(piece) >= FRAGMENT_FLOOR else None
    elif kind == "verbatim":
        piece = whole
    elif kind == "reflowed":
        piece = _reindent(whole, rng) if code else _rewrap(whole, rng)
    elif kind == "lowercased":
        piece = whole.lower()
    elif kind == "fenced":
        piece = f"```{'python' if code else ''}\n{whole.strip()}\n```"
    elif kind == "lead_in":
        piece = f"{rng.choice(LEAD_INS)}\n{whole}"
    else:
        raise ValueError(kind)
    return piece if letter_words(answer if kind == "answer" else question if kind == "question" else whole
                                 ) >= FIELD_FLOOR else None


def _half(text: str, rng: random.Random) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) >= 2:
        k = (len(lines) + 1) // 2
        start = rng.randrange(len(lines) - k + 1)
        return "\n".join(lines[start:start + k])
    tokens = text.split()
    k = (len(tokens) + 1) // 2
    start = rng.randrange(len(tokens) - k + 1)
    return " ".join(tokens[start:start + k])


def _rewrap(text: str, rng: random.Random) -> str:
    flat = " ".join(text.split())
    return textwrap.fill(flat, width=rng.randint(35, 90))


def _reindent(code: str, rng: random.Random) -> str:
    unit = rng.choice(("  ", "\t", "   "))
    out = []
    for line in code.splitlines():
        stripped = line.lstrip(" ")
        depth = (len(line) - len(stripped)) // 4
        out.append(unit * depth + stripped)
    return "\n".join(out) + "\n"


# ---- carriers ---------------------------------------------------------------------------------------------

def carrier_pool(corpora: Path, relative: Iterable[str], python_only: bool = False, limit: int = 4000
                 ) -> list[list[str]]:
    """Line lists of clean documents (google-cloud-cli man pages skipped: thousands of near-copies)."""
    from bench.common import iter_jsonl

    pool: list[list[str]] = []
    for rel in relative:
        path = corpora / rel
        if not path.exists():
            continue
        taken = 0
        for rec in iter_jsonl(path):
            if python_only and rec.get("lang") != "python":
                continue
            if str(rec.get("package", "")).startswith("google-cloud"):
                continue
            lines = rec.get("text", "").splitlines()
            if len(lines) >= 12:
                pool.append(lines)
                taken += 1
                if taken >= limit:
                    break
    return pool


def window(pool: list[list[str]], rng: random.Random, min_lines: int = 30, max_lines: int = 120) -> list[str]:
    lines = rng.choice(pool)
    k = min(len(lines), rng.randint(min_lines, max_lines))
    start = rng.randrange(len(lines) - k + 1)
    return lines[start:start + k]


def insert(carrier: list[str], piece: str, rng: random.Random) -> str:
    at = rng.randrange(len(carrier) + 1)
    return "\n".join([*carrier[:at], piece, *carrier[at:]])


# ---- hard negatives -----------------------------------------------------------------------------------------

_NAMES = ("Ada", "Bongani", "Chiara", "Dmitri", "Esi", "Farid", "Greta", "Hiro", "Ines", "Joon", "Kofi", "Lena")
_THINGS = (("marbles", "bag"), ("stamps", "album"), ("cupcakes", "tray"), ("bolts", "box"), ("seedlings", "row"),
           ("postcards", "drawer"), ("pencils", "case"), ("tiles", "crate"))
_TOPICS = ("tidal locking", "the Krebs cycle", "double-entry bookkeeping", "Bessel functions", "the Hanseatic League",
           "plate tectonics", "Huffman coding", "the Treaty of Westphalia", "osmotic pressure", "quorum sensing",
           "the Coriolis effect", "compound interest", "lexical scoping", "the Doppler effect")
_STEMS = ("Which of the following is true of {t}?", "Which of the following best describes {t}?",
          "Which of the following statements about {t} is correct?", "All of the following are true of {t} EXCEPT:",
          "What is the main reason {t} matters to a student?")
_BODIES = (
    "    result = []\n    for item in {a}:\n        if item not in result:\n            result.append(item)\n"
    "    return result\n",
    "    if not {a}:\n        return None\n    return max({a})\n",
    "    total = 0\n    for x in {a}:\n        total += x\n    return total\n",
    "    return sorted({a}, reverse=True)\n",
    "    count = 0\n    for i in range(len({a})):\n        if {a}[i] % 2 == 0:\n            count += 1\n"
    "    return count\n",
    "    return {a}[::-1]\n",
    "    seen = set()\n    for x in {a}:\n        if x in seen:\n            return True\n        seen.add(x)\n"
    "    return False\n",
)


def hard_negatives(benchmarks: dict[str, list[dict]], code_pool: list[list[str]], prose_pool: list[list[str]],
                   rng: random.Random, per_kind: int) -> Iterator[tuple[str, str]]:
    """``(kind, text)`` of clean documents built to look like benchmark material without being any item."""
    for rec in benchmarks.get("humaneval", []):
        name = rec.get("entry_point") or "solve"
        arg = rng.choice(("values", "xs", "data", "items", "seq"))
        fn = (f"def {name}({arg}):\n    \"\"\"Helper used by the report generator.\"\"\"\n"
              + rng.choice(_BODIES).format(a=arg))
        if rng.random() < 0.5:
            fn = "from typing import List\n\n\n" + fn + "\n\nif __name__ == \"__main__\":\n    import doctest\n" \
                 "    doctest.testmod()\n"
        yield "hard:entry_point", insert(window(code_pool, rng), fn, rng)
    for _ in range(per_kind):
        who, (thing, holder) = rng.choice(_NAMES), rng.choice(_THINGS)
        a, b, c = rng.randint(12, 90), rng.randint(2, 11), rng.randint(2, 9)
        problem = (f"{who} has {a} {thing} in a {holder}. {who} gives away {b} {thing} and then buys {c} more "
                   f"{holder}s with 6 {thing} each. How many {thing} does {who} have now?\n"
                   f"{who} has {a} - {b} = <<{a}-{b}={a - b}>>{a - b} {thing} left.\n"
                   f"{who} buys {c} * 6 = <<{c}*6={c * 6}>>{c * 6} {thing}.\n"
                   f"So {who} has {a - b} + {c * 6} = <<{a - b}+{c * 6}={a - b + c * 6}>>{a - b + c * 6} {thing}.\n"
                   f"#### {a - b + c * 6}")
        yield "hard:word_problem", insert(window(prose_pool, rng), problem, rng)
    for _ in range(per_kind):
        topic = rng.choice(_TOPICS)
        opts = rng.sample(("It is a conserved quantity.", "It depends on temperature only.", "None of the above",
                           "All of the above", "It was first described in 1905.", "It cannot be measured.",
                           "True, False", "False, True"), 4)
        q = rng.choice(_STEMS).format(t=topic) + "\n" + "\n".join(f"{'ABCD'[i]}. {o}" for i, o in enumerate(opts))
        yield "hard:multiple_choice", insert(window(prose_pool, rng), q + f"\nAnswer: {rng.choice('ABCD')}", rng)
    for _ in range(per_kind):
        topic = rng.choice(_TOPICS)
        qa = (f"Q: What happens if you ignore {topic}?\nA: Nothing dramatic happens; you just get a less "
              f"accurate answer about {topic}.\nQ: Is that true?\nA: I have no comment.")
        yield "hard:qa_prose", insert(window(prose_pool, rng), qa, rng)


# ---- the probe ----------------------------------------------------------------------------------------------

def read_benchmarks(bench_dir: Path) -> dict[str, list[dict]]:
    from bench.common import iter_jsonl

    return {b: list(iter_jsonl(bench_dir / f)) for b, f in BENCH_FILES.items() if (bench_dir / f).exists()}


def build_probe(corpora: Path, per_benchmark: int = 150, clean: int = 2000, hard_per_kind: int = 150,
                seed: int = 0) -> Probe:
    """Positives: up to ``per_benchmark`` items per (benchmark, kind), sampled among the items whose piece
    reaches its floor; negatives: ``clean`` carrier windows (one in four from code) and the hard negatives."""
    rng = random.Random(seed)
    benchmarks = read_benchmarks(corpora / "bench")
    prose_pool = carrier_pool(corpora, PROSE_CARRIERS)
    code_pool = carrier_pool(corpora, CODE_CARRIERS, python_only=True)
    if not benchmarks or not prose_pool or not code_pool:
        raise FileNotFoundError(f"benchmark sets or carriers missing under {corpora}")
    probe = Probe()
    for bench, records in benchmarks.items():
        pool = code_pool if bench == "humaneval" else prose_pool
        for kind in KINDS:
            pieces = []
            for rec in records:
                piece = perturb(kind, bench, rec, rng)
                if piece is None:
                    probe.left_out[kind, bench, "short"] += 1
                else:
                    pieces.append((rec["id"], piece))
            shared = Counter(tuple(_WORD.findall(p.lower())) for _, p in pieces)
            probe.left_out[kind, bench, "stock"] += sum(n for n in shared.values() if n >= STOCK)
            pieces = [(i, p) for i, p in pieces if shared[tuple(_WORD.findall(p.lower()))] < STOCK]
            probe.eligible[kind, bench] = len(pieces)
            for item, piece in rng.sample(pieces, min(per_benchmark, len(pieces))):
                probe.docs.append({"id": f"{kind}/{item}", "text": insert(window(pool, rng), piece, rng),
                                   "label": 1, "kind": kind, "benchmark": bench, "item": item, "piece": piece})
    for i in range(clean):
        text = "\n".join(window(code_pool if i % 4 == 0 else prose_pool, rng))
        probe.docs.append({"id": f"clean/{i}", "text": text, "label": 0, "kind": "clean", "benchmark": "",
                           "item": ""})
    for i, (kind, text) in enumerate(hard_negatives(benchmarks, code_pool, prose_pool, rng, hard_per_kind)):
        probe.docs.append({"id": f"{kind}/{i}", "text": text, "label": 0, "kind": kind, "benchmark": "", "item": ""})
    return probe
