"""`llama`: pre-norm decoder with grouped-query attention, RoPE (adjacent pairs) and a SwiGLU MLP.

ref: llama.cpp src/models/llama.cpp (graph); the GGUF converter already permuted attn_q/attn_k for NORM rope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..gguf import GGUFFile
from .cache import KVCache
from .config import context_length, dim, eps, head_counts, layer_count, rope_base, rope_dims, rope_scale
from .layers import Ops, last_or_all, linear, output_head, rms_norm, self_attention, vector


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

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Config:
        n_embd, n_head = dim(f, "embedding_length"), dim(f, "attention.head_count")
        n_head_kv = dim(f, "attention.head_count_kv", n_head)
        head_counts(f, n_head, n_head_kv)
        head_dim = dim(f, "attention.key_length", max(1, n_embd // n_head))
        return cls(
            n_vocab=int(f.tensor("token_embd.weight").shape[0]),
            n_embd=n_embd,
            n_layer=layer_count(f),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=dim(f, "feed_forward_length"),
            n_rot=rope_dims(f, "rope.dimension_count", head_dim),
            n_ctx_train=context_length(f),
            rope_base=rope_base(f, "rope.freq_base", 10000.0),
            rope_scale=rope_scale(f),
            eps=eps(f),
        )


class Block:
    def __init__(self, f: GGUFFile, c: Config, i: int):
        p, q_dim, kv_dim = f"blk.{i}.", c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        self.attn_norm = vector(f, p + "attn_norm.weight", c.n_embd)
        self.attn_q = linear(f, p + "attn_q.weight", q_dim, c.n_embd)
        self.attn_k = linear(f, p + "attn_k.weight", kv_dim, c.n_embd)
        self.attn_v = linear(f, p + "attn_v.weight", kv_dim, c.n_embd)
        self.attn_output = linear(f, p + "attn_output.weight", c.n_embd, q_dim)
        self.ffn_norm = vector(f, p + "ffn_norm.weight", c.n_embd)
        self.ffn_gate = linear(f, p + "ffn_gate.weight", c.n_ff, c.n_embd)
        self.ffn_up = linear(f, p + "ffn_up.weight", c.n_ff, c.n_embd)
        self.ffn_down = linear(f, p + "ffn_down.weight", c.n_embd, c.n_ff)


class Model:
    arch = "llama"

    def __init__(self, f: GGUFFile, ops: Ops):
        self.c = c = Config.from_gguf(f)
        self.ops = ops
        self.n_vocab, self.n_ctx_train = c.n_vocab, c.n_ctx_train
        self.token_embd = linear(f, "token_embd.weight", c.n_vocab, c.n_embd)
        self.blk = [Block(f, c, i) for i in range(c.n_layer)]
        self.output_norm = vector(f, "output_norm.weight", c.n_embd)
        self.output = output_head(f, self.token_embd)

    def make_cache(self, n_ctx: int) -> KVCache:
        c = self.c
        return KVCache(n_ctx, [(c.n_head_kv, c.head_dim, c.head_dim)] * c.n_layer)

    def forward(self, tokens: np.ndarray, positions: np.ndarray, cache: KVCache, logits: str = "last") -> np.ndarray:
        """tokens, positions: int32 (M,) -> logits float32 (M, n_vocab) for "all", (1, n_vocab) for "last"."""
        return last_or_all(self, self.forward_hidden(tokens, positions, cache), logits)

    def head(self, h: np.ndarray) -> np.ndarray:
        """Post-norm hidden (M, n_embd) -> logits (M, n_vocab)."""
        return self.output(self.ops, h)

    def forward_hidden(self, tokens: np.ndarray, positions: np.ndarray, cache: KVCache) -> np.ndarray:
        """tokens, positions: int32 (M,) -> hidden states after output_norm, float32 (M, n_embd)."""
        c, ops, m = self.c, self.ops, tokens.shape[0]
        cache.check_room(int(positions[0]), m)
        scale = 1.0 / math.sqrt(c.head_dim)
        x = self.token_embd.rows(ops, tokens)
        for il, b in enumerate(self.blk):
            h = rms_norm(ops, x, b.attn_norm, c.eps)
            q = b.attn_q(ops, h).reshape(m, c.n_head, c.head_dim)
            k = b.attn_k(ops, h).reshape(m, c.n_head_kv, c.head_dim)
            v = b.attn_v(ops, h).reshape(m, c.n_head_kv, c.head_dim)
            ops.k.rope(q, positions, c.n_rot, c.rope_base, False, None, c.rope_scale, ops.threads)
            ops.k.rope(k, positions, c.n_rot, c.rope_base, False, None, c.rope_scale, ops.threads)
            a = self_attention(ops, cache, il, q, k, v, positions, 0, scale)
            x += b.attn_output(ops, a)
            h = rms_norm(ops, x, b.ffn_norm, c.eps)
            g = b.ffn_gate(ops, h)
            ops.k.silu_mul(g, b.ffn_up(ops, h), g)
            x += b.ffn_down(ops, g)
        cache.advance(int(positions[-1]) + 1)
        return rms_norm(ops, x, self.output_norm, c.eps)
