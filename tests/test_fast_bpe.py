"""pipeline/fast/byte_level_bpe.py: the same token ids as HF ``tokenizers`` (encode_batch_fast), or HF itself."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
from tokenizers import Tokenizer, normalizers

from kernels import space_chunks
from pipeline.fast.byte_level_bpe import FastByteLevelBPE
from pipeline.spec import TokenizerSpec
from pipeline.tokenize import DocEncoder, TokenizerInfo, special_tokens, train_bpe

WORDS = ["the", "The", "tokenizer", "naïve", "café", "Straße", "Ωμέγα", "слово", "日本語", "中文字", "٣٤", "ß",
         "İstanbul", "ΣΊΣΥΦΟΣ", "x²", "½", "l'été", "don't", "we'll", "they're", "I'm", "it's", "you've", "he'd",
         "2024", "3.14",
         "-->", "==", "{}", "()", "\\n", "👍", "🇫🇷", "e\u0301", "\u200b", "<|endoftext|>", "<|endoftext", "'S", "'T"]
SPACES = [" ", "  ", "\t", "\n", "\n\n", "\r\n", " \n ", "   \t", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c", "\x1c",
          "\x85", ""]


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(SPACES) for _ in range(n))


@pytest.fixture(scope="module")
def texts() -> list[str]:
    rng = random.Random(7)
    out = [_text(rng, rng.randint(0, 400)) for _ in range(300)]
    # every ASCII character in many contexts, and characters newer than the Unicode of tokenizers' Oniguruma
    out.append("".join(f"a{chr(c)}b {chr(c)}{chr(c)} 1{chr(c)}2 " for c in range(128)))
    out += ["x\u0558y \u0558\u0558 z", "new letters: \U000107bb\U000107bc and \ua7ce", "", " ", "\n\n\n", "'s's'"]
    return out


@pytest.fixture(scope="module")
def tok(texts) -> Tokenizer:
    return train_bpe(texts * 3, 600, 2, special_tokens(TokenizerSpec()))


def _hf(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    tok.encode_special_tokens = True
    return [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)]


def test_same_ids_as_tokenizers(tok, texts):
    tok.encode_special_tokens = True
    assert FastByteLevelBPE.supports(tok)
    fast = FastByteLevelBPE(tok)
    got = fast.encode_batch(texts)
    assert [g.tolist() for g in got] == _hf(tok, texts)
    assert fast.fallback_docs == 2  # only the two texts with letters newer than Oniguruma's tables
    assert all(g.dtype == np.int32 for g in got)
    # a second pass runs from the cache of pre-tokens
    assert [g.tolist() for g in fast.encode_batch(texts)] == _hf(tok, texts)


def test_characters_whose_split_differs_go_through_tokenizers(tok):
    """U+0558 is a letter for `regex` but not for the Oniguruma inside tokenizers: HF decides."""
    tok.encode_special_tokens = True
    fast = FastByteLevelBPE(tok)
    assert fast.encode("ab\u0558cd") is None
    assert fast.encode("plain ascii, café") is not None
    assert [g.tolist() for g in fast.encode_batch(["ab\u0558cd", "ok"])] == _hf(tok, ["ab\u0558cd", "ok"])
    assert fast.fallback_docs == 1


def test_doc_encoder_fast_and_plain_agree(tok, texts):
    info = TokenizerInfo.resolve(tok, TokenizerSpec())
    fast, plain = DocEncoder(tok, info), DocEncoder(Tokenizer.from_str(tok.to_str()), info, fast=False)
    assert fast._fast is not None and plain._fast is None
    segments = [""] * len(texts)
    segments[3] = json.dumps([["Question: it's 2024?\n", False], ["Answer: don't  know", True]])
    for (a, am), (b, bm) in zip(fast.encode(texts, segments), plain.encode(texts, segments), strict=True):
        assert a.tolist() == b.tolist()
        assert (am is None and bm is None) or am.tolist() == bm.tolist()


@pytest.mark.parametrize("change", ["normalizer", "added_token", "prefix_space", "keep_specials"])
def test_other_tokenizers_are_left_to_tokenizers(tok, change):
    other = Tokenizer.from_str(tok.to_str())
    other.encode_special_tokens = True
    if change == "normalizer":
        other.normalizer = normalizers.NFKC()
    elif change == "added_token":
        other.add_tokens(["hello"])  # a plain added token is split out of the text by HF
    elif change == "prefix_space":
        cfg = json.loads(other.to_str())
        cfg["pre_tokenizer"]["add_prefix_space"] = True
        other = Tokenizer.from_str(json.dumps(cfg))
        other.encode_special_tokens = True
    else:
        other.encode_special_tokens = False  # "<|endoftext|>" in a text would become the special token
    assert not FastByteLevelBPE.supports(other)
    if change != "keep_specials":  # DocEncoder always encodes special tokens' text as text
        info = TokenizerInfo.resolve(other, TokenizerSpec())
        assert DocEncoder(other, info)._fast is None
        texts = ["hello world <|endoftext|> x", "café hello"]
        assert [x.tolist() for x, _ in DocEncoder(other, info).encode(texts, ["", ""])] == [
            [*ids, info.eos_id] for ids in _hf(other, texts)]


def test_a_full_cache_keeps_its_newer_half(tok, texts, monkeypatch):
    import pipeline.fast.byte_level_bpe as fb

    monkeypatch.setattr(fb, "MAX_CACHE", 50)
    monkeypatch.setattr(fb, "MAX_CHUNKS", 40)
    tok.encode_special_tokens = True
    fast = FastByteLevelBPE(tok)
    assert [g.tolist() for g in fast.encode_batch(texts)] == _hf(tok, texts)
    assert len(fast._ids) <= 50 and len(fast._chunks) <= 40


def test_chunk_boundaries_around_every_kind_of_space(tok, monkeypatch):
    """Texts cut into chunks at spaces: random mixes of spaces, other whitespace (some that Python and
    Oniguruma disagree on), letters, digits, punctuation and contractions, both ways of cutting
    (``str.split`` and the regex for texts with a space before whitespace or at the end)."""
    tok.encode_special_tokens = True
    texts = _spaced_texts()
    assert any(space_chunks._BAD_SPACE(t) is None and " " in t for t in texts)  # cut by str.split
    assert any(space_chunks._BAD_SPACE(t) is not None for t in texts)  # cut by the regex
    for cut in (space_chunks.space_chunks, space_chunks.space_chunks_py):
        monkeypatch.setattr("pipeline.fast.byte_level_bpe.space_chunks", cut)
        fast = FastByteLevelBPE(tok)
        assert [g.tolist() for g in fast.encode_batch(texts)] == _hf(tok, texts)
        assert len(fast._chunks) > 100


def _spaced_texts() -> list[str]:
    rng = random.Random(11)
    atoms = [" ", " ", " ", "  ", "\n", "\t", "\r\n", "\u00a0", "\u3000", "\x1c", "\x85", "\u2028", "a", "word", "Zz",
             "7", "42", ".", ",", "--", "'", "'s", "'ll", "é", "日本", "👍", "\u200b", "\U0001d400"]
    return ["".join(rng.choice(atoms) for _ in range(rng.randint(0, 30))) for _ in range(3000)] + ["", " ", "  x "]


def test_the_chunk_cut_in_c_equals_the_regex():
    """The C cut (kernels/text_native.c) against its Python twin, ``re.split(r" (?=\\S)", text)``, on every kind of
    space and width of character (1, 2 and 4 bytes a character, a lone surrogate)."""
    if not space_chunks.native():
        pytest.skip("the C extension is not built")
    texts = _spaced_texts() + ["a \ud800 b\ud800 ", "\ud800  \ud800"]
    assert [space_chunks.space_chunks(t) for t in texts] == [space_chunks.space_chunks_py(t) for t in texts]
    assert [space_chunks.space_chunks(t) for t in texts] == [re.split(r" (?=\S)", t) for t in texts]
    with pytest.raises(TypeError):
        space_chunks.space_chunks(b"a b")  # type: ignore[arg-type]


def test_the_checked_characters_scan_decides_as_the_character_sets(tok):
    """Texts with characters the last snapshot of checked ones lacks (new ones, a bad one, many of them over
    hundreds of texts, so the snapshot is renewed) get the same ids and the same HF fallbacks as before the scan."""
    tok.encode_special_tokens = True
    rng = random.Random(3)
    pool = [chr(c) for c in range(0xA1, 0x2FF)] + [chr(c) for c in range(0x400, 0x4FF)] + ["\u0558", "日", "👍"]
    texts = ["".join(rng.choice(pool) + rng.choice(" \n") for _ in range(rng.randint(0, 12))) for _ in range(700)]
    fast = FastByteLevelBPE(tok)
    assert [g.tolist() for g in fast.encode_batch(texts)] == _hf(tok, texts)
    assert fast.fallback_docs == sum("\u0558" in t for t in texts) > 0
