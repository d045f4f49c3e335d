"""Document-masked attention: every backend available here against the reference, and the reference
against attention run on each document alone (so the mask itself is checked, not just agreement)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.attention import DocMask, available_backends, doc_attention, select_backend

# FlexAttention runs unfused (eager) on CPU and says so: expected here
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

CPU_BACKENDS = [b for b in available_backends("cpu", training=False) if b != "reference"]
TRAIN_BACKENDS = [b for b in available_backends("cpu", training=True) if b != "reference"]


def _mask(rows: list[list[int]], seq_len: int) -> DocMask:
    lens = []
    for row in rows:
        lens += row
        if sum(row) < seq_len:
            lens.append(seq_len - sum(row))  # the pad segment
    return DocMask.from_segment_lengths(torch.tensor(lens), len(rows), seq_len)


def _qkv(b: int, s: int, h: int, hkv: int, d: int, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, h, d, generator=g, dtype=dtype)
    k = torch.randn(b, s, hkv, d, generator=g, dtype=dtype)
    v = torch.randn(b, s, hkv, d, generator=g, dtype=dtype)
    return q, k, v


ROWS = [[5, 17, 9, 1], [32], [3, 3, 20]]  # row 2 ends with 6 pad tokens; one 1-token document


def test_reference_equals_attention_on_each_document_alone():
    mask = _mask(ROWS, 32)
    q, k, v = _qkv(3, 32, 4, 4, 8)
    out = doc_attention(q, k, v, mask, "reference")
    cu = mask.cu_seqlens.long().tolist()
    qf, kf, vf, of = (t.reshape(-1, 4, 8) for t in (q, k, v, out))
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        seg = [t[a:b].transpose(0, 1) for t in (qf, kf, vf)]
        alone = F.scaled_dot_product_attention(*seg, is_causal=True).transpose(0, 1)
        torch.testing.assert_close(of[a:b], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_backend_matches_reference_forward(backend, heads):
    h, hkv = heads
    mask = _mask(ROWS, 32)
    q, k, v = _qkv(3, 32, h, hkv, 16, seed=1)
    with torch.no_grad():
        out = doc_attention(q, k, v, mask, backend)
        ref = doc_attention(q, k, v, mask, "reference")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("backend", TRAIN_BACKENDS)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_backend_matches_reference_backward(backend, heads):
    h, hkv = heads
    mask = _mask(ROWS, 32)
    q, k, v = _qkv(3, 32, h, hkv, 16, seed=1)
    grads = []
    outs = []
    for name in (backend, "reference"):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        out = doc_attention(qq, kk, vv, mask, name)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        outs.append(out.detach())
        grads.append([t.grad for t in (qq, kk, vv)])
    torch.testing.assert_close(outs[0], outs[1], atol=2e-5, rtol=2e-5)
    for g, r in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(g, r, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@torch.no_grad()
def test_a_document_never_sees_another(backend):
    mask = _mask([[10, 22]], 32)
    q, k, v = _qkv(1, 32, 2, 2, 8, seed=2)
    base = doc_attention(q, k, v, mask, backend)
    k2, v2 = k.clone(), v.clone()
    k2[:, :10] += 5.0  # change only the first document
    v2[:, :10] -= 3.0
    moved = doc_attention(q, k2, v2, mask, backend)
    torch.testing.assert_close(moved[:, 10:], base[:, 10:], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(moved[:, :10], base[:, :10])


def test_bf16_sdpa_close_to_fp32_reference():
    mask = _mask(ROWS, 32)
    q, k, v = _qkv(3, 32, 4, 4, 16, seed=3)
    ref = doc_attention(q, k, v, mask, "reference")
    out = doc_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, "sdpa").float()
    torch.testing.assert_close(out, ref, atol=3e-2, rtol=3e-2)


def test_selection_and_bad_layouts():
    assert select_backend("cpu") == "sdpa"
    assert "varlen" not in available_backends("cpu") and "flash_attn" not in available_backends("cpu")
    assert "flex" not in available_backends("cpu") and "flex" in available_backends("cpu", training=False)
    with pytest.raises(ValueError, match="not available on cpu"):
        select_backend("cpu", "varlen")
    with pytest.raises(ValueError, match="unknown attention backend"):
        select_backend("cpu", "magic")
    with pytest.raises(ValueError, match="crosses a row boundary"):
        DocMask.from_segment_lengths(torch.tensor([10, 20, 2]), 2, 16)
    with pytest.raises(ValueError, match="sum to"):
        DocMask.from_segment_lengths(torch.tensor([10, 5]), 1, 16)
