"""Best-fit and concat packing: boundaries, utilization, cuts, masks, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.packing import BestFitPacker, ConcatPacker, pack_all


def _docs(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [(f"d{i}", rng.integers(3, 1000, n).astype(np.int32), None) for i, n in enumerate(lengths)]


def _reassemble(seqs):
    pieces: dict[str, list[np.ndarray]] = {}
    for s in seqs:
        for p in s.pieces:
            pieces.setdefault(p.doc_id, []).append(p.ids)
    return {k: np.concatenate(v) for k, v in pieces.items()}


@pytest.mark.parametrize("method", ["best_fit", "concat"])
def test_every_token_lands_once_in_order(method):
    rng = np.random.default_rng(1)
    docs = _docs(rng.integers(1, 700, 500))
    seqs, stats = pack_all(docs, method, seq_len=256)
    assert all(0 < s.tokens <= 256 for s in seqs)
    back = _reassemble(seqs)
    assert set(back) == {d for d, _, _ in docs}
    for doc_id, ids, _ in docs:
        np.testing.assert_array_equal(back[doc_id], ids)
    assert stats.tokens == sum(len(ids) for _, ids, _ in docs)
    assert stats.sequences == len(seqs)


def test_best_fit_fills_better_and_cuts_less_than_concat():
    rng = np.random.default_rng(2)
    lengths = np.minimum(rng.lognormal(5.0, 1.0, 3000).astype(int) + 1, 4000)
    docs = _docs(lengths)
    _, bf = pack_all(docs, "best_fit", seq_len=512)
    _, cc = pack_all(docs, "concat", seq_len=512)
    assert bf.utilization >= 0.99
    assert bf.docs_cut < cc.docs_cut
    # best-fit cuts only the documents longer than a sequence
    assert bf.docs_cut == int((lengths > 512).sum())


def test_long_document_is_split_and_exact_fit_not_cut():
    p = BestFitPacker(seq_len=100)
    out = list(p.add("long", np.arange(250, dtype=np.int32)))
    assert [s.tokens for s in out] == [100, 100]
    out += list(p.add("exact", np.arange(100, dtype=np.int32)))
    assert out[-1].tokens == 100 and out[-1].pieces[0].doc_id == "exact"
    out += list(p.flush())
    assert p.stats.docs_cut == 1
    assert [s.tokens for s in out] == [100, 100, 100, 50]


def test_doc_lens_and_mask_arrays():
    p = BestFitPacker(seq_len=10)
    seqs = list(p.add("a", np.arange(4, dtype=np.int32), np.array([0, 0, 1, 1], np.uint8)))
    seqs += list(p.add("b", np.arange(6, dtype=np.int32)))
    assert len(seqs) == 1
    ids, lens, mask = seqs[0].arrays(np.dtype(np.uint16))
    assert ids.dtype == np.uint16 and lens.tolist() == [4, 6]
    assert mask.tolist() == [0, 0, 1, 1] + [1] * 6


def test_max_open_bounds_memory_and_stays_deterministic():
    docs = _docs(np.random.default_rng(3).integers(1, 300, 2000))
    a, _ = pack_all(docs, "best_fit", seq_len=512, max_open=8)
    b, _ = pack_all(docs, "best_fit", seq_len=512, max_open=8)
    assert [[p.doc_id for p in s.pieces] for s in a] == [[p.doc_id for p in s.pieces] for s in b]
    packer = BestFitPacker(seq_len=512, max_open=8)
    for doc_id, ids, _ in docs:
        list(packer.add(doc_id, ids))
        assert len(packer._open) <= 8


def test_concat_counts_cut_documents():
    p = ConcatPacker(seq_len=10)
    seqs = []
    for i, n in enumerate([6, 6, 8]):
        seqs += list(p.add(f"d{i}", np.arange(n, dtype=np.int32)))
    seqs += list(p.flush())
    assert [s.tokens for s in seqs] == [10, 10]
    assert p.stats.docs_cut == 1  # d1 crosses the first boundary; d2 ends exactly at the second


# ---- the order range tasks are launched in (pipeline/job/write.schedule_order) ------------------------------

def _parts(*sizes: tuple[int, int]) -> list:
    """Part records of (rows, text bytes), in corpus order."""
    from pipeline.output.curated import Part

    return [Part(f"p{i}", rows, i << 40, size) for i, (rows, size) in enumerate(sizes)]


def test_schedule_order_starts_the_range_of_long_documents_first():
    from pipeline.job.write import range_bounds, schedule_order

    # 5 ranges of 100 documents; the 4th holds documents 100x longer than the others
    parts = _parts((300, 300_000), (100, 10_000_000), (100, 100_000))
    bounds = range_bounds(500, 100)
    assert schedule_order(list(range(5)), bounds, parts) == [3, 0, 1, 2, 4]
    # a resumed job schedules only what is left, in the same order
    assert schedule_order([0, 2, 3], bounds, parts) == [3, 0, 2]


def test_schedule_order_keeps_index_order_on_an_even_corpus():
    from pipeline.job.write import range_bounds, schedule_order

    parts = _parts((250, 250_000), (250, 260_000), (3, 3_000))
    bounds = range_bounds(500, 100)  # ranges straddle parts; sizes differ by a few percent
    assert schedule_order(list(range(5)), bounds, parts) == [0, 1, 2, 3, 4]
    assert schedule_order([], bounds, parts) == []
    # sizes on both sides of a power of two (15 and 17 KB a range), up to 3x apart: still index order
    parts = _parts((100, 15_000), (100, 17_000), (100, 45_000), (100, 16_000))
    assert schedule_order(list(range(4)), range_bounds(400, 100), parts) == [0, 1, 2, 3]
