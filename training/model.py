"""A small Llama-style decoder for packed, document-masked batches.

RMSNorm, rotary position embeddings whose positions restart at every document (``position_ids``
from the loader), SwiGLU feed-forward, optional grouped-query attention. Attention goes through
``kernels.attention`` so the same model runs flash-attn / PyTorch varlen on CUDA and SDPA on CPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from kernels.attention import DocMask, doc_attention


@dataclass
class ModelConfig:
    vocab_size: int
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: same as n_heads
    ffn_hidden: int | None = None  # None: 8/3 * dim rounded up to multiple_of
    multiple_of: int = 64
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"model.dim {self.dim} is not a multiple of model.n_heads {self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError("model head dim must be even for rotary embeddings")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"model.n_heads {self.n_heads} not a multiple of n_kv_heads {self.kv_heads}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        h = int(8 * self.dim / 3)
        return self.multiple_of * math.ceil(h / self.multiple_of)

    def matmul_params(self) -> int:
        """Parameters that take part in matmuls (all but the input embedding lookup and norms)."""
        attn = self.dim * self.head_dim * (self.n_heads * 2 + self.kv_heads * 2)
        per_layer = attn + 3 * self.dim * self.hidden
        return self.n_layers * per_layer + self.dim * self.vocab_size

    def num_params(self) -> int:
        emb = self.vocab_size * self.dim
        norms = (2 * self.n_layers + 1) * self.dim
        head = 0 if self.tie_embeddings else self.dim * self.vocab_size
        return self.matmul_params() - self.dim * self.vocab_size + emb + head + norms

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 x matmul params + the attention term 12 * L * d * S (PaLM
        appendix B; counts the full S x S score matrix, as MFU is conventionally quoted)."""
        return 6.0 * self.matmul_params() + 12.0 * self.n_layers * self.dim * seq_len

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"model: unknown fields {sorted(unknown)}")
        return cls(**data)


#: named sizes (vocab filled in from the shard set); ~125M and ~350M at a 32k vocabulary
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"dim": 64, "n_layers": 2, "n_heads": 4},
    "small": {"dim": 256, "n_layers": 4, "n_heads": 4},
    "125m": {"dim": 768, "n_layers": 12, "n_heads": 12},
    "350m": {"dim": 1024, "n_layers": 24, "n_heads": 16},
    "1b": {"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8},
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight


def rope_tables(head_dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves of each head (Llama/NeoX layout); ``cos``/``sin``: ``[B, S, 1, D/2]``."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


#: query, key and value of one attention layer, ``[B, S, heads, head_dim]`` each
QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@torch.compiler.disable
def _attend_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: DocMask, backend: str) -> torch.Tensor:
    return doc_attention(q, k, v, mask, backend)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)
        #: set by Llama.compile_blocks(whole=False): q/k/v + RoPE compiled, attention called eagerly between
        self.compiled_qkv: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], QKV] | None = None

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> QKV:
        b, s, _ = x.shape
        hd = self.cfg.head_dim
        q = self.wq(x).view(b, s, self.cfg.n_heads, hd)
        k = self.wk(x).view(b, s, self.cfg.kv_heads, hd)
        v = self.wv(x).view(b, s, self.cfg.kv_heads, hd)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: DocMask,
                backend: str) -> torch.Tensor:
        b, s, _ = x.shape
        if self.compiled_qkv is None:
            q, k, v = self.qkv(x, cos, sin)
            out = doc_attention(q, k, v, mask, backend)
        else:
            q, k, v = self.compiled_qkv(x, cos, sin)
            out = _attend_eager(q, k, v, mask, backend)
        return self.wo(out.reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: DocMask,
                backend: str) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, backend)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    rope_cos: torch.Tensor  # buffers (not parameters, not saved): RoPE tables indexed by position
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig, attention_backend: str = "sdpa") -> None:
        super().__init__()
        self.cfg = cfg
        self.attention_backend = attention_backend
        #: recompute each block in backward instead of storing its activations (parallel.activation_checkpointing)
        self.checkpoint_activations = False
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_emb.weight
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            # residual output projections scaled down with depth (GPT-2 / Llama practice)
            scale = 1 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("wo.weight", "w2.weight")) else 1.0
            nn.init.normal_(p, mean=0.0, std=std * scale)

    def compile_blocks(self, whole: bool = True) -> None:
        """torch.compile every block, as torchtitan does (the blocks share one compiled graph).

        ``whole``: the attention kernel is traced into the block's graph (the varlen kernels are
        custom ops; the segment count is marked dynamic and the row length bounds the segment
        length, so a new layout does not recompile). ``whole=False`` compiles only the dense parts
        (norms, q/k/v + RoPE, SwiGLU) and calls attention eagerly between them: the fallback for a
        torch whose attention op does not trace."""
        for block in self.blocks():
            if whole:
                block.compile()
                continue
            block.attn_norm.compile()
            block.ffn_norm.compile()
            block.ffn.compile()
            block.attn.compiled_qkv = torch.compile(block.attn.qkv)

    def blocks(self) -> list[Block]:
        return cast(list[Block], list(self.layers))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: DocMask) -> torch.Tensor:
        if not position_ids.is_cuda and int(position_ids.max()) >= self.cfg.max_seq_len:  # no sync on GPU
            raise ValueError(f"position {int(position_ids.max())} >= max_seq_len {self.cfg.max_seq_len}")
        cos = self.rope_cos[position_ids].unsqueeze(2)
        sin = self.rope_sin[position_ids].unsqueeze(2)
        mask.prepare(self.attention_backend)
        h = self.tok_emb(input_ids)
        recompute = self.checkpoint_activations and torch.is_grad_enabled()
        for layer in self.layers:
            if recompute:
                # keep only each block's input; its activations are recomputed during backward
                h = torch.utils.checkpoint.checkpoint(layer, h, cos, sin, mask, self.attention_backend,
                                                      use_reentrant=False)
            else:
                h = layer(h, cos, sin, mask, self.attention_backend)
        return self.output(self.norm(h))


@functools.cache
def compiled_token_loss_sum() -> Callable[..., torch.Tensor]:
    """:func:`token_loss_sum` compiled: the fp32 upcast, log-softmax and gather fuse into a couple
    of kernels instead of materializing fp32 logits (the largest activation of a small model)."""
    return torch.compile(token_loss_sum)


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Sum (not mean) of the cross-entropy over valid labels, in fp32: the trainer divides by the
    global count of valid tokens so every token weighs the same whatever rank it landed on."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten().long(), ignore_index=ignore_index,
                           reduction="sum")
