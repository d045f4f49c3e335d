"""The trainer end to end on shards the pipeline produced: torchrun with 2 gloo ranks trains a tiny
Llama, the loss falls, and stop-at-k + resume repeats the uninterrupted run's losses; DeepSpeed
ZeRO-2 trains the same steps; a corrupted shard stops training with a line that names it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from pipeline.job.engine import run_job
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
def shards(ray_shared, tmp_path_factory) -> Path:
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
        assert r["gc_s"] >= 0
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
    # one run covers ZeRO-2 and DeepSpeed's own gradient accumulation: 2 micro-batches of 2 rows must make the
    # uninterrupted FSDP run's steps of 4 rows (a second DeepSpeed run would cost a minute of CI)
    out = tmp_path / "ds"
    proc = train(shards, out, "--set", "parallel.strategy=deepspeed",
                 "--set", f"parallel.deepspeed_config={REPO / 'training/configs/deepspeed_zero2.json'}",
                 "--set", "data.batch_size=2", "--set", "optim.grad_accum=2", "--max-steps", "6", timeout=300)
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

    def rows(path: Path) -> dict[int, dict]:
        return {r["step"]: r for r in map(json.loads, (path / "metrics.jsonl").read_text().splitlines())}

    ref = rows(uninterrupted)
    for step, acc in sorted(rows(out).items())[:5]:
        # gradients of the same size, not k times smaller or larger (clipping would hide that in the loss)
        assert acc["grad_norm"] == pytest.approx(ref[step]["grad_norm"], rel=5e-2), step


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


def test_python_gc_runs_on_a_fixed_cadence_and_is_restored(shards, tmp_path, monkeypatch):
    """Automatic GC is off while training (a full collection paused one 10-step window of a 125M
    model on an H200 by 0.35 s); young objects are collected every ``gc_every`` steps, and GC is on
    again afterwards."""
    import gc

    from training import train as train_mod

    calls, enabled = [], []
    real_collect = gc.collect

    def spy(generation=2):
        calls.append(generation)
        enabled.append(gc.isenabled())
        return real_collect(generation)

    monkeypatch.setattr(train_mod.gc, "collect", spy)
    assert gc.isenabled()
    code = train_mod.main(["--config", str(CONFIG), "--data", str(shards), "--out", str(tmp_path),
                           "--max-steps", "4", "--set", "parallel.gc_every=2", "--set", "data.num_workers=0"])
    assert code == 0
    assert gc.isenabled()
    assert calls[:3] == [1, 1, 1] and enabled[:3] == [False, False, False]  # start, step 2, step 4
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(r["gc_s"] >= 0 for r in rows)
    # a caller that had turned GC off keeps it off
    gc.disable()
    try:
        assert train_mod.main(["--config", str(CONFIG), "--data", str(shards), "--out", str(tmp_path / "b"),
                               "--max-steps", "2", "--set", "data.num_workers=0"]) == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_gradient_accumulation_and_activation_checkpointing_keep_the_steps(shards, tmp_path):
    """2 micro-batches of 2 rows per step make the same updates as 1 batch of 4 rows: each token's
    loss is divided by the step's global count of loss tokens, not by a per-micro-batch mean."""
    from training.train import main

    def run(name: str, batch: int, accum: int, *extra: str) -> list[dict]:
        out = tmp_path / name
        code = main(["--config", str(CONFIG), "--data", str(shards), "--out", str(out), "--max-steps", "5",
                     "--set", f"data.batch_size={batch}", "--set", f"optim.grad_accum={accum}",
                     "--set", "data.num_workers=0", "--set", "parallel.precision=fp32",
                     "--set", "checkpoint.at_end=false", *extra])
        assert code == 0
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    whole, accumulated = run("whole", 4, 1), run("accum", 2, 2)
    assert [r["step"] for r in accumulated] == [1, 2, 3, 4, 5]
    for a, b in zip(whole, accumulated, strict=True):
        assert a["loss_tokens"] == b["loss_tokens"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    assert whole[-1]["loss"] < whole[0]["loss"] - 0.3  # the steps really trained
    # activation checkpointing under FSDP2 recomputes the same blocks, and deferring FSDP2's gradient
    # reduction to the last micro-batch sums the same gradients: the same steps again
    for name, key in (("ac", "parallel.activation_checkpointing"), ("defer", "parallel.defer_grad_sync")):
        again = run(name, 2, 2, "--set", f"{key}=true")
        for a, b in zip(accumulated, again, strict=True):
            assert b["loss"] == pytest.approx(a["loss"], abs=1e-6), name
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), name


def test_resume_with_another_grad_accum_is_refused(shards, tmp_path, capsys):
    from training.train import main

    args = ["--config", str(CONFIG), "--data", str(shards), "--out", str(tmp_path), "--max-steps", "4",
            "--set", "data.num_workers=0", "--set", "data.batch_size=2"]
    assert main([*args, "--set", "optim.grad_accum=2", "--stop-at", "2"]) == 0
    assert main([*args, "--set", "optim.grad_accum=1"]) == 1
    assert "saved with optim.grad_accum=2, resuming with 1" in capsys.readouterr().err


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
