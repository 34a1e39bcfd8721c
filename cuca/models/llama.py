"""`llama`: pre-norm decoder with grouped-query attention, RoPE (adjacent pairs) and a SwiGLU MLP; Llama 3.1+ files
carry `rope_freqs.weight`, the converter's per-dimension divisors of rope scaling type `llama3` (factor,
low/high_freq_factor, original context length). The dense Qwen files (qwen2.py, qwen3.py) are this decoder with
NeoX RoPE and per-file options (`Options`).

ref: llama.cpp src/models/llama.cpp (graph); the GGUF converter already permuted attn_q/attn_k for NORM rope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import GGUFError
from ..gguf import GGUFFile
from .batch import Batch, Decoder
from .cache import KVCache
from .config import context_length, dim, eps, head_counts, layer_count, rope_base, rope_dims, rope_scale
from .layers import Attention, AttnSpec, GatedMLP, Mask, Ops, Rope, linear, output_head, pre_norm_residuals, vector


@dataclass(frozen=True)
class Config:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_rot: int
    n_ctx_train: int
    rope_base: float
    rope_scale: float
    eps: float
    rope_freqs: np.ndarray | None  # (n_rot / 2,) angle divisors (llama3 rope scaling), None: none

    @classmethod
    def from_gguf(cls, f: GGUFFile, rope_default: float = 10000.0) -> Config:
        n_embd, n_head = dim(f, "embedding_length"), dim(f, "attention.head_count")
        n_head_kv = dim(f, "attention.head_count_kv", n_head)
        head_counts(f, n_head, n_head_kv)
        head_dim = dim(f, "attention.key_length", max(1, n_embd // n_head))
        n_rot = rope_dims(f, "rope.dimension_count", head_dim)
        return cls(
            n_vocab=int(f.tensor("token_embd.weight").shape[0]),
            n_embd=n_embd,
            n_layer=layer_count(f),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=dim(f, "feed_forward_length"),
            n_rot=n_rot,
            n_ctx_train=context_length(f),
            rope_base=rope_base(f, "rope.freq_base", rope_default),
            rope_scale=rope_scale(f),
            eps=eps(f),
            rope_freqs=rope_freqs(f, n_rot),
        )


def rope_freqs(f: GGUFFile, n_rot: int) -> np.ndarray | None:
    """`rope_freqs.weight` when present: finite divisors > 0, one per rotated pair (a 0 would make angles inf)."""
    if "rope_freqs.weight" not in f.tensors:
        return None
    ff = vector(f, "rope_freqs.weight", n_rot // 2)
    if not (np.all(np.isfinite(ff)) and np.all(ff > 0)):
        raise GGUFError(f"{f.path}: tensor 'rope_freqs.weight' must hold finite values > 0")
    return ff


@dataclass(frozen=True)
class Options:
    """What the dense decoders built on this file differ in: RoPE pairing, per-head q/k norms, the default base."""

    neox: bool = False
    qk_norm: bool = False
    rope_default: float = 10000.0


class Block:
    def __init__(self, f: GGUFFile, c: Config, i: int, o: Options):
        p = f"blk.{i}."
        rope = Rope(c.n_rot, c.rope_base, neox=o.neox, freq_factors=c.rope_freqs, scale=c.rope_scale)
        spec = AttnSpec(c.n_embd, c.n_head, c.n_head_kv, c.head_dim, rope, Mask(scale=1.0 / math.sqrt(c.head_dim)),
                        eps=c.eps, qk_norm=o.qk_norm)
        self.attn_norm = vector(f, p + "attn_norm.weight", c.n_embd)
        self.attn = Attention(f, p, spec, slot=i)
        self.ffn_norm = vector(f, p + "ffn_norm.weight", c.n_embd)
        self.mlp = GatedMLP(f, p, c.n_embd, c.n_ff, act="silu")


class Model(Decoder):
    arch = "llama"
    options = Options()

    def __init__(self, f: GGUFFile, ops: Ops):
        o = self.options
        self.c = c = Config.from_gguf(f, o.rope_default)
        self.ops = ops
        self.n_vocab, self.n_ctx_train = c.n_vocab, c.n_ctx_train
        self.token_embd = linear(f, "token_embd.weight", c.n_vocab, c.n_embd)
        self.blk = [Block(f, c, i, o) for i in range(c.n_layer)]
        self.output_norm = vector(f, "output_norm.weight", c.n_embd)
        self.output = output_head(f, self.token_embd)
        self.res = pre_norm_residuals(self.blk, [b.ffn_norm for b in self.blk], self.output_norm, c.eps)

    def make_cache(self, n_ctx: int) -> KVCache:
        c = self.c
        return self.ops.kv_cache(n_ctx, [(c.n_head_kv, c.head_dim, c.head_dim)] * c.n_layer)

    def head(self, h: np.ndarray) -> np.ndarray:
        """Post-norm hidden (M, n_embd) -> logits (M, n_vocab)."""
        return self.output(self.ops, h)

    def run(self, batch: Batch) -> np.ndarray:
        """The rows of `batch` -> hidden states after output_norm, float32 (M, n_embd)."""
        c, ops = self.c, self.ops
        x = self.token_embd.rows(ops, batch.tokens)
        h = ops.rms_norm(x, self.blk[0].attn_norm, c.eps)
        for b, (r_attn, r_mlp) in zip(self.blk, self.res, strict=True):
            h = ops.residual(x, b.attn(ops, h, batch), r_attn)
            h = ops.residual(x, b.mlp(ops, h), r_mlp)
        return h
