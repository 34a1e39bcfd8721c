"""`gemma3`: Gemma 3 text decoder: sliding/global layers (5:1), per-head q/k RMS norms, sandwich norms around
attention and MLP, GELU-tanh gated MLP, embeddings scaled by sqrt(n_embd), tied head.

ref: llama.cpp src/models/gemma3.cpp. Norm weights in GGUF already hold (1 + w).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import GGUFError
from ..gguf import GGUFFile
from .batch import Batch, Decoder
from .cache import KVCache
from .config import F32_MAX, INT32_MAX, context_length, dim, eps, head_counts, layer_count, opt, rope_base, rope_scale
from .layers import Attention, AttnSpec, GatedMLP, Mask, Ops, Rope, linear, output_head, sandwich_residuals, vector


@dataclass(frozen=True)
class Config:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx_train: int
    eps: float
    window: int
    swa_pattern: int  # every swa_pattern-th layer is global; 0 = all global
    rope_base: float
    rope_base_swa: float
    rope_scale: float
    attn_scale: float
    final_softcap: float

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Config:
        n_embd, n_head = dim(f, "embedding_length"), dim(f, "attention.head_count")
        n_head_kv = dim(f, "attention.head_count_kv", n_head)
        head_counts(f, n_head, n_head_kv)
        head_dim = dim(f, "attention.key_length")
        if head_dim % 2:  # RoPE rotates the whole head in pairs
            raise GGUFError(f"{f.path}: metadata key {f.arch_key('attention.key_length')!r} must be even, "
                            f"got {head_dim}")
        window = int(opt(f, "attention.sliding_window", int, 0, 0, INT32_MAX))
        n_layer = layer_count(f)
        return cls(
            n_vocab=int(f.tensor("token_embd.weight").shape[0]),
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=dim(f, "feed_forward_length"),
            n_ctx_train=context_length(f),
            eps=eps(f),
            window=window,
            swa_pattern=int(opt(f, "attention.sliding_window_pattern", int, 6, 0, INT32_MAX)) if window > 0 else 0,
            rope_base=rope_base(f, "rope.freq_base", 1e6),
            rope_base_swa=rope_base(f, "rope.freq_base_swa", 10000.0),
            rope_scale=rope_scale(f),
            # gemma3 27B scales by n_embd/n_head instead of head_dim (query_pre_attn_scalar)
            attn_scale=1.0 / math.sqrt(n_embd / n_head if n_layer == 62 else head_dim),
            final_softcap=float(opt(f, "final_logit_softcapping", float, 0.0, 0.0, F32_MAX)),
        )

    def is_swa(self, il: int) -> bool:
        return self.swa_pattern > 0 and il % self.swa_pattern < self.swa_pattern - 1


class Block:
    def __init__(self, f: GGUFFile, c: Config, i: int):
        p, swa = f"blk.{i}.", c.is_swa(i)
        rope = Rope(c.head_dim, c.rope_base_swa if swa else c.rope_base, neox=True,
                    scale=1.0 if swa else c.rope_scale)
        mask = Mask(scale=c.attn_scale, window=c.window if swa else 0)
        spec = AttnSpec(c.n_embd, c.n_head, c.n_head_kv, c.head_dim, rope, mask, eps=c.eps, qk_norm=True)
        self.attn_norm = vector(f, p + "attn_norm.weight", c.n_embd)
        self.attn = Attention(f, p, spec, slot=i)
        self.post_attention_norm = vector(f, p + "post_attention_norm.weight", c.n_embd)
        self.ffn_norm = vector(f, p + "ffn_norm.weight", c.n_embd)
        self.mlp = GatedMLP(f, p, c.n_embd, c.n_ff, act="gelu")
        self.post_ffw_norm = vector(f, p + "post_ffw_norm.weight", c.n_embd)


class Model(Decoder):
    arch = "gemma3"

    def __init__(self, f: GGUFFile, ops: Ops):
        self.c = c = Config.from_gguf(f)
        self.ops = ops
        self.n_vocab, self.n_ctx_train = c.n_vocab, c.n_ctx_train
        self.token_embd = linear(f, "token_embd.weight", c.n_vocab, c.n_embd)
        self.embd_scale = np.float32(math.sqrt(c.n_embd))
        self.blk = [Block(f, c, i) for i in range(c.n_layer)]
        self.output_norm = vector(f, "output_norm.weight", c.n_embd)
        self.output = output_head(f, self.token_embd)
        self.res = sandwich_residuals(self.blk, self.output_norm, c.eps)

    def make_cache(self, n_ctx: int) -> KVCache:
        c = self.c
        return self.ops.kv_cache(n_ctx, [(c.n_head_kv, c.head_dim, c.head_dim)] * c.n_layer)

    def head(self, h: np.ndarray) -> np.ndarray:
        """Post-norm hidden (M, n_embd) -> logits (M, n_vocab), soft-capped."""
        return self.ops.softcap(self.output(self.ops, h), self.c.final_softcap)

    def run(self, batch: Batch) -> np.ndarray:
        """The rows of `batch` -> hidden states after output_norm, float32 (M, n_embd)."""
        c, ops = self.c, self.ops
        x = self.token_embd.rows(ops, batch.tokens)
        x *= self.embd_scale
        h = ops.rms_norm(x, self.blk[0].attn_norm, c.eps)
        for b, (r_attn, r_mlp) in zip(self.blk, self.res, strict=True):
            h = ops.residual(x, b.attn(ops, h, batch), r_attn)
            h = ops.residual(x, b.mlp(ops, h), r_mlp)
        return h
