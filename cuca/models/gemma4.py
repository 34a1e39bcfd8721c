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

import numpy as np

from ..errors import ProviderError
from ..gguf import GGUFFile
from .batch import Batch, Decoder
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
from .layers import Attention, AttnSpec, GatedMLP, Mask, Ops, Rope, linear, output_head, sandwich_residuals, vector


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


def attn_spec(c: Config, il: int, rope_freqs: np.ndarray | None) -> AttnSpec:
    """Layer il's attention: NeoX RoPE (full layers divide angles by `rope_freqs`, 1e30 = not rotated), scale 1.0,
    weighted q/k norms and an unweighted v norm."""
    swa = c.swa[il]
    rope = Rope(c.n_rot_swa, c.rope_base_swa, neox=True) if swa else Rope(c.n_rot, c.rope_base, neox=True,
                                                                              freq_factors=rope_freqs)
    return AttnSpec(c.n_embd, c.n_head[il], c.n_head_kv[il], c.head_dim(il), rope,
                    Mask(scale=1.0, window=c.window if swa else 0), eps=c.eps, qk_norm=True, v_norm=True)


def rope_freqs_of(f: GGUFFile, c: Config) -> np.ndarray | None:
    return vector(f, "rope_freqs.weight", c.n_rot // 2) if not all(c.swa) else None


def out_scale(f: GGUFFile, name: str) -> np.float32:
    return np.float32(vector(f, name, 1)[0]) if name in f.tensors else np.float32(1.0)


class QueryLayer:
    """What a Gemma 4 layer and a drafter layer share: norms around `attn` (built by the caller: owning K/V or
    reading a cache layer), the GELU MLP, the output scale."""

    def __init__(self, f: GGUFFile, c: Config, il: int, attn: Attention):
        p, e = f"blk.{il}.", c.n_embd
        self.attn = attn
        self.hd, self.n_head = attn.spec.head_dim, attn.spec.n_head
        self.attn_norm = vector(f, p + "attn_norm.weight", e)
        self.post_attention_norm = vector(f, p + "post_attention_norm.weight", e)
        self.ffn_norm = vector(f, p + "ffn_norm.weight", e)
        self.mlp = GatedMLP(f, p, e, c.n_ff[il], act="gelu")
        self.post_ffw_norm = vector(f, p + "post_ffw_norm.weight", e)
        self.out_scale = out_scale(f, p + "layer_output_scale.weight")
        self.post_norm: np.ndarray | None = None  # the PLE gate's output norm (target layers with PLE)


class Block(QueryLayer):
    def __init__(self, f: GGUFFile, c: Config, il: int, rope_freqs: np.ndarray | None):
        p = f"blk.{il}."
        self.owns_kv = il < c.first_shared
        self.kv_layer = il if self.owns_kv else c.kv_source(c.swa[il])  # K/V tensors on shared layers are ignored
        attn = Attention(f, p, attn_spec(c, il, rope_freqs), self.kv_layer, owns_kv=self.owns_kv)
        super().__init__(f, c, il, attn)
        self.n_head_kv = c.n_head_kv[il]
        if c.n_ple:
            self.inp_gate = linear(f, p + "inp_gate.weight", c.n_ple, c.n_embd)
            self.proj = linear(f, p + "proj.weight", c.n_embd, c.n_ple)
            self.post_norm = vector(f, p + "post_norm.weight", c.n_embd)


class Model(Decoder):
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
        self.res = sandwich_residuals(self.blk, self.output_norm, c.eps)

    def make_cache(self, n_ctx: int) -> KVCache:
        """K/V memory only for the layers that own K/V (the first `first_shared`)."""
        return self.ops.kv_cache(n_ctx, [(b.n_head_kv, b.hd, b.hd) for b in self.blk if b.owns_kv])

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
        ctx = ops.rms_norm(ctx.reshape(m, c.n_layer, c.n_ple), self.per_layer_proj_norm, c.eps)
        ctx += tok
        ctx *= np.float32(2.0**-0.5)
        return ctx

    def head(self, h: np.ndarray) -> np.ndarray:
        """Post-norm hidden (M, n_embd) -> logits (M, n_vocab), soft-capped."""
        return self.ops.softcap(self.output(self.ops, h), self.c.softcap)

    def run(self, batch: Batch) -> np.ndarray:
        """The rows of `batch` -> hidden states after output_norm, float32 (M, n_embd)."""
        c, ops = self.c, self.ops
        x = self.embed(batch.tokens)
        ple = self.per_layer_inputs(batch.tokens, x) if c.n_ple else None
        h = ops.rms_norm(x, self.blk[0].attn_norm, c.eps)
        for il, (b, res) in enumerate(zip(self.blk, self.res, strict=True)):
            h = ops.residual(x, b.attn(ops, h, batch), res[0])
            h = ops.residual(x, b.mlp(ops, h), res[1])
            if ple is not None:
                g = b.inp_gate(ops, x)
                ops.act_mul("gelu", g, ops.contiguous(ple[:, il, :]), g)
                h = ops.residual(x, b.proj(ops, g), res[2])
        return h
