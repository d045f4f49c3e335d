"""Worker loss on a two-node Ray cluster (issue 13): a node SIGKILLed mid-job costs time, not the output.

A head and a second node are started as separate ``ray start --block`` processes (token auth shared with
the driver through RAY_AUTH_MODE/RAY_AUTH_TOKEN_PATH; the second node on its own loopback address,
127.0.0.2, so the driver attaches to the head). ``tokenmill run --address`` runs a job whose curate
phase has work on both nodes (asserted from the Ray workers busy under each node's processes); while it
runs, the second node's raylet, workers and ``ray start`` are SIGKILLed. Ray retries the lost tasks on
the head and rebuilds lost blocks (or the curate phase starts over where it cannot). The job must finish
with a shard set byte-identical to an undisturbed run of the same spec (the session's local Ray), the
same counts in ``stats.json`` (a re-run batch is counted once: pipeline/job/stats.py) and the same
``rejected/`` records, none twice. Nodes are stopped by process id (terminate, then kill).

A driver that dies instead (the job rerun resumes from its shards) is tests/test_job_engine.py's.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.job.graph import READ_KEY
from tests.corpus_fixtures import make_text, write_jsonl
from tests.ports import free_port
from tests.processes import stop_group
from tests.test_job_engine import _events, _tree

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parent.parent
#: counts that do not depend on timing, per stage in stats.json
COUNTS = ("docs_in", "docs_out", "dropped", "bytes_in", "bytes_out", "counters")


def _corpus(folder: Path, files: int = 4, per_file: int = 1200) -> None:
    """Files of varied documents, each read in several batches; some too short (the length filter drops
    them), some repeated (exact dedup drops them)."""
    rng = random.Random(13)
    docs = [{"id": f"d{i}", "text": make_text(rng, rng.choice([2, 12, 40, 120]))} for i in range(files * per_file)]
    docs += [dict(docs[i], id=f"copy{i}") for i in range(0, len(docs), 40)]
    rng.shuffle(docs)
    for f in range(files):
        write_jsonl(folder / f"part-{f}.jsonl", docs[f::files])


def _spec(tmp: Path, out: str) -> Path:
    spec = {
        "name": "two-nodes",
        "inputs": [{"path": "in/*.jsonl"}],
        "stages": [{"type": "normalize"}, {"type": "length", "params": {"min_chars": 40}},
                   {"type": "exact_dedup", "params": {"partitions": 2}}],
        "tokenizer": {"train": {"vocab_size": 400, "sample_docs": 500}},
        "packing": {"seq_len": 128, "range_docs": 1500},
        "output": {"path": out, "samples_per_shard": 512},
        "execution": {"parallelism": 1, "batch_size": 256},
    }
    path = tmp / f"{out}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


# ---- processes ------------------------------------------------------------------------------------

def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray head exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"ray head did not listen on {port}")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in parentheses may hold spaces
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _tree_pids(root: int) -> list[int]:
    """``root`` and every process below it (a node's raylet, agents and workers)."""
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _busy_workers(root: int) -> list[str]:
    """Titles of the Ray workers below ``root`` that run one of the job's tasks or hold one of its actors
    (not idle workers, not the node's agents)."""
    titles = []
    for pid in _tree_pids(root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd.startswith("ray::") and not cmd.startswith("ray::IDLE") and not cmd.endswith("Agent"):
            titles.append(cmd)
    return titles


def _wait_for_node(log: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until ``ray start`` says the node runs (it has registered with the head)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if "Ray runtime started" in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the second node did not start: {log.read_text()[-2000:]}")


def _sigkill_node(root: int) -> list[int]:
    """SIGKILL a node: its ``ray start`` process, raylet, agents and workers (listed first: a killed
    raylet's workers are re-parented)."""
    pids = _tree_pids(root)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def _stage_counts(stats: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["stage"]: {k: s.get(k) for k in COUNTS} for s in stats["stages"]}


def _rejected(out: Path) -> list[str]:
    return sorted(line for p in (out / "rejected").rglob("*") if p.is_file() for line in p.read_text().splitlines())


# ---- the tests ------------------------------------------------------------------------------------

def test_a_task_run_again_after_its_worker_died_is_counted_once(ray_local: Any, tmp_path: Path) -> None:
    """The task's worker dies right after the task reported; Ray runs the task again (same task id), which
    reports the same batch again: counted once, its rejected file written once."""
    from pipeline.job.stats import StageRecorder, start_stats_actor

    actor = start_stats_actor()
    recorder = StageRecorder("02-length", actor, str(tmp_path / "rejected"))
    marker = tmp_path / "crashed-once"

    @ray_local.remote(max_retries=1)
    def one_batch(recorder: StageRecorder, marker: str) -> int:
        drop = {"id": "d1", "text": "x", "source": "a.jsonl", "ord": 1, "meta": "{}", "segments": None,
                "reason": "too_short", "detail": {}}
        recorder.rejects([drop])
        recorder.counts(docs_in=10, docs_out=9, dropped={"too_short": 1})
        if not os.path.exists(marker):
            Path(marker).touch()
            os._exit(1)  # the worker is lost after reporting, before the task returns
        return os.getpid()

    ray_local.get(one_batch.remote(recorder, str(marker)))
    assert marker.exists()  # the first run did die
    snap = ray_local.get(actor.snapshot.remote())["02-length"]
    assert (snap["docs_in"], snap["docs_out"], snap["dropped"]) == (10, 9, {"too_short": 1})
    assert ray_local.get(actor.repeated.remote()) == {"02-length": 1}
    assert len(list((tmp_path / "rejected" / "02-length").iterdir())) == 1


@pytest.mark.slow
def test_a_node_killed_mid_job_changes_nothing_in_the_output(ray_local: Any, tmp_path: Path) -> None:
    from pipeline.job.engine import Job
    from pipeline.spec import load_spec

    t_start = time.monotonic()
    _corpus(tmp_path / "in")
    ray_bin = str(Path(sys.executable).parent / "ray")
    temp = Path(tempfile.mkdtemp(prefix="tm2n-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO),
           # the head learns of the dead node in about a second instead of the default 15 s
           "RAY_health_check_period_ms": "300", "RAY_health_check_timeout_ms": "300",
           "RAY_health_check_failure_threshold": "3"}
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--block", "--disable-usage-stats"]
    logs = [open(tmp_path / name, "w") for name in ("node0.log", "node1.log", "job.out")]  # noqa: SIM115
    # the head alone can hold every actor of the job (2 per pool at parallelism 2): lost actors restart there
    head = subprocess.Popen(
        [ray_bin, "start", "--head", f"--port={port}", "--num-cpus=4", "--node-ip-address=127.0.0.1",
         "--include-dashboard=false", f"--temp-dir={temp}", *common],
        env=env, stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True,
    )
    nodes, job = [head], None
    out = tmp_path / "two_nodes"

    def start_second_node() -> None:  # as soon as the head listens, while the undisturbed run goes on here
        _wait_for_port(port, head)
        nodes.append(subprocess.Popen(
            [ray_bin, "start", f"--address={address}", "--num-cpus=2", "--node-ip-address=127.0.0.2", *common],
            env=env, stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True,
        ))

    starter = threading.Thread(target=start_second_node, daemon=True)
    starter.start()
    try:
        # the undisturbed run, in the session's local Ray at parallelism 1, while the cluster starts
        Job(load_spec(_spec(tmp_path, "undisturbed"))).run()
        t_reference = time.monotonic() - t_start
        starter.join(timeout=120)
        assert len(nodes) == 2, "the second node was not started"
        second = nodes[1]
        _wait_for_node(tmp_path / "node1.log", second)
        t_cluster = time.monotonic()
        job = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "run", str(_spec(tmp_path, "two_nodes")), "--address", address,
             "--parallelism", "2"],
            # each actor pool starts work once all its actors are up (one per node: Ray Data spreads them), so the
            # second node's are not left out by the head's starting first on a busy machine
            env={**env, "RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S": "120"}, cwd=REPO, stdout=logs[2],
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        # mid-curate, with work on both nodes: the reader has counted documents, both nodes hold workers of
        # the stages' actor pools and the second node's have run a batch
        deadline = time.monotonic() + 180
        seen: dict[str, set[str]] = {"head": set(), "second": set()}
        while True:
            assert time.monotonic() < deadline and job.poll() is None, \
                f"never saw work on both nodes mid-curate (job rc {job.poll()}): {seen}"
            seen["head"].update(_busy_workers(head.pid))
            seen["second"].update(_busy_workers(second.pid))
            if (any(t.startswith("ray::MapWorker") for t in seen["head"])
                    and any(t.startswith("ray::MapWorker") and t.endswith(".submit") for t in seen["second"])
                    and any(e["type"] == "stage_counters" and e["stages"].get(READ_KEY, {}).get("docs_in", 0) > 0
                            for e in _events(out))):
                break
            time.sleep(0.05)
        phases_at_kill = [(e["phase"], e["state"]) for e in _events(out) if e["type"] == "phase"]
        killed = _sigkill_node(second.pid)
        t_kill = time.monotonic()
        job.wait(timeout=300)
        t_done = time.monotonic()
    finally:
        starter.join(timeout=120)
        if job is not None and job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        for proc in reversed(nodes):
            stop_group(proc)
        for f in logs:
            f.close()
        shutil.rmtree(temp, ignore_errors=True)
    print(f"\ntwo-node test: reference run {t_reference:.1f}s, cluster up at {t_cluster - t_start:.1f}s, "
          f"job start to kill {t_kill - t_cluster:.1f}s, "
          f"kill to job end {t_done - t_kill:.1f}s, total {time.monotonic() - t_start:.1f}s; "
          f"killed {len(killed)} processes of the second node, which had run: {sorted(seen['second'])}")
    for e in _events(out):
        if e["type"] == "log":
            print(f"job: {e['level']}: {e['message'][:300]}")  # Ray ran work again / curate started over
    assert job.returncode == 0, (tmp_path / "job.out").read_text()[-4000:]
    assert ("curate", "finished") not in phases_at_kill  # the kill landed mid-curate
    # the job's own workers were on both nodes (the head runs everything after the kill)
    assert any(t.startswith("ray::MapWorker") for t in seen["head"]), seen
    assert any(t.startswith("ray::MapWorker") and t.endswith(".submit") for t in seen["second"]), seen
    assert _tree(out) == _tree(tmp_path / "undisturbed")  # manifest, tokenizer and every shard, byte for byte
    stats, reference = (json.loads((p / "stats.json").read_text()) for p in (out, tmp_path / "undisturbed"))
    assert _stage_counts(stats) == _stage_counts(reference)
    assert (stats["output"], stats["packing"]) == (reference["output"], reference["packing"])
    rejected = _rejected(out)
    assert rejected == _rejected(tmp_path / "undisturbed")  # every drop set aside once: no file written twice
    assert len(rejected) == sum(sum(s["dropped"].values()) for s in stats["stages"]) > 0
