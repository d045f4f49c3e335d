"""No rank ever waits for data another rank lacks: 2 ranks x 2 DataLoader workers under torchrun on an
uneven shard set, with a collective every step (a rank that ran dry would hang it), under a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.output.shard_set import write_shard_set
from training.synthetic import SYNTHETIC, random_packed

REPO = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from training.data import ShardLoader

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data, out = sys.argv[1], sys.argv[2]
    result = {}
    for remainder in ("drop", "wrap"):
        loader = ShardLoader(data, 3, rank=rank, world=world, num_workers=2, shuffle_window=5,
                             remainder=remainder, max_epochs=2)
        seen, steps = [], 0
        for batch in loader:
            t = torch.tensor([float(batch["tokens"])])
            dist.all_reduce(t)  # every step is a collective, as in training
            seen.append(batch["keys"])
            steps += 1
        gathered = [None] * world
        dist.all_gather_object(gathered, {"steps": steps, "keys": seen})
        result[remainder] = gathered
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
""")


def torchrun(nproc: int, args: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """torchrun on loopback; a hang fails the test at ``timeout``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    try:
        return subprocess.run(cmd, cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish in {timeout}s (hang?):\n{(exc.stderr or b'')[-3000:]!r}")


def test_uneven_shards_two_ranks_two_workers_end_together(tmp_path):
    data = tmp_path / "shards"
    # 6 shards of 9 + a partial shard of 5 = 59 samples: uneven over ranks, workers and batches
    write_shard_set(data, random_packed(59, 32, 200, seed=5, max_doc=20), seq_len=32, vocab_size=200,
                    samples_per_shard=9, **SYNTHETIC)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "result.json"
    proc = torchrun(2, [str(script), str(data), str(out)], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())

    drop = result["drop"]
    # 59 // 2 = 29 samples per rank -> 9 whole batches of 3 (5 + 4 over the workers), for 2 epochs
    assert [r["steps"] for r in drop] == [18, 18]
    for ep in range(2):
        a = [k for b in drop[0]["keys"][ep * 9:(ep + 1) * 9] for k in b]
        b = [k for b in drop[1]["keys"][ep * 9:(ep + 1) * 9] for k in b]
        assert len(set(a)) == len(a) == 27 and len(set(b)) == 27 and not set(a) & set(b)

    wrap = result["wrap"]
    # ceil(59 / 2) = 30 per rank -> 10 batches; the epoch wraps round, so every sample is seen
    assert wrap[0]["steps"] == wrap[1]["steps"] == 20
    for ep in range(2):
        both = [k for r in wrap for b in r["keys"][ep * 10:(ep + 1) * 10] for k in b]
        assert len(both) == 60 and len(set(both)) == 59
