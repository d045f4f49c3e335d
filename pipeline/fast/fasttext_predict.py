"""fastText's best label, computed with NumPy from the model's own matrices: the same label and probability as
``model.predict(text)`` (k=1).

**Must equal** fastText's ``predict`` (``fasttext-numpy2-wheel==0.9.2``, module ``fasttext``), label and decision.
**Fallback**: fastText's own ``predict`` (:meth:`pipeline.filters.fasttext_model.FastTextModel.predict`).
**Steps aside** for a model it does not handle (one-vs-all loss, word n-grams > 1, a quantized output layer:
:meth:`TopLabel.load` returns None), and per document where the result is too close to call (below).
**Difference test**: ``tests/test_lid.py``; ``bench/fast_paths.py`` (``lid``) on the shared corpora.

Why: fastText sums, for every whitespace-separated token of a document, the input-matrix rows of the token and of
its character n-grams (a dozen rows a token), averages them and scores the labels on that average; it does this
row by row for every token of every document, the largest cost of the curation chain after word splitting
(``bench/scale.py``). A token's rows are the same wherever it occurs, so here each token's row sum and row count
are computed once and cached; a document is then one gather and one sum over its tokens, a batch one matrix
product with the output layer. The batch's tokens are split and numbered by distinct token in C
(:mod:`kernels.fasttext_tokens`), so Python looks up only distinct tokens in the cache. A token not in the cache
gets its rows as fastText's ``Dictionary::computeSubwords`` finds them (the character n-grams of ``<token>``,
FNV-1a hashed into buckets, mapped through a pruned model's index, read from the model file), in NumPy over every
missing token of a batch at once: asking the model token by token (``get_subwords``) costs more than its whole
prediction.

Exactness. The label and probability follow fastText's ``predict`` step for step: its tokenizer (split on
space, tab, vertical tab, form feed, carriage return and NUL; the end-of-line token ``</s>`` that ``predict``
appends; tokens with the label prefix left out), its average over every row, and its losses: softmax (the
probability plus fastText's 1e-5, from ``std_log``), or hierarchical softmax over the Huffman tree built from the
labels' counts as fastText builds it (the sum of ``log(sigmoid + 1e-5)`` along the path). The sums differ from
fastText's in the last bits only (float64 here, float32 in order there), so wherever that could change a decision
(the two best labels within a margin in log-probability, or the probability within it of a cutoff the caller
names; the margin, :data:`MARGIN` or more for a long text, is ~7x the largest difference seen on real text),
the document is given to fastText itself.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from kernels.fasttext_tokens import FT_SPACE, split_lines

#: where the fast result is handed to fastText: log-probability gap of the two best labels, and distance of the
#: probability from a cutoff, at least MARGIN and PER_ROW per input row averaged. fastText sums the rows in
#: float32, whose error grows with their number: 1.5e-4 at most in probability over 163,132 documents of
#: ../shared/corpora (34 languages, web pages, code), most below 1e-5.
MARGIN = 1e-3
PER_ROW = 2e-7
#: bytes the token cache of a model may hold, both generations together: a token costs its row sum (4 bytes a
#: dimension) and about TOKEN_OVERHEAD more (its string and its index entry). 440 MB: two million tokens of
#: lid.176 (16 dimensions), which made the lid stage clearly cheaper than half a million on the corpora of
#: bench/scale.py (a corpus keeps bringing new tokens: a larger cache asks fastText's n-grams less often);
#: ~370,000 tokens of a 256-dimension model
TOKEN_CACHE = 440_000_000
TOKEN_OVERHEAD = 156
EOS = "</s>"
LABEL_PREFIX = "__label__"
FASTTEXT_MAGIC = 793712314


@dataclass(frozen=True)
class ModelFile:
    """What fastText's Python API does not expose, read from the model file's header (``FastText::loadModel``:
    magic, version, ``Args``, then ``Dictionary::save``): the bucket count, n-gram lengths and the pruned
    n-gram index of a quantized model."""

    nwords: int
    bucket: int
    minn: int
    maxn: int
    #: -1: not pruned (an n-gram's row is ``nwords + hash % bucket``); else the kept buckets, sorted, and their rows
    prune_size: int
    prune_keys: np.ndarray
    prune_rows: np.ndarray

    @classmethod
    def read(cls, path: str | Path) -> ModelFile:
        with open(path, "rb") as f:
            head = f.read(8 + 56 + 28)
            magic, _version = struct.unpack_from("<ii", head, 0)
            if magic != FASTTEXT_MAGIC:
                raise ValueError(f"not a fastText model: {path}")
            fields = struct.unpack_from("<12id", head, 8)  # dim ws epoch minCount neg wordNgrams loss model bucket
            bucket, minn, maxn = fields[8], fields[9], fields[10]  # minn maxn lrUpdateRate, then t (double)
            size, nwords, _nlabels, _ntokens, prune_size = struct.unpack_from("<iiiqq", head, 8 + 56)
            pairs = np.zeros((0, 2), dtype=np.int64)
            if prune_size > 0:  # past the entries (word, NUL, int64 count, int8 type), the index's pairs
                rest = f.read()
                off = 0
                for _ in range(size):
                    off = rest.index(b"\0", off) + 1 + 8 + 1
                pairs = np.frombuffer(rest, dtype="<i4", count=2 * prune_size, offset=off).reshape(-1, 2)
        order = np.argsort(pairs[:, 0], kind="stable")
        return cls(nwords, bucket, minn, maxn, prune_size, pairs[order, 0].astype(np.int64),
                   pairs[order, 1].astype(np.int64))

    def bucket_rows(self) -> np.ndarray | None:
        """A pruned model's row of each bucket (-1: pruned away), as one array: a lookup instead of a search.
        None for a model that was not pruned (its row is ``nwords + bucket``)."""
        if self.prune_size < 0:
            return None
        table = np.full(self.bucket, -1, dtype=np.int64)
        table[self.prune_keys] = self.nwords + self.prune_rows
        return table

    def ngram_rows(self, tokens: Sequence[str], table: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The input rows of every token's character n-grams, and the token each belongs to, as
        ``computeSubwords(BOW + token + EOW)`` and ``pushHash`` give them (``table``: :meth:`bucket_rows`).

        The FNV-1a hash of the n-gram of ``n`` characters at a character is the hash of the one of ``n - 1``
        characters there continued over the bytes of the next character: one pass per length over every
        character of every token, a few more for the bytes after the first of multi-byte characters."""
        words = [b"<" + t.encode("utf-8") + b">" for t in tokens]
        buf = np.frombuffer(b"".join(words), dtype=np.uint8)
        if self.prune_size == 0 or not len(buf):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        signed = buf.astype(np.int8).astype(np.uint32)  # fastText hashes uint32_t(int8_t(byte))
        ends = np.cumsum(np.fromiter(map(len, words), dtype=np.int64, count=len(words)))
        starts = np.flatnonzero((buf & 0xC0) != 0x80)  # the first byte of each character
        nchars = len(starts)
        width = np.diff(starts, append=len(buf))  # bytes of each character
        owner = np.searchsorted(ends, starts, side="right")  # the token of each character
        first = np.searchsorted(starts, ends - 1, side="right") - np.bincount(owner, minlength=len(words))
        place = np.arange(nchars) - first[owner]  # the character's place in its token (0: "<")
        left = np.bincount(owner, minlength=len(words))[owner] - place
        prime = np.uint32(16777619)
        h = np.full(nchars, 2166136261, dtype=np.uint32)
        rows: list[np.ndarray] = []
        owners: list[np.ndarray] = []
        for n in range(1, self.maxn + 1):
            nxt = np.minimum(np.arange(n - 1, nchars + n - 1), nchars - 1)  # the character the n-gram adds
            at, wide = starts[nxt], width[nxt]
            h = (h ^ signed[at]) * prime
            for j in range(1, int(wide.max(initial=1))):
                more = np.flatnonzero(wide > j)
                h[more] = (h[more] ^ signed[at[more] + j]) * prime
            if n < self.minn:
                continue
            ok = left >= n
            if n == 1:  # "<" or ">" alone is no n-gram
                ok &= (place != 0) & (left != 1)
            hashed = (h[ok] % np.uint32(self.bucket)).astype(np.int64)
            who = owner[ok]
            if table is None:
                rows.append(self.nwords + hashed)
                owners.append(who)
            else:
                row = table[hashed]
                kept = row >= 0
                rows.append(row[kept])
                owners.append(who[kept])
        if not rows:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(rows), np.concatenate(owners)


def _output_matrix(model: Any, path: str, rows: int, dim: int) -> np.ndarray | None:
    """The output layer: from fastText for a plain model; for a quantized one whose output layer was not
    quantized (``qout`` false, lid.176.ftz), read from the file's end, where fastText saves it last
    (``FastText::saveModel``: int64 rows, int64 columns, rows x columns float32)."""
    if not model.is_quantized():
        return np.asarray(model.get_output_matrix(), dtype=np.float64)
    if model.f.getArgs().qout:
        return None
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        f.seek(size - (16 + rows * dim * 4))
        if np.frombuffer(f.read(16), dtype="<i8").tolist() != [rows, dim]:
            return None
        return np.frombuffer(f.read(rows * dim * 4), dtype="<f4").reshape(rows, dim).astype(np.float64)


def _huffman_paths(counts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """fastText's ``HierarchicalSoftmaxLoss::buildTree`` over the labels' counts, as two 0/1 matrices
    (label x internal node): the nodes where a label's path turns left, and where it turns right."""
    osz = len(counts)
    n = 2 * osz - 1
    count = [int(c) for c in counts] + [10**15] * (osz - 1)
    parent = [-1] * n
    binary = [False] * n
    leaf, node = osz - 1, osz
    for i in range(osz, n):
        mini = [0, 0]
        for j in range(2):
            if leaf >= 0 and count[leaf] < count[node]:
                mini[j] = leaf
                leaf -= 1
            else:
                mini[j] = node
                node += 1
        count[i] = count[mini[0]] + count[mini[1]]
        parent[mini[0]] = parent[mini[1]] = i
        binary[mini[1]] = True
    left = np.zeros((osz, max(osz - 1, 1)))
    right = np.zeros_like(left)
    for label in range(osz):
        at = label
        while parent[at] != -1:
            (right if binary[at] else left)[label, parent[at] - osz] = 1.0
            at = parent[at]
    return left, right


def _path_columns(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Per label, the columns of ``[log(1 - f), log(f), 0]`` (nodes x 2 + 1) that its path adds up: a gather
    instead of a matrix product. Paths shorter than the longest are padded with the zero column."""
    nodes = left.shape[1]
    steps = [np.concatenate([np.flatnonzero(left[i]), nodes + np.flatnonzero(right[i])]) for i in range(len(left))]
    depth = max(len(s) for s in steps)
    out = np.full((len(left), depth), 2 * nodes, dtype=np.int64)
    for i, s in enumerate(steps):
        out[i, : len(s)] = s
    return out


class _Generation:
    """One generation of the token cache: token -> slot, and each slot's row sum and row count."""

    def __init__(self, size: int, dim: int):
        self.size = size
        self.index: dict[str, int] = {}
        self.sums = np.zeros((size, dim), dtype=np.float32)
        self.counts = np.zeros(size, dtype=np.float32)


class TopLabel:
    """The best label of each text, as ``model.predict(text)`` gives it (see the module's docstring)."""

    def __init__(self, model: Any, file: ModelFile, output: np.ndarray, loss: str, counts: Sequence[int]):
        self._model = model
        self._file = file
        self._out = output
        self._dim = output.shape[1]
        self._loss = loss
        if loss == "hs":
            left, right = _huffman_paths(counts)
            self._nodes = left.shape[1]
            self._paths = _path_columns(left, right)
        self._words = {w: i for i, w in enumerate(model.get_words())}
        self._table = file.bucket_rows()
        if model.is_quantized():  # rows decoded one by one, on first use
            nrows = file.nwords + (file.prune_size if file.prune_size >= 0 else file.bucket)
            self._input = np.zeros((nrows, self._dim), dtype=np.float32)
            self._decoded = np.zeros(nrows, dtype=bool)
        else:
            self._input = np.asarray(model.get_input_matrix(), dtype=np.float32)
            self._decoded = np.ones(len(self._input), dtype=bool)
        self._cache = _Generation(self._generation_size(), self._dim)
        self._old = _Generation(0, self._dim)
        eos_sum, eos_n = self._token_rows([EOS])  # predict() appends "\n": each line ends with this token
        self._eos_sum, self._eos_n = eos_sum[0], float(eos_n[0])

    @classmethod
    def load(cls, model: Any, path: str | Path) -> TopLabel | None:
        """A fast path for ``model`` (loaded from ``path``), or None for a model it does not handle."""
        args = model.f.getArgs()
        if args.loss.name not in ("hs", "softmax") or args.wordNgrams != 1 or args.model.name != "supervised":
            return None
        try:
            file = ModelFile.read(path)
        except (OSError, ValueError, struct.error):
            return None
        labels, counts = model.get_labels(include_freq=True)
        out = _output_matrix(model, str(path), len(labels), args.dim)
        if out is None or file.nwords != len(model.get_words()) or (file.minn, file.maxn) != (args.minn, args.maxn):
            return None
        return cls(model, file, out, args.loss.name, counts)

    def _token_rows(self, tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per token, the sum and the number of the input rows fastText's ``getLine`` adds for it: the word's own
        row when it is in the vocabulary, and its character n-grams (none for ``</s>``); nothing for a label."""
        n = len(tokens)
        wid = np.fromiter(map(self._words.get, tokens, repeat(-1)), dtype=np.int64, count=n)
        label = np.zeros(n, dtype=bool)
        plain = np.ones(n, dtype=bool)  # tokens that have character n-grams
        joined = "\n".join(tokens)
        if LABEL_PREFIX in joined or EOS in joined:  # rare: find them one by one
            for i, t in enumerate(tokens):
                label[i] = t.startswith(LABEL_PREFIX)
                plain[i] = not label[i] and t != EOS
        sub = np.flatnonzero(plain)
        grams, owner = self._file.ngram_rows([tokens[i] for i in sub.tolist()] if len(sub) < n else tokens,
                                             self._table)
        known = np.flatnonzero((wid >= 0) & ~label)
        rows = np.concatenate([wid[known], grams])
        who = np.concatenate([known, sub[owner]])
        need = np.unique(rows[~self._decoded[rows]])
        for i in need.tolist():
            self._input[i] = self._model.get_input_vector(i)
        self._decoded[need] = True
        vectors = self._input[rows]
        sums = np.empty((n, self._dim), dtype=np.float32)
        for d in range(self._dim):
            sums[:, d] = np.bincount(who, weights=vectors[:, d], minlength=n)
        return sums, np.bincount(who, minlength=n).astype(np.float32)

    def _generation_size(self) -> int:
        """Tokens in one generation of the cache: half of what :data:`TOKEN_CACHE` bytes hold."""
        return max(1, TOKEN_CACHE // (4 * self._dim + TOKEN_OVERHEAD) // 2)

    def _distinct_slots(self, tokens: list[str]) -> np.ndarray:
        """Each of the distinct ``tokens``' row in the current generation of the cache: found there, moved from
        the previous one, or computed (together, for the whole call). When the current generation is full it
        becomes the previous one: memory stays bounded, and the frequent tokens are carried over, never computed
        again.

        Only a call's distinct tokens are looked up (:func:`kernels.fasttext_tokens.split_lines` numbers them):
        a batch's own small table stays in the CPU's cache where a probe of the large one waits for memory."""
        cache = self._cache
        slots = np.fromiter(map(cache.index.get, tokens, repeat(-1)), dtype=np.int64, count=len(tokens))
        lost = np.flatnonzero(slots < 0)
        if not len(lost):
            return slots
        new = [tokens[i] for i in lost.tolist()]
        if len(cache.index) + len(new) > cache.size:
            self._old, cache = cache, _Generation(max(self._generation_size(), len(tokens)), self._dim)
            self._cache = cache
            lost = np.arange(len(tokens))
            new = tokens
        first = len(cache.index)
        cache.index.update(zip(new, range(first, first + len(new)), strict=True))
        old = self._old
        where = np.fromiter(map(old.index.get, new, repeat(-1)), dtype=np.int64, count=len(new))
        moved = np.flatnonzero(where >= 0)
        cache.sums[first + moved], cache.counts[first + moved] = old.sums[where[moved]], old.counts[where[moved]]
        fresh = np.flatnonzero(where < 0)
        if len(fresh):
            cache.sums[first + fresh], cache.counts[first + fresh] = self._token_rows([new[i] for i in fresh.tolist()])
        slots[lost] = np.arange(first, first + len(new))
        return slots

    def scores(self, lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per line (one fastText line each: no ``\\n``): every label's log-probability as fastText scores it
        (rows of -inf for a line without a token), and how many input rows fastText averages for it."""
        eos = np.ones(len(lines))  # whether the appended end-of-line token is reached
        cut: list[str] | None = None
        for i, line in enumerate(lines):
            if EOS in line:  # rare: getLine stops at the first "</s>" token, its own row in
                parts = [p for p in FT_SPACE.split(line) if p]
                if EOS in parts:
                    cut = cut or list(lines)
                    cut[i] = " ".join(parts[: parts.index(EOS) + 1])
                    eos[i] = 0.0
        distinct, ids, ends = split_lines(lines if cut is None else cut)
        slots = self._distinct_slots(distinct)[ids]
        sums = np.zeros((len(lines), self._dim))
        counts = np.zeros(len(lines))
        starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
        has = starts < ends
        if slots.size:
            sums[has] = np.add.reduceat(self._cache.sums[slots], starts[has], axis=0, dtype=np.float64)
            counts[has] = np.add.reduceat(self._cache.counts[slots], starts[has], dtype=np.float64)
        sums += eos[:, None] * self._eos_sum
        counts += eos * self._eos_n
        some = counts > 0
        hidden = sums[some] / counts[some, None]
        logp = np.full((len(lines), len(self._out)), -np.inf)
        # gathers and einsum, not BLAS (``@``): these products are small, and BLAS threads would compete with the
        # other workers for the node's cores
        if self._loss == "hs":
            f = 1.0 / (1.0 + np.exp(-np.einsum("bd,nd->bn", hidden, self._out[: self._nodes])))
            sides = np.concatenate([np.log(1.0 - f + 1e-5), np.log(f + 1e-5), np.zeros((len(f), 1))], axis=1)
            logp[some] = sides[:, self._paths].sum(axis=2)
        else:
            z = np.einsum("bd,ld->bl", hidden, self._out)
            z = np.exp(z - z.max(axis=1, keepdims=True))
            logp[some] = np.log(z / z.sum(axis=1, keepdims=True) + 1e-5)
        return logp, counts

    def best(self, lines: Sequence[str], cutoffs: Sequence[float] = ()) -> list[tuple[int, float] | None]:
        """Per line: (label index, probability) of the best label, None where fastText gives none (no token),
        or ``(-1, nan)`` where the result is too close to call (two labels, or a cutoff, within the margin,
        or a probability near the 1e-5 below which fastText returns nothing): the caller asks fastText."""
        logp, counts = self.scores(lines)
        out: list[tuple[int, float] | None] = [None] * len(lines)
        rows = np.flatnonzero(counts > 0)
        if not len(rows):
            return out
        sub = logp[rows]
        margin = np.maximum(MARGIN, PER_ROW * counts[rows])
        if sub.shape[1] > 1:
            two = np.argpartition(-sub, 1, axis=1)[:, :2]
            pair = np.take_along_axis(sub, two, axis=1)
            first = np.argmax(pair, axis=1)
            best = two[np.arange(len(rows)), first]
            s1 = pair[np.arange(len(rows)), first]
            close = (s1 - pair[np.arange(len(rows)), 1 - first]) < margin
        else:
            best = np.zeros(len(rows), dtype=np.int64)
            s1 = sub[:, 0]
            close = np.zeros(len(rows), dtype=bool)
        prob = np.exp(s1)
        for c in cutoffs:
            close |= np.abs(prob - c) < margin
        close |= s1 < np.log(1e-5) + margin
        for r, b, p, c in zip(rows.tolist(), best.tolist(), prob.tolist(), close.tolist(), strict=True):
            out[r] = (-1, float("nan")) if c else (b, p)
        return out
