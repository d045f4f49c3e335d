"""The trainer end to end on shards the pipeline produced: torchrun with 2 gloo ranks trains a tiny
Llama, the loss falls, and stop-at-k + resume repeats the uninterrupted run's losses; DeepSpeed
ZeRO-2 trains the same steps; a corrupted shard stops training with a line that names it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from pipeline.runner import run_job
from pipeline.shard_format import Manifest
from pipeline.spec import parse_spec
from tests.corpus_fixtures import clean_corpus
from tests.test_loader_dist import REPO, torchrun
from training.data import EpochPlan, LoaderConfig
from training.synthetic import serve_directory

pytestmark = pytest.mark.ray

CONFIG = REPO / "training" / "configs" / "tiny.yaml"
STEPS, STOP = 12, 6


@pytest.fixture(scope="module")
def shards(ray_local, tmp_path_factory) -> Path:
    """A few hundred short documents through the real pipeline: BPE 400, seq_len 128."""
    corpus = tmp_path_factory.mktemp("corpus")
    clean_corpus(corpus, 300)
    out = tmp_path_factory.mktemp("shards")
    spec = parse_spec({
        "name": "train-test", "inputs": [{"path": str(corpus)}], "stages": [{"type": "normalize"}],
        "tokenizer": {"train": {"vocab_size": 400, "sample_docs": 300}}, "packing": {"seq_len": 128},
        "output": {"path": str(out), "samples_per_shard": 16, "overwrite": True},
        "execution": {"batch_size": 64},
    })
    return run_job(spec).output_dir


def train(data: str | Path, out: Path, *extra: str, timeout: float = 240):
    args = ["-m", "training.train", "--config", str(CONFIG), "--data", str(data), "--out", str(out),
            "--max-steps", str(STEPS), *extra]
    return torchrun(2, args, timeout=timeout)


def losses(out: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows]


@pytest.fixture(scope="module")
def uninterrupted(shards, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run-a")
    proc = train(shards, out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_two_ranks_train_and_the_loss_falls(uninterrupted):
    rows = [json.loads(line) for line in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    first, last = rows[0], rows[-1]
    assert first["loss"] > 5.5  # ~ln(448) at initialisation
    assert last["loss"] < first["loss"] - 0.8
    for r in rows:
        assert r["ppl"] == pytest.approx(math.exp(r["loss"]))
        assert r["tokens_per_s"] > 0 and r["grad_norm"] > 0 and r["lr"] > 0 and r["max_rss_gb"] > 0
        assert "mfu" not in r  # a CPU has no known peak: no MFU rather than a wrong one
    assert rows[4]["lr"] == pytest.approx(3e-3)  # end of the 5-step warmup
    assert list((uninterrupted / "tb").glob("events.out.tfevents.*"))
    ckpt = uninterrupted / "checkpoints" / f"step-{STEPS:08d}"
    names = {p.name for p in ckpt.iterdir()}
    assert {"trainer.json", "loader-rank0.json", "loader-rank1.json", ".metadata"} <= names
    assert json.loads((ckpt / "loader-rank1.json").read_text())["batch"] == STEPS


def test_stop_and_resume_repeats_the_uninterrupted_losses(shards, uninterrupted, tmp_path):
    out = tmp_path / "run-b"
    # the first half streams the shards over HTTP, the resumed half reads the directory
    with serve_directory(shards) as url:
        first = train(url, out, "--stop-at", str(STOP))
    assert first.returncode == 0, first.stderr[-4000:]
    assert f"stopped at step {STOP}" in first.stderr
    assert [s for s, _ in losses(out)] == list(range(1, STOP + 1))
    second = train(shards, out)
    assert second.returncode == 0, second.stderr[-4000:]
    assert f"resumed from {out / 'checkpoints' / f'step-{STOP:08d}'} at step {STOP}" in second.stderr
    got, want = losses(out), losses(uninterrupted)
    assert [s for s, _ in got] == [s for s, _ in want]
    for (step, a), (_, b) in zip(got, want, strict=True):
        assert abs(a - b) <= 1e-6, f"step {step}: resumed {a} vs uninterrupted {b}"


def test_deepspeed_zero2_trains_the_same_steps(shards, uninterrupted, tmp_path):
    try:
        import deepspeed  # noqa: F401
    except Exception as exc:  # not installed, or no usable accelerator build
        pytest.skip(f"DeepSpeed is not usable here ({type(exc).__name__}: {exc}); "
                    "install with: pip install --no-build-isolation 'tokenmill[deepspeed]'")
    out = tmp_path / "ds"
    proc = train(shards, out, "--set", "parallel.strategy=deepspeed",
                 "--set", f"parallel.deepspeed_config={REPO / 'training/configs/deepspeed_zero2.json'}",
                 "--max-steps", "6", timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "deepspeed bf16" in proc.stderr
    ds = losses(out)
    fsdp = dict(losses(uninterrupted))
    assert [s for s, _ in ds] == list(range(1, 7))
    # the same model, data and schedule under ZeRO-2 instead of FSDP2: same losses up to bf16 noise
    # (the schedule differs only by max_steps, which the first 5 warmup steps do not depend on)
    for step, loss in ds[:5]:
        assert loss == pytest.approx(fsdp[step], abs=2e-2)
    assert ds[-1][1] < ds[0][1] - 0.4
    assert (out / "checkpoints" / "step-00000006" / "loader-rank0.json").exists()


def test_corrupted_shard_stops_training_with_its_name(shards, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(shards, bad)
    m = Manifest.load(bad)
    plan = EpochPlan(m, LoaderConfig(batch_size=4, num_workers=1, shuffle_window=256), 0, 0, 2)
    shard, _ = plan.locate(0)  # the first shard rank 0 reads
    name = m.shards[shard].name
    path = bad / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    proc = train(bad, tmp_path / "out", timeout=120)
    assert proc.returncode != 0
    assert f"tokenmill train: rank 0: shard {name}: sha256 mismatch" in proc.stderr


def test_bad_config_is_refused_without_a_traceback(tmp_path, capsys):
    from training.train import main

    assert main(["--config", str(CONFIG)]) == 2
    assert "data.path: required" in capsys.readouterr().err
    assert main(["--config", str(CONFIG), "--data", "x", "--set", "optim.lr=-1"]) == 2
    assert "optim.lr: Input should be greater than 0" in capsys.readouterr().err
    missing = tmp_path / "missing.yaml"
    assert main(["--config", str(missing), "--data", "x"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_sigterm_checkpoints_and_the_run_resumes(shards, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "term"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env["PYTHONPATH"] = str(REPO)
    # through torchrun, with a DataLoader worker: torchrun signals the whole process group, workers too
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "-m", "training.train",
           "--config", str(CONFIG), "--data", str(shards), "--out", str(out), "--set", "data.num_workers=1",
           "--max-steps", "100000"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)  # what a scheduler's preemption does to the job's process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "DataLoader worker" not in err, err[-3000:]
    step = json.loads(metrics.read_text().splitlines()[-1])["step"]
    assert f"terminated (SIGTERM) at step {step}" in err
    ckpt = out / "checkpoints" / f"step-{step:08d}"
    assert json.loads((ckpt / "trainer.json").read_text())["step"] == step
    again = subprocess.run([*cmd[:-1], str(step + 2)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {ckpt} at step {step}" in again.stderr
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()][-2:] == [step + 1, step + 2]
