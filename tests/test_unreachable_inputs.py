"""A remote input whose store cannot be asked (issue 39's first-hour edges): one line naming the input and the
store's reason, exit 2, in seconds; not the client's 80-line traceback. Offline: an S3 endpoint on a local port
that refuses, and a Hub endpoint on one (``HF_ENDPOINT``, read when huggingface_hub is imported: a fresh
process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import storage
from pipeline.preflight import checked
from pipeline.problems import SpecError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: a connection to it is refused at once (held, so no one takes it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_an_s3_input_whose_endpoint_refuses_is_one_problem_at_its_path(closed_port, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    t0 = time.monotonic()
    for path in ("s3://bucket/x/*.jsonl", "s3://bucket/x.jsonl"):  # a glob lists, one object is asked about
        with pytest.raises(SpecError) as info:
            checked({"name": "t", "inputs": [{"path": "a.jsonl"}, {"path": path}], "output": {"path": "out"}})
        problems = [str(p) for p in info.value.problems]
        assert problems[0] == "inputs.0.path: no file matches 'a.jsonl'"
        assert problems[1].startswith(f"inputs.1.path: cannot list {path}: OSError: ")
        assert "Could not connect" in problems[1] and "\n" not in problems[1]
    assert time.monotonic() - t0 < 30
    with pytest.raises(storage.StorageError, match=r"^cannot list s3://bucket/x\.jsonl: OSError: "):
        storage.expand_remote("s3://bucket/x.jsonl")


def test_an_hf_input_that_cannot_be_reached_is_one_line_and_exit_2(closed_port, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: t\ninputs:\n  - path: hf://datasets/someone/corpus/*.jsonl\noutput:\n  path: out\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_ENDPOINT": f"http://127.0.0.1:{closed_port}"}
    env.pop("HF_HUB_OFFLINE", None)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "service.cli", "run", str(spec)], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert time.monotonic() - t0 < 60
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("error: inputs.0.path (line 3): cannot list hf://datasets/someone/corpus/*.jsonl: "), line
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()
