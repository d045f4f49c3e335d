"""``inputs[].limit``: the first N documents of an input (``tokenmill run --limit N``), read no further.

An input's documents are its files' documents in file order, so its first N may lie in several files, and the
readers read files in parallel, each on its own. The driver therefore decides, before the job reads, which files
hold them and how many each gives (:func:`limit_files`: it reads those N documents once, and stops there); each
reader then stops at its file's share (:func:`pipeline.readers.first_documents`). A file's malformed records before
its share ends are counted as usual; the files after the last one needed are not opened.
"""

from __future__ import annotations

from pipeline.documents import Drop
from pipeline.readers import read_file
from pipeline.spec import InputSpec

#: ``(file_index, input, path)``, as :func:`pipeline.readers.expand_inputs` lists them
InputFiles = list[tuple[int, InputSpec, str]]


def limit_files(files: InputFiles) -> tuple[InputFiles, InputFiles]:
    """The files a job reads when some inputs have a ``limit``: ``(listed, to_read)``, both in ``files``' order.

    ``listed``: the entries of ``files`` that are read (a limited input's files up to the one that completes its
    ``limit``; every file of an input without one), with the spec's own input, as the job records its inputs.
    ``to_read``: the same files, each with a copy of its input whose ``limit`` is that file's share, what
    :func:`pipeline.readers.read_file` stops at. Reads each limited input's first ``limit`` documents once."""
    listed: InputFiles = []
    to_read: InputFiles = []
    left: dict[int, int] = {}  # id(input) -> documents still to take from its next files
    for index, inp, path in files:
        if inp.limit is None:
            listed.append((index, inp, path))
            to_read.append((index, inp, path))
            continue
        want = left.setdefault(id(inp), inp.limit)
        if want == 0:
            continue
        first = read_file(index, path, inp.model_copy(update={"limit": want}))
        share = sum(not isinstance(item, Drop) for item in first)
        left[id(inp)] = want - share
        if share:
            listed.append((index, inp, path))
            to_read.append((index, inp.model_copy(update={"limit": share}), path))
    return listed, to_read
