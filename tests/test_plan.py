"""`tokenmill plan` figures against values worked out by hand."""

from __future__ import annotations

import json

import pytest

from pipeline.output.shard_set import write_shard_set
from training.plan import (
    activation_memory,
    chinchilla_from_compute,
    chinchilla_from_tokens,
    gpu_hours,
    main,
    make_plan,
    state_memory,
)
from training.synthetic import SYNTHETIC, random_packed


def test_chinchilla():
    # C = 6 N (20 N) = 120 N^2: 1.2e21 FLOPs -> N = sqrt(1e19) = 3.1623e9, D = 6.3246e10
    n, d = chinchilla_from_compute(1.2e21)
    assert n == pytest.approx(3.16227766e9) and d == pytest.approx(6.32455532e10)
    n, c = chinchilla_from_tokens(2e10)
    assert n == pytest.approx(1e9) and c == pytest.approx(1.2e20)


@pytest.mark.parametrize("stage,expected", [(0, 16e9), (1, 5.5e9), (2, 3.75e9), (3, 2e9)])
def test_state_memory_per_zero_stage(stage, expected):
    # 1e9 params over 8 devices: bf16 weights 2, bf16 grads 2, fp32 master + Adam 12 bytes/param
    mem = state_memory(1e9, stage, 8)
    assert mem.total == pytest.approx(expected)
    assert state_memory(1e9, 0, 8, precision="fp32").total == pytest.approx(16e9)  # 4 + 4 + 8


def test_activation_memory():
    # 350m shapes: 24 layers, h 1024, 16 heads; s 2048, b 8, V 32000
    per_layer = 34 * 2048 * 8 * 1024  # 570,425,344
    logits = 6 * 2048 * 8 * 32000  # 3,145,728,000
    assert activation_memory(24, 1024, 16, 2048, 8, 32000) == 24 * per_layer + logits
    scores = 5 * 16 * 2048 * 2048 * 8
    assert activation_memory(24, 1024, 16, 2048, 8, 32000, flash=False) == 24 * (per_layer + scores) + logits
    ckpt = activation_memory(24, 1024, 16, 2048, 8, 32000, checkpointing=True)
    assert ckpt == 24 * 2 * 2048 * 8 * 1024 + per_layer + logits


def test_gpu_hours_and_cost():
    # 1e21 / (989e12 * 0.4) s = 2,527,805 s = 702.17 h
    assert gpu_hours(1e21, 989e12, 0.4) == pytest.approx(702.168, rel=1e-5)
    plan = make_plan(compute=1e21, gpus=8, price=2.0)
    assert plan.wall_hours == pytest.approx(702.168 / 8, rel=1e-5)
    assert plan.cost == pytest.approx(1404.34, rel=1e-5)
    with pytest.raises(ValueError, match="at most two"):
        make_plan(compute=1e21, tokens=1e9, params=1e8)


def test_cli_json_and_shard_set(tmp_path, capsys):
    assert main(["--compute", "1.2e21", "--gpus", "16", "--zero-stage", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["plan"]
    assert out["params"] == pytest.approx(3.16227766e9)
    # ZeRO-2 over 16: (2 + 14 / 16) bytes per parameter
    assert out["memory_per_gpu_gib"]["total"] == pytest.approx(3.16227766e9 * (2 + 14 / 16) / 2**30)
    m = write_shard_set(tmp_path, random_packed(10, 64, 300), seq_len=64, vocab_size=300, samples_per_shard=4,
                        **SYNTHETIC)
    assert main(["--data", str(tmp_path), "--preset", "tiny", "--vocab", "300"]) == 0
    text = capsys.readouterr().out
    record = json.loads(text.strip().splitlines()[-1])["plan"]
    assert record["tokens"] == m.total_tokens
    assert record["basis"] == "given model size and tokens"
    assert "activations" in text and "GPU-hours" in text


def test_cli_refuses_bad_input(tmp_path, capsys):
    assert main(["--compute", "1e20", "--tokens", "1e9", "--params", "1e8"]) == 2
    assert "at most two" in capsys.readouterr().err
    assert main(["--data", str(tmp_path / "none")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["--params", "1e8", "--preset", "nope"]) == 2
    with pytest.raises(SystemExit):
        main(["--compute", "-5"])
