"""Heuristic quality filters (Gopher quality / repetition, C4, FineWeb): one keep/drop example per rule, other
languages, code, annotate mode, and the word splitting and n-gram statistics against their references."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pipeline.fast.word_chain import spacy_tokenizer
from pipeline.filters.c4 import C4Quality
from pipeline.filters.fineweb import FineWebQuality
from pipeline.filters.gopher import BatchNGrams, GopherQuality, GopherRepetition, NGrams
from pipeline.filters.text import normalize_lang, splitter
from pipeline.stages import stage_class
from pipeline.stages.base import StageContext, run_batch

CTX = StageContext("t", "", 0, "")

PROSE = """The old mill stood at the bend of the river, where the water ran fast over smooth stones.
Farmers brought their grain there each autumn, and the miller weighed every sack with great care.
His daughter kept the accounts in a small book that she carried with her to the market on Fridays.
In the spring of that year a flood reached the lower floor and spoiled most of the stored flour.
The village decided to rebuild the wheel with oak from the northern forest, which took two months.
Children watched the carpenters work and learned the names of tools that they had never seen before.
When the wheel turned again, people gathered on the bridge to celebrate with bread, cheese and cider."""

GERMAN = """Die alte Mühle stand an der Biegung des Flusses, wo das Wasser schnell über glatte Steine lief.
Die Bauern brachten jeden Herbst ihr Getreide dorthin, und der Müller wog jeden Sack mit großer Sorgfalt.
Seine Tochter führte die Bücher in einem kleinen Heft, das sie freitags mit auf den Markt nahm.
Im Frühling jenes Jahres erreichte eine Flut das untere Stockwerk und verdarb das gelagerte Mehl.
Das Dorf beschloss, das Rad mit Eichenholz aus dem nördlichen Wald neu zu bauen, was zwei Monate dauerte.
Die Kinder sahen den Zimmerleuten zu und lernten die Namen von Werkzeugen, die sie nie gesehen hatten."""

CHINESE = ("这是一个关于河边磨坊的故事。农民们每年秋天都把粮食送到那里，磨坊主会仔细地称每一袋。"
           "他的女儿在一个小本子上记账，每个星期五她都带着本子去市场。那年春天的洪水淹没了下层，"
           "储存的面粉大部分都坏了。村里决定用北方森林的橡木重建水车，这花了两个月的时间。")

JAPANESE = ("川の曲がり角に古い水車小屋がありました。農家の人たちは毎年秋に穀物をそこへ運び、"
            "粉屋は袋を一つずつ丁寧に量りました。娘は小さな帳面に記録をつけて、金曜日には市場へ持って行きました。"
            "その年の春に洪水が下の階に達し、蓄えていた小麦粉のほとんどが駄目になりました。")

CODE = '''import json
from pathlib import Path


class Store:
    def __init__(self, root: str, *, mode: int = 0o644) -> None:
        self.root = Path(root)
        self.mode = mode
        self.cache: dict[str, dict] = {}

    def get(self, key: str) -> dict | None:
        if key not in self.cache:
            file = self.root / f"{key}.json"
            self.cache[key] = load(str(file)) if file.exists() else None
        return self.cache[key]


def load(path: str) -> dict:
    """Read a JSON file."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save(obj: dict, path: str) -> None:
    Path(path).write_text(json.dumps(obj, indent=2))


if __name__ == "__main__":
    data = load("in.json")
    data["count"] = len(data.get("items", []))
    save(data, "out.json")
'''

JS = "function add(a, b) {\n  return a + b; // the sum of the two values is returned to the caller.\n}\n"


def docs(*texts: str, lang: str | None = None) -> list[dict]:
    return [{"id": str(i), "text": t, "meta": {"lang": lang} if lang else {}} for i, t in enumerate(texts)]


def run(cls, *texts: str, lang: str | None = None, **params):
    return run_batch(cls(cls.Params(**params), CTX), docs(*texts, lang=lang))


def reason(cls, text: str, lang: str | None = None, **params) -> str | None:
    """None when kept, else the rule (the part after ``stage:``)."""
    out = run(cls, text, lang=lang, **params)
    return out.drops[0].reason.split(":", 1)[1] if out.drops else None


def unique_words(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(4, 8))) + str(i) for i in range(n)]


def test_registry_names_resolve():
    assert stage_class("gopher_quality") is GopherQuality
    assert stage_class("gopher_repetition") is GopherRepetition
    assert stage_class("c4") is C4Quality
    assert stage_class("fineweb") is FineWebQuality


# ---------------------------------------------------------------- words


def test_words_equal_spacy_on_the_whole_text():
    """Cached, batched chunks give spaCy's own tokens (contractions, URLs, abbreviations, emoticons)."""
    text = ("Don't panic: e.g. the U.S. office (est. 1999) said \"it's fine\"... see https://example.org/a?b=1 "
            "or mail me@example.com :) -- costs $5.99/month, 10km away; rock'n'roll! #tag @user 3x4 x=1+2\n"
            "gonna cannot Dont 'quoted' [1] {braces} <html> a/b co-operate 5th...")
    tok = spacy_tokenizer("en")[0]
    expected = [t.text for t in tok(text) if t.text.strip()]
    s = splitter("en")
    assert s.words(text) == expected
    assert s.words(text + " Don't") == expected + ["Do", "n't"]  # from the cache
    assert s.count(text + " :) x") == len(expected) + 2  # not split before: counted from the cache, not memoized
    assert s.count(text) == len(expected)  # memoized by words()


def test_sentences_equal_spacy_sentencizer():
    from spacy.pipeline import Sentencizer

    tok = spacy_tokenizer("en")[0]
    sentencizer = Sentencizer()
    lines = ["One. Two! Three?", "Dr. Smith arrived at 5 p.m. and left.", "No end mark here", "Wait... what?!",
             "He said \"stop.\" Then he left.", "A .  . B", "Tabs.\tAnd more.", "x"]
    s = splitter("en")
    counts = [len(list(sentencizer(tok(line)).sents)) for line in lines]
    for line, n in zip(lines, counts, strict=True):
        assert s.sentences([line]) == n, line
    assert s.sentences(lines) == sum(counts)


def test_sentences_equal_spacy_sentencizer_on_generated_lines():
    """Chunks of every kind spaCy's rules treat apart, joined by runs of whitespace (one space, two, tabs, no-break
    spaces: each run but a single space is a token of its own), counted line by line and in one call."""
    import spacy
    from spacy.pipeline import Sentencizer

    tok = spacy.blank("en").tokenizer  # with the language's lexeme attributes: is_punct as the sentencizer sees it
    sentencizer = Sentencizer()
    rng = random.Random(3)
    chunks = _adversarial_chunks(600, seed=5) + ["Hi.", "there", "?!", "...", "end.", "(x).", "Mr.", "x"]
    spaces = [" ", " ", " ", "  ", "\t", " \u00a0 ", "\u3000"]
    lines = []
    for _ in range(400):
        parts = [rng.choice(chunks) for _ in range(rng.randint(1, 12))]
        line = "".join(p + rng.choice(spaces) for p in parts)
        lines.append(line if rng.random() < 0.3 else line.strip())
    s = splitter("en")
    counts = [len(list(sentencizer(tok(line)).sents)) for line in lines]
    assert [s.sentences([line]) for line in lines] == counts
    assert s.sentences(lines) == sum(counts)


def test_language_codes():
    assert normalize_lang("__label__de") == "de"
    assert normalize_lang("eng_Latn") == "en"
    assert normalize_lang("zh-Hans") == "zh"
    assert normalize_lang(None) == "en"
    assert splitter("zh").words("你好，世界 ok") == ["你", "好", "，", "世", "界", "ok"]


# ---------------------------------------------------------------- Gopher quality


def test_gopher_quality_keeps_prose():
    out = run(GopherQuality, PROSE)
    assert len(out.kept) == 1 and not out.drops


@pytest.mark.parametrize(
    ("text", "params", "rule"),
    [
        ("The cat sat with the dog.", {}, "min_words"),
        (PROSE, {"max_words": 20}, "max_words"),
        (" ".join(["it is to be or not to be and so on, as we go up"] * 8), {}, "min_avg_word_length"),
        (" ".join(["the internationalization and characterization of telecommunications"] * 10), {},
         "max_avg_word_length"),
        (PROSE + " #news" * 20, {}, "symbol_word_ratio"),
        (PROSE.replace(".", "...") + " ..." * 15, {"max_ellipsis_lines_ratio": None}, "symbol_word_ratio"),
        ("\n".join(f"- the item {w} comes with a handle and a box" for w in unique_words(12)), {},
         "bullet_lines_ratio"),
        ("\n".join(line.rstrip(".") + " and so on and on ..." if i % 2 else line
                   for i, line in enumerate(PROSE.splitlines())), {}, "ellipsis_lines_ratio"),
        (PROSE + " " + " ".join(str(i) for i in range(60)), {}, "alpha_words_ratio"),
        (" ".join(w.capitalize() for w in unique_words(70)) + ".", {}, "stop_words"),
    ],
)
def test_gopher_quality_rules(text, params, rule):
    assert reason(GopherQuality, text, **params) == rule


def test_gopher_quality_scores_and_thresholds():
    (drop,) = run(GopherQuality, "The cat sat with the dog.").drops
    assert drop.reason == "gopher_quality:min_words"
    assert drop.detail["scores"] == {"words": 6}  # filter mode stops at the first failing rule
    (doc,) = run(GopherQuality, PROSE, mode="annotate").kept
    scores = doc["meta"]["filters"]["gopher_quality"]["scores"]
    assert {"words", "avg_word_length", "alpha_words_ratio", "stop_words", "bullet_lines_ratio"} <= set(scores)
    assert scores["stop_words"] == 6  # the, of, and, with, to, that
    assert reason(GopherQuality, PROSE, min_stop_words=7) == "stop_words"


def test_gopher_quality_languages():
    assert reason(GopherQuality, GERMAN, lang="de") is None
    assert reason(GopherQuality, GERMAN) == "stop_words"  # no meta.lang: English stop words
    assert reason(GopherQuality, GERMAN, lang="en") == "stop_words"
    assert reason(GopherQuality, GERMAN, lang="de", stop_words={"de": ["Quatsch", "Unsinn"]}) == "stop_words"
    # characters are words in Chinese/Japanese: enough words, word length not judged, particles as stop words
    assert reason(GopherQuality, CHINESE, lang="zh") is None
    assert reason(GopherQuality, JAPANESE, lang="ja") is None
    assert reason(GopherQuality, CHINESE, lang="en") == "min_words"  # spaCy's English rules: a few long "words"
    (doc,) = run(GopherQuality, CHINESE, lang="zh", mode="annotate").kept
    assert doc["meta"]["filters"]["gopher_quality"]["scores"]["avg_word_length"] == 1.0


def test_gopher_quality_drops_code():
    assert reason(GopherQuality, CODE) == "alpha_words_ratio"


# ---------------------------------------------------------------- Gopher repetition


def test_gopher_repetition_keeps_prose_and_code():
    out = run_batch(GopherRepetition(GopherRepetition.Params(), CTX),
                    docs(PROSE, CODE, GERMAN) + docs(CHINESE, lang="zh"))
    assert len(out.kept) == 4


def _dup_lines() -> str:
    lines = [" ".join(unique_words(6, seed=i)) for i in range(10)]
    return "\n".join(lines + lines[:5])


@pytest.mark.parametrize(
    ("text", "params", "rule"),
    [
        ("\n\n".join([PROSE, GERMAN, PROSE, PROSE]), {}, "dup_para_ratio"),
        ("\n\n".join([PROSE] + [" ".join(unique_words(3, seed=i)) for i in range(5)] + [PROSE]), {},
         "dup_para_char_ratio"),
        (_dup_lines(), {}, "dup_line_ratio"),
        ("\n".join([PROSE.splitlines()[0]] * 3 + [" ".join(unique_words(3, seed=i)) for i in range(8)]), {},
         "dup_line_char_ratio"),
        (" ".join(f"the cat {w}." for w in unique_words(40)), {}, "top_2gram_char_ratio"),
        (" ".join(" ".join(unique_words(4, seed=i)) + " big red fox" for i in range(20)), {},
         "top_3gram_char_ratio"),
        (" ".join(unique_words(60) + unique_words(12, seed=7) * 3), {}, "dup_5gram_char_ratio"),
    ],
)
def test_gopher_repetition_rules(text, params, rule):
    assert reason(GopherRepetition, text, **params) == rule


def test_gopher_repetition_thresholds_from_yaml_keys():
    params = GopherRepetition.Params(top_ngram_char_ratio={"2": 0.9}, dup_ngram_char_ratio={})
    assert params.top_ngram_char_ratio == {2: 0.9}
    text = " ".join(f"the cat {w}." for w in unique_words(40))
    assert not run_batch(GopherRepetition(params, CTX), docs(text)).drops


def _top_reference(words: list[str], n: int) -> int:
    """datatrove's find_top_duplicate on " ".join n-grams."""
    grams = [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
    top, count = Counter(grams).most_common(1)[0]
    return len(top) * count


def _dup_reference(words: list[str], n: int) -> int:
    """datatrove's find_all_duplicate: greedy scan, a repeated n-gram is skipped whole."""
    seen, total, i = set(), 0, 0
    while i < len(words) - n + 1:
        gram = tuple(words[i : i + n])
        if gram in seen:
            total += sum(map(len, gram))
            i += n
        else:
            seen.add(gram)
            i += 1
    return total


def test_ngram_statistics_equal_the_reference():
    rng = random.Random(3)
    for trial in range(40):
        vocab = unique_words(rng.randint(2, 12), seed=trial)
        words = [rng.choice(vocab) for _ in range(rng.randint(1, 300))]
        if trial % 4 == 0:
            words = words[:20] * 5  # long repeats: the scan must skip them whole
        grams = NGrams(words)
        for n in range(2, 11):
            if len(words) >= n:
                assert grams.top_chars(n) == _top_reference(words, n), (trial, n)
            assert grams.dup_chars(n) == _dup_reference(words, n), (trial, n)
        again = NGrams(words)  # asked in any order: a smaller n after a larger one starts over
        for n in (7, 3, 9, 2, 5):
            assert again.dup_chars(n) == _dup_reference(words, n), (trial, n)
            if len(words) >= n:
                assert again.top_chars(n) == _top_reference(words, n), (trial, n)



def test_a_batchs_ngram_statistics_are_each_documents_own():
    """One BatchNGrams over many documents (words shared between them, empty and one-word documents among them)
    counts every document as if it were alone: no n-gram crosses or repeats across a document boundary."""
    rng = random.Random(11)
    vocab = unique_words(6, seed=99)
    docs = []
    for trial in range(60):
        words = [rng.choice(vocab) for _ in range(rng.choice([0, 1, 3, 9, rng.randint(10, 200)]))]
        if trial % 5 == 0:
            words = words[:15] * 4
        docs.append(words)
    docs.append(docs[7][:])  # the same words as another document: still counted apart
    batch = BatchNGrams(docs)
    for n in (10, 2, 5, 3, 9, 4, 6, 7, 8):  # levels are computed once, in any order of asking
        for d, words in enumerate(docs):
            grams = batch.doc(d)
            if len(words) >= n:
                assert grams.top_chars(n) == _top_reference(words, n), (d, n)
            assert grams.dup_chars(n) == _dup_reference(words, n), (d, n)


def test_repetition_gives_the_same_verdicts_per_batch_and_per_document(monkeypatch):
    rng = random.Random(12)
    vocab = unique_words(40, seed=5)
    texts = []
    for i in range(80):
        words = [rng.choice(vocab) for _ in range(rng.randint(20, 300))]
        if i % 3 == 0:
            words = words[:25] * rng.randint(2, 5)
        texts.append(" ".join(words))
    texts += ["", "one", PROSE]
    for mode, words in (("filter", None), ("annotate", None), ("filter", 400)):
        if words:  # documents counted in runs of at most 400 words (each alone when longer)
            monkeypatch.setattr("pipeline.filters.gopher.BATCH_WORDS", words)
        stage = GopherRepetition(GopherRepetition.Params(mode=mode), CTX)
        one = [stage.verdict(stage.filter({"id": i, "text": t, "meta": {}})) for i, t in enumerate(texts)]
        res = run_batch(stage, [{"id": i, "text": t, "meta": {}} for i, t in enumerate(texts)])
        if mode == "filter":
            dropped = {d.doc["id"]: (d.reason, d.detail.get("scores", {})) for d in res.drops}
            assert {i: (v.reason, v.scores) for i, v in enumerate(one) if not v.keep} == dropped
            assert {d["id"] for d in res.kept} == {i for i, v in enumerate(one) if v.keep}
            assert 0 < len(dropped) < len(texts)
        else:
            got = [d["meta"]["filters"]["gopher_repetition"] for d in res.kept]
            assert [(g["keep"], g["reason"], g["scores"]) for g in got] == [(v.keep, v.reason, v.scores) for v in one]


# ---------------------------------------------------------------- C4


def test_c4_cleans_lines_and_counts_them():
    text = "\n".join([
        "Menu Home About",
        PROSE.splitlines()[0],
        "Please enable JavaScript to view the comments powered by the site.",
        "By using this site you agree to our terms of use and the privacy policy.",
        PROSE.splitlines()[1] + "[1]",
        "Short line here.",
        PROSE.splitlines()[2],
        "And it goes on and on and on...",
    ])
    res = run_batch(C4Quality(C4Quality.Params(), CTX), docs(text))
    (doc,) = res.kept
    assert doc["text"] == "\n".join(PROSE.splitlines()[:3])  # citation mark cut out
    assert res.metrics.counters["lines_removed"] == 5
    assert res.metrics.counters["lines_removed:javascript"] == 1
    assert res.metrics.counters["lines_removed:policy"] == 1
    assert res.metrics.counters["lines_removed:no_terminal_punct"] == 2
    assert res.metrics.counters["lines_removed:too_few_words"] == 1


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        (PROSE + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit.", "lorem_ipsum"),
        (PROSE + "\n" + JS.replace("{\n", "{ return the sum of a and b to the caller.\n"), "curly_bracket"),
        ("One short sentence with enough words.\nAnd another one with enough words.", "too_few_sentences"),
        (CODE, "curly_bracket"),  # f"{key}.json" ends in a quote: the line survives to the bracket test
    ],
)
def test_c4_document_rules(text, rule):
    assert reason(C4Quality, text) == rule


def test_c4_paper_defaults_differ_from_datatrove():
    text = "Yes, it works.\nIt really does.\nWe tested it.\nThey agreed too.\nAll good here."
    assert reason(C4Quality, text) == "too_few_sentences"  # paper: 5 words per line; every line is removed
    as_datatrove = {"min_words_per_line": 3, "min_num_sentences": 5, "end_marks": [".", "?", "!", '"', "'"]}
    (doc,) = run(C4Quality, text, **as_datatrove).kept
    assert doc["text"] == text
    assert reason(C4Quality, text, min_words_per_line=3) is None  # 5 sentences >= 3


def test_c4_bad_words(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("darn\nheck it\n", encoding="utf-8")
    assert reason(C4Quality, PROSE + "\nWell, heck it, the wheel was broken again today.", bad_words=str(path)) == \
        "bad_words"
    assert reason(C4Quality, PROSE + "\nThe darning needle lay on the table all day.", bad_words=str(path)) is None
    missing = C4Quality(C4Quality.Params(bad_words=str(tmp_path / "nope.txt")), CTX)
    with pytest.raises(ValueError, match="bad_words"):
        missing.preflight()


def test_c4_german_sentences():
    (doc,) = run(C4Quality, GERMAN, lang="de").kept
    assert doc["text"] == GERMAN


# ---------------------------------------------------------------- FineWeb


def test_fineweb_keeps_prose():
    assert not run(FineWebQuality, PROSE, GERMAN, CHINESE).drops


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("\n".join(f"{w} and {w} are listed in the catalogue" for w in unique_words(10)), "line_punct_ratio"),
        ("\n".join(f"Item {w}." for w in unique_words(10)), "short_line_ratio"),
        (PROSE + "\n" + PROSE.splitlines()[0], "char_dup_ratio"),
        ("\n".join(f"{a}{b}{a}{b}." for a, b in zip(unique_words(12), unique_words(12, 1), strict=True)),
         "list_ratio"),
        ("\n \n\t\n", "empty"),
    ],
)
def test_fineweb_rules(text, rule):
    assert reason(FineWebQuality, text) == rule


def test_fineweb_rule_disabled():
    text = "\n".join(f"{a}{b}{a}{b}." for a, b in zip(unique_words(12), unique_words(12, 1), strict=True))
    assert reason(FineWebQuality, text, max_newline_word_ratio=None) is None
    assert reason(FineWebQuality, CODE) == "line_punct_ratio"


# ---------------------------------------------------------------- annotate mode


def test_annotate_mode_drops_nothing_and_records_verdicts():
    texts = [PROSE, "Too short.", CODE, "\n\n".join([PROSE] * 3)]
    for cls in (GopherQuality, GopherRepetition, C4Quality, FineWebQuality):
        batch = docs(*texts)
        stage = cls(cls.Params(mode="annotate"), CTX)
        out = run_batch(stage, batch)
        assert not out.drops and len(out.kept) == len(texts)
        assert [d["text"] for d in out.kept] == texts  # C4 does not edit in annotate mode
        verdicts = [d["meta"]["filters"][stage.name] for d in out.kept]
        dropped = [v for v in verdicts if not v["keep"]]
        assert dropped, cls.name
        assert all(v["reason"].startswith(stage.name + ":") and v["scores"] for v in dropped)
        would = {k: v for k, v in out.metrics.counters.items() if k.startswith("would_drop:")}
        assert sum(would.values()) == len(dropped)
        filtered = run_batch(cls(cls.Params(), CTX), docs(*texts))
        assert [d.reason for d in filtered.drops] == [v["reason"] for v in verdicts if not v["keep"]]
    # annotate records every rule's score, not only up to the first failure
    (doc,) = run(GopherRepetition, "\n\n".join([PROSE] * 3), mode="annotate").kept
    scores = doc["meta"]["filters"]["gopher_repetition"]["scores"]
    assert scores["dup_para_ratio"] == pytest.approx(2 / 3) and "dup_10gram_char_ratio" in scores


# ---- the word splitter's affix fast path ---------------------------------------------------------------------

_AFFIX_CASES = [
    "word,", "word;", "word:", "word!", "word?", "word)", "(word", "word.", "Word.", "AB.", "A.", "xA.", "a.",
    "Straße,", "naïve.", "ÉCOLE.", "école.", "Ελλάδα,", "(Москва", "東京,", "cannot,", "(cannot", "Mr.", "etc.",
    "e.g.", "U.S.,", "gonna!", "dont?", "o'clock,", "(a)", "((word", "word),", "word.)", "x,", "(x", "ſ.", "ǅ.",
    "ﬁne.", "word\u0301,", "İstanbul.", "µ.", "LORD.", "AB.", "aB.", "XmL.", "ÉCOLE.", "ÆB.",
]


def _corpus_chunks(limit: int = 60_000) -> list[str]:
    """Distinct whitespace-separated chunks of ../shared/corpora text, where it exists (a fresh machine: none)."""
    from bench.common import CORPORA, iter_jsonl

    paths = sorted(CORPORA.glob("english/*.jsonl.gz")) + sorted(CORPORA.glob("web/*.jsonl.gz"))
    seen: dict[str, None] = {}
    for path in paths:
        for i, rec in enumerate(iter_jsonl(path)):
            for chunk in str(rec.get("text", "")).split():
                seen[chunk] = None
            if i >= 300 or len(seen) >= limit * (paths.index(path) + 1) // len(paths):
                break
    return list(seen)


@pytest.mark.parametrize("lang", ["en", "xx", "hi"])
def test_the_affix_fast_path_gives_spacys_tokens(lang):
    """Every chunk the word chain's ``one_mark`` route (pipeline.fast.word_chain) splits, spaCy splits the same
    way (its own tokenizer, asked directly)."""
    from pipeline.fast.word_chain import WordChain, one_mark

    s = WordChain(lang)
    assert s.base_affixes and "one_mark" in dict(s.routes)
    chunks = list(dict.fromkeys(_AFFIX_CASES + (_corpus_chunks() if lang == "en" else [])))
    fast = {c: one_mark(c, s.special) for c in chunks}
    taken = [c for c, split in fast.items() if split is not None]
    assert {c: fast[c] for c in taken} == dict(zip(taken, s.spacy_tokens(taken), strict=True))
    assert {"word,", "(word", "word.", "Straße,", "(Москва", "LORD.", "AB."} <= set(taken)
    assert not {"A.", "xA.", "U.S.,", "word),"} & set(taken)  # spaCy's own rules decide these
    if lang == "en":
        assert not {"cannot,", "Mr.", "(cannot"} & set(taken)  # English special cases


def _adversarial_chunks(n: int, seed: int) -> list[str]:
    """Chunks built from the pieces spaCy's affix rules look at: words, digits, units, quotes, dots, brackets."""
    rng = random.Random(seed)
    parts = ["word", "Word", "WORD", "A", "x", "12", "3.5", "km", "%", "$", "°C", ".", "..", "...", ".....", "…",
             ",", ";", ":", "!", "?", "'", "'s", "’s", '"', "“", "(", ")", "[", "]", "-", "--", "—", "+", "/", "#",
             "http://a.example/b", "e.g.", "can't", "n't", "über", "ÉCOLE", "Москва", "x86", "_", "*", "²", "&"]
    return list(dict.fromkeys("".join(rng.choice(parts) for _ in range(rng.randint(1, 6))) for _ in range(n)))


@pytest.mark.parametrize("lang", ["en", "xx", "de", "fr", "pl", "ru", "it"])
def test_affix_searches_return_what_spacys_regexes_return(lang):
    """prefix_matcher / suffix_searcher against spaCy's compiled regexes, match for match (start and end)."""
    from spacy.util import compile_prefix_regex, compile_suffix_regex, get_lang_class

    from pipeline.fast.affix_search import prefix_matcher, suffix_searcher

    d = get_lang_class(lang).Defaults
    pairs = [(prefix_matcher(d.prefixes), compile_prefix_regex(d.prefixes).search),
             (suffix_searcher(d.suffixes), compile_suffix_regex(d.suffixes).search)]
    chunks = _adversarial_chunks(6000, seed=len(lang)) + [c[i:] for c in _AFFIX_CASES for i in range(len(c))]
    for fast, reference in pairs:
        assert fast is not None  # every rule set here is anchored: the fast search is used
        for c in chunks:
            got, want = fast(c), reference(c)
            assert (got and got.span()) == (want and want.span()), (lang, c)


@pytest.mark.parametrize("lang", ["en", "de", "fr", "xx"])
def test_the_word_splitter_tokenizes_as_spacy_blank(lang):
    """Our tokenizer (fast affix searches, the affix fast path, the cache) against ``spacy.blank(lang)``, chunk
    by chunk (spaCy's special-span pass can join ``:`` ``(`` into the emoticon ``:(`` or not depending on the
    chunk before, a quirk no per-chunk cache can follow; it needs an emoticon glued to other punctuation)."""
    import spacy

    from pipeline.filters.text import CacheBudget, WordSplitter

    chunks = _adversarial_chunks(3000, seed=7) + _AFFIX_CASES
    s = WordSplitter(lang, budget=CacheBudget(500))  # small: the cache changes generation many times
    reference = spacy.blank(lang).tokenizer
    rng, fresh = random.Random(1), WordSplitter(lang)
    for i in range(0, len(chunks), 50):
        part = chunks[i : i + 50]
        want = [t.text for c in part for t in reference(c)]
        assert s.words(" ".join(part)) == want, part
        shuffled = rng.sample(part, len(part))  # asked in another order and company: the same tokens
        assert dict(zip(shuffled, fresh.chain.spacy_tokens(shuffled), strict=True)) == {
            c: tuple(t.text for t in reference(c)) for c in part}


def test_one_cache_budget_bounds_every_languages_caches_together():
    """Splitters of many languages under one budget hold at most about twice its entries between them (one call's
    chunks more), however much text of however many languages goes through, and split as splitters that never
    forget (none is turned over by another language's call while it reads its cache); the shared memo holds at
    most its words. Before, each language had a limit of its own and a worker's memory grew with every language
    it met."""
    from pipeline.filters.text import CacheBudget, WordMemo, WordSplitter

    budget, memo = CacheBudget(400), WordMemo(300)
    langs = ("en", "de", "xx", "pl")
    bounded = {lang: WordSplitter(lang, budget=budget, memo=memo) for lang in langs}
    never = CacheBudget(10**9)
    unbounded = {lang: WordSplitter(lang, budget=never, memo=WordMemo(0)) for lang in langs}
    rng = random.Random(5)
    chunks = _adversarial_chunks(4000, seed=11)
    most = 0
    for i in range(300):
        lang = langs[i % len(langs)]
        text = " ".join(rng.choice(chunks) for _ in range(rng.randint(5, 40)))
        words = bounded[lang].words(text)
        assert words == unbounded[lang].words(text), text
        assert bounded[lang].words(text) is words  # the memo's hit
        held = sum(len(s._cache) + len(s._old) for s in bounded.values())
        most = max(most, held)
        assert held <= 2 * (400 + 40), (i, held)
        assert memo._words <= 300 or len(memo._memo) == 1
    assert budget.generation >= 5 and most > 400  # the bound was reached, and generations turned over


def test_languages_with_their_own_affix_rules_always_ask_spacy():
    from pipeline.fast.word_chain import WordChain

    for lang in ("de", "fr", "ja"):
        chain = WordChain(lang)
        assert not chain.base_affixes and "one_mark" not in dict(chain.routes)


def test_the_word_chain_runs_its_declared_routes_in_order():
    """The chain is the declared ROUTES, in order, with the routes that do not apply to a language left out; the
    first route that answers a chunk gives its tokens, and spaCy gets only what every route stepped aside for."""
    from pipeline.fast.word_chain import ROUTES, WordChain

    assert [r.name for r in ROUTES] == ["plain", "one_mark", "chunk_rules"]
    assert all(r.steps_aside for r in ROUTES)
    en = WordChain("en")
    assert [name for name, _ in en.routes] == ["plain", "one_mark", "chunk_rules"]
    assert [name for name, _ in WordChain("de").routes] == ["plain", "chunk_rules"]
    split = dict(en.routes)
    assert split["plain"]("word") == ("word",) and split["plain"]("cannot") is None  # a special case steps aside
    assert split["one_mark"]("word,") == ("word", ",") and split["one_mark"]("x:(") is None
    assert en.split("x:(") is None  # every route steps aside: spaCy's matcher decides

    class Counting(WordChain):
        asked: list[list[str]] = []

        def spacy_tokens(self, chunks):
            self.asked.append(list(chunks))
            return super().spacy_tokens(chunks)

    chunks = ["word", "word,", "(e.g.,", "x:("]
    counting = Counting("en")
    found = counting.tokens(chunks, {})
    assert counting.asked == [["x:("]]
    assert found == dict(zip(chunks, en.spacy_tokens(chunks), strict=True))


_CODE_CHUNKS = [
    "https://developer.mozilla.org/en-US/docs/Web/API", "[#27376](https://github.com/nodejs/node/pull/27376)",
    "Path(fname).read_text(encoding=\"utf-8\")", "kwargs['keepdims'],", "dtype=self._dtype)", ":func:`repr()`,",
    "``d.popitem()``", "rf\"|(\\\\[0-7]{3}|\\\\0)\"", "alice@company.com:", "$modname_bits)", "#3)", "1,234.56",
    "10km", "5$", "x:(", "word:)", ":-)", "(:", "a.m.,", "(e.g.,", "don't.", "Fried's", "’s", "--flag=value",
    "C++", "3+4", "a/b/c", "x86_64", "__init__.py", "e-mail", "well-known.", "Dr.", "U.K.", "i.e.", "<3", "^_^",
    "Bill's", "culture's", "doesn't!*", "'six',", "'Text", "Gettin'", "(can't)", "won't.", "y'all,", ":)", ":)x",
]


@pytest.mark.parametrize("lang", ["en", "de", "fr", "ru", "pl", "it", "es", "xx"])
def test_the_rules_port_gives_spacys_tokens_or_steps_aside(lang):
    """pipeline.fast.spacy_rules.ChunkRules (spaCy's affix and infix algorithm in Python) gives spaCy's own tokens
    for every chunk it answers, and steps aside (None) where spaCy's special-case matcher could join tokens."""
    from pipeline.fast.word_chain import WordChain

    s = WordChain(lang)
    chunks = list(dict.fromkeys(_AFFIX_CASES + _CODE_CHUNKS + _adversarial_chunks(4000, seed=13)
                                + (_corpus_chunks(20_000) if lang in ("en", "de") else [])))
    ours = {c: s.rules.split(c) for c in chunks}
    answered = [c for c, split in ours.items() if split is not None]
    assert {c: ours[c] for c in answered} == dict(zip(answered, s.spacy_tokens(answered), strict=True))
    assert len(answered) >= 0.7 * len(chunks)  # the port, not spaCy, answers most (~90% of real chunks)
    assert ours["x:("] is None and ours["word:)"] is None  # an emoticon after a word: spaCy's matcher decides
    if lang == "en":  # special cases the matcher would find but not change (``'s``, ``does`` ``n't``): answered
        assert all(ours[c] is not None for c in ("Bill's", "culture's", "doesn't!*", "(can't)", "won't."))


def test_gopher_quality_word_sums_in_c_equal_python(monkeypatch):
    """The C kernel's sums (kernels/text_native.c) against the Python reference and the filter's own Python path
    (cached codes), on tokens of letters, digits, datatrove's symbols, marks, non-BMP characters and mixes."""
    from kernels import word_classes
    from pipeline.filters.text import symbol_chars

    symbols = symbol_chars()
    rng = random.Random(7)
    alphabet = ["a", "Z", "é", "ß", "Ж", "中", "ー", "7", "٣", "_", "#", ".", "…", "!", "—", "“", "\x07", "\u0301",
                "\U0001F600", "\U00010400", "%", "¿", "।", "՝", "‽"]
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(5000)]
    want = word_classes.word_sums_py(words, symbols)
    assert want[0] < len(words) and want[2] < len(words)  # some symbol-only, some letter-less tokens
    stage = GopherQuality(GopherQuality.Params(), StageContext("t", "/tmp", 0, "/tmp"))
    if word_classes.native():
        assert word_classes.word_sums(words, word_classes.symbol_bitmap(symbols)) == want
        assert stage._word_sums(words) == want
    monkeypatch.setattr(word_classes, "native", lambda: False)  # the filter's Python path: cached codes
    assert stage._word_sums(words) == want
    assert stage._word_sums(words[:100]) == word_classes.word_sums_py(words[:100], symbols)


def test_words_many_in_c_equal_words_one_by_one():
    """The batch path (kernels/text_native.c: str.split() of many texts, chunks numbered across them, word lists
    built from the cache's tuples) against the Python path, on text with every whitespace str.split() knows."""
    from kernels import text_chunks
    from pipeline.filters.text import CacheBudget, WordMemo, WordSplitter

    rng = random.Random(11)
    spaces = [" ", "  ", "\n", "\t", "\x0b", "\x1c", "\x85", "\xa0", "\u1680", "\u2003", "\u2028", "\u202f", "\u3000"]
    pieces = ["the", "cat's", "(see", "U.S.", "e-mail", "x@y.org", "10,000", "ü", "Ж", "中文", "\U0001F600", ":)",
              "don't", "https://a.b/c?d=e", "a\u0301", "!!", "—", "..."]
    texts = ["", " ", "\u3000\n", "one"] + [
        "".join(rng.choice(pieces) + rng.choice(spaces) for _ in range(rng.randint(0, 60))) for _ in range(300)
    ]
    texts += texts[:50]  # repeated texts: the memo's path
    distinct, ids, ends = text_chunks.split_texts(texts)
    want = text_chunks.split_texts_py(texts)
    assert distinct == want[0] and ids.tolist() == want[1].tolist() and ends.tolist() == want[2].tolist()
    parts = [tuple(c) for c in distinct]  # any tuples: the assembly alone
    assert text_chunks.assemble(parts, ids, ends) == text_chunks.assemble_py(parts, ids, ends)
    for lang in ("en", "de", "zh"):  # each side its own cache and memo: neither reads the other's answers
        fresh = WordSplitter(lang, CacheBudget(10**6), WordMemo(10**6)).words_many(texts)
        one_by_one = WordSplitter(lang, CacheBudget(10**6), WordMemo(10**6))
        assert fresh == [one_by_one.words(t) for t in texts]
        assert [t.split() == [] for t in texts] == [w == [] for w in fresh]
