"""The README's first command, at a smaller size: `tokenmill demo` builds its corpus, runs, summarizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from pipeline.packing import pack_all
from pipeline.shard_format import Manifest
from pipeline.spec import TokenizerSpec
from pipeline.tokenize import DocEncoder, TokenizerInfo
from tests.demo_install import demo_install_env

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    env = demo_install_env({**os.environ, "PYTHONUNBUFFERED": "1"})  # only what `make demo` installs
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", "demo", "--output", str(out), "--max-bytes", "6000000"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, proc.stderr


def test_demo_output_holds_no_ray_log_line(demo):
    """Issue 8, item 6: Ray's own lines go to the job's log, not to the person running `make demo`."""
    from tests.test_cli_progress import RAY_LOG_LINE

    out, stdout, stderr = demo
    noisy = [line for line in (stdout + stderr).splitlines() if any(p.search(line) for p in RAY_LOG_LINE)]
    assert noisy == []
    assert (out / "output" / ".tokenmill" / "job.log").stat().st_size > 0


def test_demo_prints_the_summary(demo):
    out, stdout, _ = demo
    for needle in ("00-read", "01-normalize", "packing     best_fit", "utilization", "tokens in", "shard(s)",
                   "docs/s end to end", "written to"):
        assert needle in stdout, needle
    m = Manifest.load(out / "output")
    assert m.total_tokens > 100_000 and len(m.shards) >= 2
    stats = json.loads((out / "output" / "stats.json").read_text())
    assert stats["stages"][0]["docs_out"] > 500


def test_demo_ends_saying_where_to_look_next(demo):
    """Issue 39: the card, ``inspect`` on the shards and the guide, as paths that exist."""
    from pipeline.demo import GUIDE

    out, stdout, _ = demo
    tail = stdout[stdout.rindex("next:"):].splitlines()
    card = tail[1].split()[-1]
    assert Path(card).is_file() and Path(card).parent == out / "output", tail
    assert tail[2].endswith(f" inspect {out / 'output'}"), tail
    assert tail[3].split()[-1] == GUIDE and (REPO / GUIDE).is_file(), tail


def test_best_fit_beats_concat_on_the_demo_corpus(demo):
    from bench.common import read_texts

    out, _, _ = demo
    texts = read_texts(sorted((out / "corpus").glob("*.jsonl.gz")))
    tok = Tokenizer.from_file(str(out / "output" / "tokenizer.json"))
    enc = DocEncoder(tok, TokenizerInfo.resolve(tok, TokenizerSpec()))
    docs = [(str(i), ids, None) for i, (ids, _) in enumerate(enc.encode(texts, [""] * len(texts)))]
    # seq_len 2048, the contract (issue 8: >= 99 % at 2048 on the demo corpus). The corpus is built from the installed
    # packages' text: at 3 MB (~600 docs) 2048 fell to 0.988 once the test extra grew; at 6 MB (~1,260) 0.995
    _, best = pack_all(docs, "best_fit", 2048)
    _, concat = pack_all(docs, "concat", 2048)
    assert best.utilization >= 0.99, best.as_dict()
    assert best.docs_cut < concat.docs_cut, (best.as_dict(), concat.as_dict())
