"""The fast paths: code that must give exactly what an outside library (or a slower twin of ours) gives, cheaper.

Every fast path is declared in :data:`FAST_PATHS`: the module it lives in, what it must equal (the library and its
version pin as ``pyproject.toml`` states it, and the name it is compared with), its fallback, when it steps aside
for that fallback, its difference test and its bench. ``tests/test_fast_registry.py`` checks each entry against
the installed packages and the source tree; ``docs/fast-paths.md`` is the same list for a reader.

Where they live: the pure-Python and NumPy fast paths that stand in for a library are modules of this package;
the C and NumPy primitives they and the stages build on stay in ``kernels/`` (the data flows pipeline -> kernels,
and kernels imports nothing of ours), declared here all the same.

This module imports nothing else: reading the registry costs nothing, and no fast path is loaded by it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    """What a fast path must equal: ``entry`` (``module:qualname``), from the distribution ``library`` pinned as
    ``pin`` in ``pyproject.toml``; ``library`` None for a C kernel whose reference is its own Python twin."""

    entry: str
    library: str | None = None
    pin: str = ""


@dataclass(frozen=True)
class FastPath:
    """One fast path: where it is, what it must equal, what runs instead and when, and what proves it."""

    name: str
    #: the module holding it (dotted)
    module: str
    equals: Reference
    #: what runs where it steps aside (``module:qualname``)
    fallback: str
    #: when the fallback runs instead
    steps_aside: str
    #: the test comparing it with its reference (a path from the repository's root)
    test: str
    #: the bench that reports its differences and its speed against the reference, if any
    bench: str | None = None


SPACY = "spacy"
#: when a C kernel steps aside for its Python twin
NO_C_EXTENSION = "the C extension kernels._text_native is not built (no compiler at install time)"
SPACY_PIN = ">=3.8,<3.9"

#: every fast path of the product
FAST_PATHS: tuple[FastPath, ...] = (
    FastPath(
        name="word_chain",
        module="pipeline.fast.word_chain",
        equals=Reference("spacy.tokenizer:Tokenizer", SPACY, SPACY_PIN),
        fallback="pipeline.fast.word_chain:WordChain.spacy_tokens",
        steps_aside="per chunk, route by route (pipeline.fast.word_chain.ROUTES): spaCy gets what every route "
                    "steps aside for",
        test="tests/test_filters_heuristic.py",
        bench="bench/fast_paths.py",
    ),
    FastPath(
        name="spacy_rules",
        module="pipeline.fast.spacy_rules",
        equals=Reference("spacy.tokenizer:Tokenizer", SPACY, SPACY_PIN),
        fallback="pipeline.fast.word_chain:WordChain.spacy_tokens",
        steps_aside="a run of the chunk's tokens spells a special case that would change them (spaCy's "
                    "special-case matcher)",
        test="tests/test_filters_heuristic.py",
        bench="bench/fast_paths.py",
    ),
    FastPath(
        name="affix_search",
        module="pipeline.fast.affix_search",
        equals=Reference("spacy.util:compile_suffix_regex", SPACY, SPACY_PIN),
        fallback="spacy.util:compile_suffix_regex",
        steps_aside="a rule set with a piece that has a top-level | or is not a string pattern",
        test="tests/test_filters_heuristic.py",
    ),
    FastPath(
        name="fasttext_predict",
        module="pipeline.fast.fasttext_predict",
        equals=Reference("fasttext.FastText:_FastText.predict", "fasttext-numpy2-wheel", "==0.9.2"),
        fallback="pipeline.filters.fasttext_model:FastTextModel.predict",
        steps_aside="a model with a one-vs-all loss, word n-grams > 1 or a quantized output layer; per document, "
                    "two labels or a cutoff too close to call",
        test="tests/test_lid.py",
        bench="bench/fast_paths.py",
    ),
    FastPath(
        name="byte_level_bpe",
        module="pipeline.fast.byte_level_bpe",
        equals=Reference("tokenizers:Tokenizer.encode_batch_fast", "tokenizers", ">=0.20"),
        fallback="tokenizers:Tokenizer.encode_batch_fast",
        steps_aside="a tokenizer whose pipeline is not no-normalizer ByteLevel BPE with special added tokens only; "
                    "per document, a character whose split may differ from tokenizers' pre-tokenizer",
        test="tests/test_fast_bpe.py",
        bench="bench/tokenize_write.py",
    ),
    FastPath(
        name="minhash",
        module="kernels.minhash",
        equals=Reference("datasketch:MinHash", "datasketch", ">=1.6"),
        fallback="datasketch:MinHash",
        steps_aside="never at run time: the kernel is the implementation (its default shingle hash is tokenmill's "
                    "own); with hashfunc='sha1' its signatures are datasketch's, which the tests compare",
        test="tests/test_minhash.py",
        bench="bench/minhash.py",
    ),
    FastPath(
        name="chunk_numbering",
        module="kernels.text_chunks",
        equals=Reference("kernels.text_chunks:split_texts_py"),
        fallback="kernels.text_chunks:split_texts_py",
        steps_aside=NO_C_EXTENSION,
        test="tests/test_filters_heuristic.py",
    ),
    FastPath(
        name="space_chunks",
        module="kernels.space_chunks",
        equals=Reference("kernels.space_chunks:space_chunks_py"),
        fallback="kernels.space_chunks:space_chunks_py",
        steps_aside=NO_C_EXTENSION,
        test="tests/test_fast_bpe.py",
        bench="bench/tokenize_write.py",
    ),
    FastPath(
        name="fasttext_tokens",
        module="kernels.fasttext_tokens",
        equals=Reference("kernels.fasttext_tokens:split_lines_py"),
        fallback="kernels.fasttext_tokens:split_lines_py",
        steps_aside=NO_C_EXTENSION,
        test="tests/test_lid.py",
        bench="bench/fast_paths.py",
    ),
    FastPath(
        name="word_classes",
        module="kernels.word_classes",
        equals=Reference("kernels.word_classes:word_sums_py"),
        fallback="pipeline.filters.gopher:GopherQuality._word_sums",
        steps_aside="the C extension kernels._text_native is not built (the filter keeps cached per-token codes)",
        test="tests/test_filters_heuristic.py",
    ),
)


def fast_path(name: str) -> FastPath:
    """The registered fast path called ``name``."""
    for path in FAST_PATHS:
        if path.name == name:
            return path
    raise KeyError(name)
