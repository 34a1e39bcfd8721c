"""`gemma4`: Gemma 4 text decoder (E2B and kin): sliding/full layers with their own head dims and RoPE
(proportional RoPE on full layers through `rope_freqs` divisors), q/k norms with weights and an unweighted v norm,
attention scale 1.0, sandwich norms, GELU-tanh MLP (double-wide on KV-shared layers), per-layer embeddings (PLE),
a learned scalar on the whole residual stream per layer, KV sharing of the trailing layers, final softcap, tied head.

ref: shared/specs/gemma4.md §1-2 (llama.cpp src/models/gemma4.cpp, transformers Gemma4TextModel). Norm weights are
used as stored (`x̂·w`, no `1 + w`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ProviderError
from ..gguf import GGUFFile
from .cache import KVCache
from .config import (
    DIM_MAX,
    F32_MAX,
    INT32_MAX,
    context_length,
    dim,
    eps,
    head_counts,
    items,
    layer_count,
    opt,
    per_layer,
    req,
    rope_base,
    rope_dims,
)
from .layers import Ops, head_norm, last_or_all, linear, output_head, rms_norm, self_attention, softcap, vector


@dataclass(frozen=True)
class Config:
    """Read from the metadata of a `gemma4` or `gemma4-assistant` file (same keys, own prefix)."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    hd: int  # full layers' head dim (attention.key_length)
    hd_swa: int  # sliding layers' head dim (attention.key_length_swa)
    n_rot: int
    n_rot_swa: int
    n_ff: tuple[int, ...]
    swa: tuple[bool, ...]  # True = sliding-window layer
    window: int
    n_shared: int  # trailing layers that reuse the K/V of an earlier layer
    n_ple: int  # per-layer-embedding width (0: none)
    rope_base: float
    rope_base_swa: float
    eps: float
    softcap: float
    n_ctx_train: int

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Config:
        n_layer = layer_count(f)
        hd, hd_swa = dim(f, "attention.key_length"), dim(f, "attention.key_length_swa")
        for k, want in (("attention.value_length", hd), ("attention.value_length_swa", hd_swa)):
            if dim(f, k, want) != want:
                raise ProviderError(f"{f.path}: {f.arch_key(k)} must equal the key length {want}")
        key = f.arch_key("attention.sliding_window_pattern")
        swa = items(f, "attention.sliding_window_pattern", f.require(key), bool, n_layer, (None, None))
        n_head = per_layer(f, "attention.head_count", n_layer, int, (1, DIM_MAX))
        n_head_kv = per_layer(f, "attention.head_count_kv", n_layer, int, (1, DIM_MAX))
        for il in range(n_layer):
            head_counts(f, n_head[il], n_head_kv[il], f"layer {il}: ")
        n_rot, n_rot_swa = rope_dims(f, "rope.dimension_count", hd), rope_dims(f, "rope.dimension_count_swa", hd_swa)
        return cls(
            n_vocab=int(f.tensor("token_embd.weight").shape[0]),
            n_embd=dim(f, "embedding_length"),
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            hd=hd,
            hd_swa=hd_swa,
            n_rot=n_rot,
            n_rot_swa=n_rot_swa,
            n_ff=per_layer(f, "feed_forward_length", n_layer, int, (1, DIM_MAX)),
            swa=swa,
            window=int(req(f, "attention.sliding_window", int, 1, INT32_MAX)),
            n_shared=int(opt(f, "attention.shared_kv_layers", int, 0, 0, n_layer)),
            n_ple=dim(f, "embedding_length_per_layer_input", 0, lo=0),
            rope_base=rope_base(f, "rope.freq_base", 1e6),
            rope_base_swa=rope_base(f, "rope.freq_base_swa", 1e4),
            eps=eps(f),
            softcap=float(opt(f, "final_logit_softcapping", float, 0.0, 0.0, F32_MAX)),
            n_ctx_train=context_length(f),
        )

    @property
    def first_shared(self) -> int:
        return self.n_layer - self.n_shared

    def head_dim(self, il: int) -> int:
        return self.hd_swa if self.swa[il] else self.hd

    def kv_source(self, swa: bool) -> int:
        """The last layer that owns K/V of this type: what KV-shared layers (and a drafter) read."""
        for il in range(self.first_shared - 1, -1, -1):
            if self.swa[il] == swa:
                return il
        raise ProviderError(f"no layer before layer {self.first_shared} owns {'sliding' if swa else 'full'} K/V")


@dataclass(frozen=True)
class Rope:
    """One layer's RoPE: NeoX pairing; full layers divide angles by `rope_freqs` (1e30 = not rotated)."""

    n_rot: int
    base: float
    freq_factors: np.ndarray | None

    def __call__(self, ops: Ops, x: np.ndarray, positions: np.ndarray) -> None:
        ops.k.rope(x, positions, self.n_rot, self.base, True, self.freq_factors, 1.0, ops.threads)


def layer_rope(c: Config, swa: bool, rope_freqs: np.ndarray | None) -> Rope:
    return Rope(c.n_rot_swa, c.rope_base_swa, None) if swa else Rope(c.n_rot, c.rope_base, rope_freqs)


def rope_freqs_of(f: GGUFFile, c: Config) -> np.ndarray | None:
    return vector(f, "rope_freqs.weight", c.n_rot // 2) if not all(c.swa) else None


def out_scale(f: GGUFFile, name: str) -> np.float32:
    return np.float32(vector(f, name, 1)[0]) if name in f.tensors else np.float32(1.0)


class QueryLayer:
    """What a Gemma 4 layer and a drafter layer share: query side, output, norms, MLP, output scale."""

    def __init__(self, f: GGUFFile, c: Config, il: int, rope_freqs: np.ndarray | None):
        p, hd, e, n_head = f"blk.{il}.", c.head_dim(il), c.n_embd, c.n_head[il]
        self.hd, self.n_head = hd, n_head
        self.window = c.window if c.swa[il] else 0
        self.rope = layer_rope(c, c.swa[il], rope_freqs)
        self.attn_norm = vector(f, p + "attn_norm.weight", e)
        self.attn_q = linear(f, p + "attn_q.weight", n_head * hd, e)
        self.attn_q_norm = vector(f, p + "attn_q_norm.weight", hd)
        self.attn_output = linear(f, p + "attn_output.weight", e, n_head * hd)
        self.post_attention_norm = vector(f, p + "post_attention_norm.weight", e)
        self.ffn_norm = vector(f, p + "ffn_norm.weight", e)
        self.ffn_gate = linear(f, p + "ffn_gate.weight", c.n_ff[il], e)
        self.ffn_up = linear(f, p + "ffn_up.weight", c.n_ff[il], e)
        self.ffn_down = linear(f, p + "ffn_down.weight", e, c.n_ff[il])
        self.post_ffw_norm = vector(f, p + "post_ffw_norm.weight", e)
        self.out_scale = out_scale(f, p + "layer_output_scale.weight")


class Block(QueryLayer):
    def __init__(self, f: GGUFFile, c: Config, il: int, rope_freqs: np.ndarray | None):
        super().__init__(f, c, il, rope_freqs)
        p, hd, e, n_kv = f"blk.{il}.", self.hd, c.n_embd, c.n_head_kv[il]
        self.n_head_kv = n_kv
        self.owns_kv = il < c.first_shared
        self.kv_layer = il if self.owns_kv else c.kv_source(c.swa[il])  # K/V tensors on shared layers are ignored
        if self.owns_kv:
            self.attn_k = linear(f, p + "attn_k.weight", n_kv * hd, e)
            self.attn_k_norm = vector(f, p + "attn_k_norm.weight", hd)
            # no attn_v: V is the raw K projection (attention_k_eq_v)
            self.attn_v = linear(f, p + "attn_v.weight", n_kv * hd, e) if p + "attn_v.weight" in f.tensors else None
        if c.n_ple:
            self.inp_gate = linear(f, p + "inp_gate.weight", c.n_ple, e)
            self.proj = linear(f, p + "proj.weight", e, c.n_ple)
            self.post_norm = vector(f, p + "post_norm.weight", e)


def sandwich_mlp(ops: Ops, b: Any, x: np.ndarray, eps: float) -> None:
    """x += post_ffw_norm(down(gelu_tanh(gate(h)) * up(h))), h = ffn_norm(x); in place."""
    h = rms_norm(ops, x, b.ffn_norm, eps)
    g = b.ffn_gate(ops, h)
    ops.k.gelu_mul(g, b.ffn_up(ops, h), g)
    x += rms_norm(ops, b.ffn_down(ops, g), b.post_ffw_norm, eps)


class Model:
    arch = "gemma4"

    def __init__(self, f: GGUFFile, ops: Ops):
        self.c = c = Config.from_gguf(f)
        if c.first_shared < 1:
            raise ProviderError(f"{f.path}: every layer is KV-shared; is this a drafter (gemma4-assistant)?")
        self.ops = ops
        self.n_vocab, self.n_ctx_train = c.n_vocab, c.n_ctx_train
        self.token_embd = linear(f, "token_embd.weight", c.n_vocab, c.n_embd)
        self.embd_scale = np.float32(math.sqrt(c.n_embd))
        if c.n_ple:
            n = c.n_layer * c.n_ple
            self.per_layer_token_embd = linear(f, "per_layer_token_embd.weight", c.n_vocab, n)
            self.per_layer_model_proj = linear(f, "per_layer_model_proj.weight", n, c.n_embd)
            self.per_layer_proj_norm = vector(f, "per_layer_proj_norm.weight", c.n_ple)
        self.rope_freqs = rope_freqs_of(f, c)
        self.blk = [Block(f, c, il, self.rope_freqs) for il in range(c.n_layer)]
        self.output_norm = vector(f, "output_norm.weight", c.n_embd)
        self.output = output_head(f, self.token_embd)

    def make_cache(self, n_ctx: int) -> KVCache:
        """K/V memory only for the layers that own K/V (the first `first_shared`)."""
        return KVCache(n_ctx, [(b.n_head_kv, b.hd, b.hd) for b in self.blk if b.owns_kv])

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """Token embeddings scaled by sqrt(n_embd), (M, n_embd): the model's input, and half the drafter's."""
        x = self.token_embd.rows(self.ops, tokens)
        x *= self.embd_scale
        return x

    def per_layer_inputs(self, tokens: np.ndarray, x0: np.ndarray) -> np.ndarray:
        """PLE (M, n_layer, n_ple): (norm(proj(x0) / sqrt(n_embd)) + table[tok] * sqrt(n_ple)) / sqrt(2)."""
        c, ops, m = self.c, self.ops, tokens.shape[0]
        tok = self.per_layer_token_embd.rows(ops, tokens).reshape(m, c.n_layer, c.n_ple)
        tok *= np.float32(math.sqrt(c.n_ple))
        ctx = self.per_layer_model_proj(ops, x0)
        ctx *= np.float32(1.0 / math.sqrt(c.n_embd))
        ctx = head_norm(ops, ctx.reshape(m, c.n_layer, c.n_ple), self.per_layer_proj_norm, c.eps)
        ctx += tok
        ctx *= np.float32(2.0**-0.5)
        return ctx

    def forward(self, tokens: np.ndarray, positions: np.ndarray, cache: KVCache, logits: str = "last") -> np.ndarray:
        """tokens, positions: int32 (M,) -> logits float32 (M, n_vocab) for "all", (1, n_vocab) for "last"."""
        return last_or_all(self, self.forward_hidden(tokens, positions, cache), logits)

    def head(self, h: np.ndarray) -> np.ndarray:
        """Post-norm hidden (M, n_embd) -> logits (M, n_vocab), soft-capped."""
        return softcap(self.output(self.ops, h), self.c.softcap)

    def forward_hidden(self, tokens: np.ndarray, positions: np.ndarray, cache: KVCache) -> np.ndarray:
        """tokens, positions: int32 (M,) -> hidden states after output_norm, float32 (M, n_embd)."""
        c, ops, m = self.c, self.ops, tokens.shape[0]
        cache.check_room(int(positions[0]), m)
        x = self.embed(tokens)
        ple = self.per_layer_inputs(tokens, x) if c.n_ple else None
        for il, b in enumerate(self.blk):
            h = rms_norm(ops, x, b.attn_norm, c.eps)
            q = head_norm(ops, b.attn_q(ops, h).reshape(m, b.n_head, b.hd), b.attn_q_norm, c.eps)
            b.rope(ops, q, positions)
            k = v = None
            if b.owns_kv:
                k_raw = b.attn_k(ops, h).reshape(m, b.n_head_kv, b.hd)
                v_raw = b.attn_v(ops, h).reshape(m, b.n_head_kv, b.hd) if b.attn_v is not None else k_raw
                k = head_norm(ops, k_raw, b.attn_k_norm, c.eps)
                v = head_norm(ops, v_raw, None, c.eps)  # V: RMS norm without weight, no RoPE
                b.rope(ops, k, positions)
            a = self_attention(ops, cache, b.kv_layer, q, k, v, positions, b.window, 1.0)
            x += rms_norm(ops, b.attn_output(ops, a), b.post_attention_norm, c.eps)
            sandwich_mlp(ops, b, x, c.eps)
            if ple is not None:
                g = b.inp_gate(ops, x)
                ops.k.gelu_mul(g, np.ascontiguousarray(ple[:, il, :]), g)
                x += rms_norm(ops, b.proj(ops, g), b.post_norm, c.eps)
            x *= b.out_scale
        cache.advance(int(positions[-1]) + 1)
        return rms_norm(ops, x, self.output_norm, c.eps)
