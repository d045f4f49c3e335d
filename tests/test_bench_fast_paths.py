"""``bench/fast_paths.py`` on generated text (the shared corpora may be absent): both fast paths give the
libraries' answers, as the bench reports them."""

from __future__ import annotations

from bench import fast_paths
from tests.test_filters_heuristic import _CODE_CHUNKS, _adversarial_chunks
from tests.test_lid import adversarial_texts


def test_the_bench_finds_no_difference_on_generated_text():
    texts = adversarial_texts(300, seed=21) + [" ".join(_adversarial_chunks(400, seed=3)), " ".join(_CODE_CHUNKS)]
    lid = fast_paths.bench_lid(texts)
    assert lid["docs"] == len(texts) and lid["label_diffs"] == 0 and lid["decision_diffs"] == 0
    assert lid["max_prob_diff"] < 1e-3 and lid["ratio"] > 0
    words = fast_paths.bench_words(texts, 2000, ["en", "de"])
    assert set(words) == {"en", "de"}
    for w in words.values():
        assert w["chunks"] > 200 and w["diffs"] == 0 and w["left_to_spacy"] < 0.3
