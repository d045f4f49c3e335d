"""A two-node Ray cluster gives what one node gives: the same documents kept by dedup, and a whole job's
shard set byte-identical to a single-node run, with shards written on both nodes.

A head and a second node are started as separate ``ray start --block`` processes (one CPU each, in
their own temp folder, token auth shared with the driver through RAY_AUTH_MODE/RAY_AUTH_TOKEN_PATH),
a driver subprocess connects with ``init_ray(address=...)`` and runs exact_dedup then near_dedup, and
the nodes are stopped by process id (terminate, then kill). The session's own local Ray (``ray_local``)
computes the single-node answer.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.dedup.exact import ExactDedup, ExactDedupParams
from pipeline.dedup.near import NearDedup, NearDedupParams
from tests.test_dedup_stages import ctx, doc, edit, random_text, run_stage

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent

DRIVER = r"""
import json, sys, time
t0 = time.time()
import ray
from pipeline.job.ray_env import init_ray
from pipeline.stages.base import StageContext
from pipeline.dedup.exact import ExactDedup, ExactDedupParams
from pipeline.dedup.near import NearDedup, NearDedupParams
from pipeline.job.stats import StageRecorder, StatsActor

init_ray(address=sys.argv[1])
rows = json.load(open(sys.argv[2]))
deadline = time.time() + 90
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.time() < deadline:
    time.sleep(0.5)  # the second node may still be joining
nodes = [n for n in ray.nodes() if n["Alive"]]

@ray.remote(num_cpus=1)
def where():
    import time
    time.sleep(1.0)
    return ray.get_runtime_context().get_node_id()

spread = set(ray.get([where.remote() for _ in range(2)]))
ctx = StageContext(job_name="two", output_dir="", stage_index=0, work_dir="")
actor = StatsActor.remote()
ds = ray.data.from_items(rows).repartition(4)
ds = ExactDedup(ExactDedupParams(partitions=3), ctx).apply(ds, StageRecorder("exact_dedup", actor, None))
ds = NearDedup(NearDedupParams(threshold=0.7, partitions=3), ctx).apply(ds, StageRecorder("near", actor, None))
kept = sorted(r["id"] for r in ds.iter_rows())
print("RESULT " + json.dumps({"nodes": len(nodes), "spread": len(spread), "kept": kept,
                              "seconds": round(time.time() - t0, 1)}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray head exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"ray head did not listen on {port}")


def _stop(proc: subprocess.Popen) -> None:
    """Terminate the node's process group (led by the pid we started), then kill what is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=20)


def corpus() -> list[dict[str, Any]]:
    import random

    rng = random.Random(21)
    rows = []
    for i in range(30):
        text = random_text(rng, 150)
        rows.append(doc(i % 3, i, text))
        if i % 3 == 0:
            rows.append(doc(3, i, edit(rng, text, 0.01)))
        if i % 4 == 0:
            rows.append(doc(4, i, text))
    return rows


def test_two_nodes_keep_the_same_documents_as_one(ray_local: Any, tmp_path: Path) -> None:
    rows = corpus()
    after_exact, _, _ = run_stage(ray_local, ExactDedup(ExactDedupParams(), ctx("")), rows, tmp_path / "a")
    kept_one, _, _ = run_stage(ray_local, NearDedup(NearDedupParams(threshold=0.7), ctx("")), after_exact,
                               tmp_path / "b")
    expected = sorted(r["id"] for r in kept_one)
    assert len(expected) < len(rows)

    from pipeline.job.engine import Job
    from pipeline.spec import load_spec
    from tests.test_job_engine import _events, _spec_file, _tree

    job_spec = _spec_file(tmp_path, "two_nodes", n_docs=600)
    Job(load_spec(_spec_file(tmp_path, "one_node", n_docs=600))).run()
    ray_bin = str(Path(sys.executable).parent / "ray")
    temp = Path(tempfile.mkdtemp(prefix="tm2n-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus=1", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(2)]  # noqa: SIM115
    head = subprocess.Popen(
        [ray_bin, "start", "--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}", *common],
        env=env, stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True,
    )
    nodes = [head]
    try:
        _wait_for_port(port, head)
        nodes.append(subprocess.Popen(
            [ray_bin, "start", f"--address={address}", *common],
            env=env, stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True,
        ))
        (tmp_path / "rows.json").write_text(json.dumps(sorted(rows, key=lambda r: r["ord"])))
        proc = subprocess.run([sys.executable, "-c", DRIVER, address, str(tmp_path / "rows.json")],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stderr[-4000:]
        result = json.loads(lines[-1][len("RESULT "):])
        job = subprocess.run([sys.executable, "-m", "service.cli", "run", str(job_spec), "--address", address,
                              "--parallelism", "2"],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    finally:
        for proc in reversed(nodes):
            _stop(proc)
        for f in logs:
            f.close()
    print(f"two-node driver: {result['seconds']}s")
    assert result["nodes"] == 2
    assert result["spread"] == 2  # work really ran on both nodes
    assert result["kept"] == expected, result["seconds"]
    assert _tree(tmp_path / "two_nodes") == _tree(tmp_path / "one_node")
    writers = {e["writer"].rsplit(":", 1)[1] for e in _events(tmp_path / "two_nodes") if e["type"] == "shard_written"}
    assert len(writers) == 2, writers  # shards were written on both nodes
