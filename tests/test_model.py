"""The Llama: a document packed after others computes exactly what it computes alone (document mask
plus positions restarting per document), and the size/FLOP formulas match the module it builds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.attention import DocMask
from pipeline.shard_format import Sample
from training.data import collate
from training.model import Llama, ModelConfig, apply_rope, rope_tables, token_loss_sum


def _cfg(**over) -> ModelConfig:
    base = {"vocab_size": 101, "dim": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 48}
    base.update(over)
    return ModelConfig(**base)


def _batch(rows: list[list[np.ndarray]], seq_len: int):
    samples = [Sample(str(i), np.concatenate(docs), np.array([len(d) for d in docs]), None, {})
               for i, docs in enumerate(rows)]
    b = collate(samples, seq_len, pad_id=0)
    mask = DocMask(b["cu_seqlens"], b["max_seqlen"], b["seq_ids"])
    return b, mask


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_packed_document_equals_document_alone(kv_heads):
    torch.manual_seed(0)
    model = Llama(_cfg(n_kv_heads=kv_heads)).eval()
    rng = np.random.default_rng(0)
    a, b, c = (rng.integers(1, 101, n) for n in (13, 20, 7))
    packed, mpacked = _batch([[a, b, c]], 48)
    alone, malone = _batch([[b]], 48)
    with torch.no_grad():
        lp = model(packed["input_ids"], packed["position_ids"], mpacked)
        la = model(alone["input_ids"], alone["position_ids"], malone)
    torch.testing.assert_close(lp[0, 13:33], la[0, :20], atol=1e-5, rtol=1e-5)
    assert packed["position_ids"][0, 13] == 0 and packed["position_ids"][0, 33] == 0


def test_without_the_document_mask_the_result_differs():
    """The check above would be vacuous if the mask did nothing. (Positions restarting per document
    cannot be seen the same way: RoPE scores depend only on relative positions inside a document.)"""
    torch.manual_seed(0)
    model = Llama(_cfg()).eval()
    rng = np.random.default_rng(1)
    a, b = rng.integers(1, 101, 10), rng.integers(1, 101, 12)
    packed, mask = _batch([[a, b]], 48)
    one_segment = DocMask.from_segment_lengths(torch.tensor([48]), 1, 48)
    with torch.no_grad():
        right = model(packed["input_ids"], packed["position_ids"], mask)
        leaky = model(packed["input_ids"], packed["position_ids"], one_segment)
    assert torch.allclose(right[0, :10], leaky[0, :10], atol=1e-6)
    assert not torch.allclose(right[0, 10:22], leaky[0, 10:22], atol=1e-3)


def test_rope_preserves_norm_and_relative_position():
    cos, sin = rope_tables(8, 64, 10000.0)
    x = torch.randn(1, 1, 1, 8)
    y = torch.randn(1, 1, 1, 8)

    def rot(t, p):
        return apply_rope(t, cos[p].view(1, 1, 1, 4), sin[p].view(1, 1, 1, 4))

    torch.testing.assert_close(rot(x, 5).norm(), x.norm())
    # <R(p) x, R(q) y> depends only on p - q
    d1 = (rot(x, 7) * rot(y, 3)).sum()
    d2 = (rot(x, 24) * rot(y, 20)).sum()
    torch.testing.assert_close(d1, d2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tie", [False, True])
def test_parameter_count_and_flops_formula(tie):
    cfg = _cfg(n_kv_heads=2, tie_embeddings=tie)
    model = Llama(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    # by hand: hidden = 64 * ceil(85.33 / 64) = 128; per layer q,o 32*32, k,v 32*16, ffn 3*32*128
    per_layer = 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 128
    assert cfg.hidden == 128
    assert cfg.matmul_params() == 2 * per_layer + 32 * 101
    assert cfg.flops_per_token(48) == 6 * (2 * per_layer + 32 * 101) + 12 * 2 * 32 * 48


def test_loss_sum_ignores_masked_labels():
    logits = torch.randn(1, 4, 7)
    labels = torch.tensor([[3, -100, 5, -100]])
    full = torch.nn.functional.cross_entropy(logits[0], torch.tensor([3, 0, 5, 0]), reduction="none")
    torch.testing.assert_close(token_loss_sum(logits, labels), full[0] + full[2])


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="multiple of model.n_heads"):
        ModelConfig(vocab_size=10, dim=30, n_heads=4)
    with pytest.raises(ValueError, match="unknown fields"):
        ModelConfig.from_dict({"vocab_size": 10, "width": 3})


@pytest.mark.parametrize("whole", [True, False])
def test_compiled_blocks_match_eager_without_recompiling_per_layout(whole):
    """`parallel.compile` compiles each block (attention inside the graph with ``whole``): loss and
    gradients equal the eager model's, and a batch with another segment layout reuses the graphs."""
    from torch._dynamo.utils import counters

    from training.model import compiled_token_loss_sum

    torch.manual_seed(0)
    eager = Llama(_cfg())
    compiled = Llama(_cfg())
    compiled.load_state_dict(eager.state_dict())
    compiled.compile_blocks(whole=whole)
    rng = np.random.default_rng(3)
    layouts = [[[rng.integers(1, 101, n) for n in (13, 20, 7)], [rng.integers(1, 101, 40)]],
               [[rng.integers(1, 101, n) for n in (5, 30)], [rng.integers(1, 101, n) for n in (9, 9, 9, 9)]]]
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for rows in layouts:
        b, mask = _batch(rows, 48)
        losses = []
        for model, loss_fn in ((eager, token_loss_sum), (compiled, compiled_token_loss_sum())):
            model.zero_grad()
            loss = loss_fn(model(b["input_ids"], b["position_ids"], mask), b["labels"])
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-4)
        for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
        graphs.append(int(counters["stats"]["unique_graphs"]))
    assert graphs[0] > 0, "nothing was compiled"
    assert graphs[1] == graphs[0], f"a new segment layout recompiled: {graphs}"


@pytest.mark.parametrize("compiled", [False, True])
def test_activation_checkpointing_same_gradients_less_saved(compiled):
    """`parallel.activation_checkpointing` recomputes blocks in backward: gradients are unchanged
    and what autograd keeps for backward shrinks to about one tensor per block."""
    torch.manual_seed(0)
    cfg = _cfg(n_layers=4)
    plain, ckpt = Llama(cfg), Llama(cfg)
    ckpt.load_state_dict(plain.state_dict())
    ckpt.checkpoint_activations = True
    if compiled:
        plain.compile_blocks()
        ckpt.compile_blocks()
    rng = np.random.default_rng(5)
    b, mask = _batch([[rng.integers(1, 101, n) for n in (13, 20, 15)], [rng.integers(1, 101, 48)]], 48)
    saved = []
    for model in (plain, ckpt):
        total = [0]

        def pack(t, total=total):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = token_loss_sum(model(b["input_ids"], b["position_ids"], mask), b["labels"])
        loss.backward()
        saved.append(total[0])
    for p, q in zip(plain.parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
    assert saved[1] < saved[0] / 3, saved
