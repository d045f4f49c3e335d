"""Document-masked causal attention: one interface, the fastest available backend chosen at run time.

A packed batch row holds several documents (plus a trailing pad segment); a token may attend only to
earlier tokens of its own segment. Segments are described once per batch by :class:`DocMask`
(cumulative lengths over the flattened ``batch * seq_len`` tokens, as varlen kernels want them, and
a per-token segment id, as mask-based kernels want them). Backends, best first:

- ``flash_attn``: flash-attn's ``flash_attn_varlen_func`` (package installed and CUDA);
- ``varlen``: PyTorch's own FlashAttention varlen kernel (``torch.nn.attention.varlen``), CUDA sm80+;
- ``flex``: FlexAttention with a block-sparse document mask (compiled on CUDA, eager elsewhere);
- ``sdpa``: ``scaled_dot_product_attention`` with a dense block-diagonal causal mask (the CPU path);
- ``reference``: plain fp32 math, for tests.

This module imports only torch (flash-attn lazily), so ``kernels.attention`` stands on its own.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

BACKENDS = ("flash_attn", "varlen", "flex", "sdpa", "reference")


@dataclass
class DocMask:
    """Segment layout of one packed batch; built once and shared by every layer."""

    cu_seqlens: torch.Tensor  # int32 [n_segments + 1], offsets into the flattened batch
    max_seqlen: int
    seq_ids: torch.Tensor  # int64 [batch, seq_len]: segment index of each token (unique per batch)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def batch(self) -> int:
        return self.seq_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.seq_ids.shape[1]

    @classmethod
    def from_segment_lengths(
        cls, seg_lens: torch.Tensor, batch: int, seq_len: int, device: torch.device | str | None = None
    ) -> DocMask:
        """``seg_lens``: lengths of consecutive segments over the flattened batch; rows must end on a
        segment boundary (the loader pads each row with its own pad segment)."""
        seg_lens = torch.as_tensor(seg_lens, dtype=torch.int64).flatten()
        if int(seg_lens.sum()) != batch * seq_len:
            raise ValueError(f"segment lengths sum to {int(seg_lens.sum())}, expected {batch * seq_len}")
        if bool((seg_lens <= 0).any()):
            raise ValueError("segment lengths must be positive")
        cu = torch.zeros(len(seg_lens) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(seg_lens, 0)
        if not bool(torch.isin(torch.arange(0, batch * seq_len + 1, seq_len), cu.long()).all()):
            raise ValueError("a segment crosses a row boundary")
        ids = torch.repeat_interleave(torch.arange(len(seg_lens)), seg_lens).view(batch, seq_len)
        return cls(cu.to(device), int(seg_lens.max()), ids.to(device))

    def to(self, device: torch.device | str) -> DocMask:
        return DocMask(self.cu_seqlens.to(device, non_blocking=True), self.max_seqlen,
                       self.seq_ids.to(device, non_blocking=True))

    def dense(self) -> torch.Tensor:
        """Boolean ``[batch, 1, S, S]`` mask: same segment and not in the future."""
        if "dense" not in self._cache:
            same = self.seq_ids[:, :, None] == self.seq_ids[:, None, :]
            causal = torch.ones(self.seq_len, self.seq_len, dtype=torch.bool, device=same.device).tril()
            self._cache["dense"] = (same & causal).unsqueeze(1)
        return self._cache["dense"]

    def prepare(self, backend: str) -> DocMask:
        """Build what ``backend`` needs from the layout once, outside any compiled region, so that
        compiled blocks only read it. Under torch.compile the number of segments varies per batch:
        it is marked dynamic so a new layout does not recompile."""
        if backend in ("flash_attn", "varlen"):
            torch._dynamo.maybe_mark_dynamic(self.cu_seqlens, 0)
        elif backend == "flex":
            self.block_mask()
        elif backend in ("sdpa", "reference"):
            self.dense()
        return self

    def block_mask(self) -> BlockMask:
        if "block" not in self._cache:
            ids = self.seq_ids

            def doc_causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                           kv_idx: torch.Tensor) -> torch.Tensor:
                return (ids[b, q_idx] == ids[b, kv_idx]) & (q_idx >= kv_idx)

            self._cache["block"] = create_block_mask(
                doc_causal, self.batch, None, self.seq_len, self.seq_len, device=ids.device
            )
        return self._cache["block"]


T = TypeVar("T")

#: PyTorch's varlen attention, the keyword arguments that make it causal, and whether it takes ``enable_gqa``
Varlen = tuple[Callable[..., Any], dict[str, Any], bool]


def _once(find: Callable[[], T]) -> Callable[[], T]:
    """Cache a lookup in a plain list rather than functools.cache: the lookups run first in eager
    code (backend selection), and a compiled block then only reads the list, which Dynamo traces
    without warning about a cache wrapper it cannot honour."""
    found: list[T] = []

    @functools.wraps(find)
    def get() -> T:
        if not found:
            found.append(find())
        return found[0]

    return get


@_once
def _flash_attn_func() -> Callable[..., torch.Tensor] | None:
    try:
        from flash_attn import flash_attn_varlen_func  # optional: a CUDA build of its own, often absent
    except Exception:  # not installed, or built against another torch/CUDA
        return None
    return flash_attn_varlen_func


@_once
def _torch_varlen() -> Varlen | None:
    """PyTorch's varlen entry point and how to ask it for causal attention: ``window_size=(-1, 0)``
    from 2.11 on, ``is_causal=True`` in 2.10; ``enable_gqa`` only where the signature has it."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # probed here: only in torch >= 2.10
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    causal: dict[str, Any]
    if "window_size" in params:
        causal = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        causal = {"is_causal": True}
    else:
        return None
    return varlen_attn, causal, "enable_gqa" in params


def _torch_varlen_ok(device: torch.device) -> bool:
    if device.type != "cuda" or _torch_varlen() is None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 8


def available_backends(device: torch.device | str, training: bool = True) -> list[str]:
    """Backends that can run on ``device`` here, best first. FlexAttention has no backward on CPU,
    so it counts there only for inference."""
    device = torch.device(device)
    found = []
    if device.type == "cuda" and _flash_attn_func() is not None:
        found.append("flash_attn")
    if _torch_varlen_ok(device):
        found.append("varlen")
    if device.type == "cuda" or not training:
        found.append("flex")
    found += ["sdpa", "reference"]
    return found


def select_backend(device: torch.device | str, requested: str = "auto", training: bool = True) -> str:
    """``auto`` picks the best backend for the device: varlen kernels on CUDA, SDPA on CPU (where the
    eager FlexAttention path is slower than a dense mask)."""
    device = torch.device(device)
    have = available_backends(device, training)
    if requested == "auto":
        if device.type == "cuda":
            return have[0]
        return "sdpa"
    if requested not in BACKENDS:
        raise ValueError(f"unknown attention backend {requested!r} (known: {', '.join(BACKENDS)})")
    if requested not in have:
        raise ValueError(f"attention backend {requested!r} is not available on {device} (have: {have})")
    return requested


@functools.cache
def _compiled_flex() -> Callable[..., Any]:
    return torch.compile(flex_attention, dynamic=False)


def doc_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: DocMask, backend: str = "sdpa"
) -> torch.Tensor:
    """Causal attention within documents. ``q``: ``[B, S, H, D]``; ``k``, ``v``: ``[B, S, Hkv, D]``
    with ``H`` a multiple of ``Hkv`` (grouped-query attention). Returns ``[B, S, H, D]``."""
    b, s, h, d = q.shape
    hkv = k.shape[2]
    if h % hkv:
        raise ValueError(f"query heads {h} not a multiple of key/value heads {hkv}")
    gqa = h != hkv
    if backend in ("flash_attn", "varlen"):
        cu = mask.cu_seqlens
        # under torch.compile the row length, a valid bound (segments never cross rows), stands in
        # for the per-batch maximum, which would otherwise recompile the graph for every new value
        max_len = s if torch.compiler.is_compiling() else mask.max_seqlen
        if backend == "flash_attn":
            flash = _flash_attn_func()
            if flash is None:
                raise ValueError("attention backend 'flash_attn' is not available: flash-attn is not installed")
            qf, kf, vf = (t.reshape(b * s, t.shape[2], d) for t in (q, k, v))
            out = flash(qf, kf, vf, cu, cu, max_len, max_len, causal=True)
        else:
            found = _torch_varlen()
            if found is None:
                raise ValueError("attention backend 'varlen' is not available: this torch has no varlen attention")
            varlen_attn, causal, has_gqa = found
            if gqa and not has_gqa:
                k, v = (t.repeat_interleave(h // hkv, dim=2) for t in (k, v))
            qf, kf, vf = (t.reshape(b * s, t.shape[2], d) for t in (q, k, v))
            extra = {"enable_gqa": True} if gqa and has_gqa else {}
            out = varlen_attn(qf, kf, vf, cu, cu, max_len, max_len, **causal, **extra)
        return out.view(b, s, h, d)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
    if backend == "flex":
        # inside a compiled block the plain function is traced into the graph; eager CUDA calls go
        # through a compiled wrapper (eager FlexAttention materializes the scores)
        fn: Callable[..., Any] = flex_attention
        if q.is_cuda and not torch.compiler.is_compiling():
            fn = _compiled_flex()
        out = fn(qt, kt, vt, block_mask=mask.block_mask(), enable_gqa=gqa)
    elif backend == "sdpa":
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask.dense(), enable_gqa=gqa)
    elif backend == "reference":
        out = reference_attention(qt, kt, vt, mask.dense())
    else:
        raise ValueError(f"unknown attention backend {backend!r}")
    return out.transpose(1, 2)


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """softmax(QK^T / sqrt(d) masked) V in fp32; ``[B, H, S, D]`` layout, ``mask`` ``[B, 1, S, S]``."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v.float()).to(q.dtype)
