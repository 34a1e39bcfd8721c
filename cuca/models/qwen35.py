"""`qwen35`: Qwen 3.5 hybrid decoder: Gated DeltaNet (linear attention) layers with a causal conv and a recurrent
state, every `full_attention_interval`-th layer a gated full-attention layer (per-head q/k norms, partial NeoX RoPE,
sigmoid output gate), SwiGLU MLPs, tied head; optionally one MTP ("nextn") block after the trunk, the in-trunk
draft head.

ref: the spec ../shared/specs/qwen35.md (llama.cpp src/models/qwen35.cpp, transformers modeling_qwen3_5.py).
Norm weights in GGUF already hold (1 + w), except `ssm_norm`; `ssm_a` already holds -exp(A_log).

The recurrent state (HybridCache, its rollback) and the chunked DeltaNet form live in `deltanet_state`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np

from ..errors import GGUFError, ProviderError
from ..gguf import GGUFFile
from .batch import Batch, Decoder, SeqRows
from .cache import KVCache
from .config import (
    F32_MAX,
    F32_TINY,
    INT32_MAX,
    context_length,
    dim,
    eps,
    float_weight,
    head_counts,
    items,
    layer_count,
    opt,
    req,
)
from .deltanet_state import L2_EPS, HybridCache
from .layers import (
    Attention,
    AttnSpec,
    GatedMLP,
    Linear,
    Mask,
    Ops,
    Rope,
    coarse_copy,
    linear,
    output_head,
    pre_norm_residuals,
    vector,
)


@dataclass(frozen=True)
class Config:
    n_vocab: int
    n_embd: int
    n_layer: int  # trunk layers; the MTP block, if any, is blk.{n_layer}
    n_nextn: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_rot: int
    n_ctx_train: int
    rope_base: float
    eps: float
    conv: int
    d_state: int
    k_heads: int
    v_heads: int
    recurrent: tuple[bool, ...]

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Config:
        n_nextn = int(opt(f, "nextn_predict_layers", int, 0, 0, 1))
        n_layer = layer_count(f, lo=1 + n_nextn) - n_nextn  # bounded by the blocks present, before any loop
        rec = f.get(f.arch_key("attention.recurrent_layers"))
        if rec is not None:  # may list the MTP block too: only the trunk's entries count
            rec = rec[:n_layer] if isinstance(rec, list) else rec
            recurrent = items(f, "attention.recurrent_layers", rec, bool, n_layer, (None, None))
        else:
            interval = int(req(f, "full_attention_interval", int, 1, INT32_MAX))
            recurrent = tuple((i + 1) % interval != 0 for i in range(n_layer))
        n_head = dim(f, "attention.head_count")
        n_head_kv = dim(f, "attention.head_count_kv")
        head_counts(f, n_head, n_head_kv)
        head_dim = dim(f, "attention.key_length")
        c = cls(
            n_vocab=int(f.tensor("token_embd.weight").shape[0]),
            n_embd=dim(f, "embedding_length"),
            n_layer=n_layer,
            n_nextn=n_nextn,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=dim(f, "feed_forward_length"),
            n_rot=int(req(f, "rope.dimension_count", int, 2, head_dim)),
            n_ctx_train=context_length(f),
            rope_base=float(req(f, "rope.freq_base", float, F32_TINY, F32_MAX)),
            eps=eps(f),
            conv=int(req(f, "ssm.conv_kernel", int, 1, 1 << 10)),
            d_state=int(req(f, "ssm.state_size", int, 1, 1 << 12)),  # the state is v_heads * d_state^2 floats
            k_heads=dim(f, "ssm.group_count"),
            v_heads=dim(f, "ssm.time_step_rank"),
            recurrent=recurrent,
        )
        if dim(f, "attention.value_length", head_dim) != head_dim:
            raise ProviderError(f"{f.path}: attention key and value lengths differ; not supported")
        if c.k_heads < 1 or c.v_heads % c.k_heads:
            raise ProviderError(f"{f.path}: DeltaNet with {c.k_heads} key heads and {c.v_heads} value heads: the "
                                "value heads must be a multiple of the key heads")
        if dim(f, "ssm.inner_size", c.v_heads * c.d_state) != c.v_heads * c.d_state:
            raise ProviderError(f"{f.path}: ssm.inner_size is not time_step_rank * state_size")
        if c.n_rot % 2:
            raise GGUFError(f"{f.path}: metadata key {f.arch_key('rope.dimension_count')!r} must be even, "
                            f"got {c.n_rot}")
        return c

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.d_state

    @property
    def val_dim(self) -> int:
        return self.v_heads * self.d_state

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.val_dim


def _matrix(f: GGUFFile, name: str, shape: tuple[int, int]) -> np.ndarray:
    return float_weight(f, name, shape)


def attn_spec(c: Config) -> AttnSpec:
    """Gated full attention: attn_q gives per head [query | gate]; q/k norms; partial NeoX RoPE."""
    return AttnSpec(c.n_embd, c.n_head, c.n_head_kv, c.head_dim, Rope(c.n_rot, c.rope_base, neox=True),
                    Mask(scale=1.0 / math.sqrt(c.head_dim)), eps=c.eps, qk_norm=True, gated=True)


class AttnBlock:
    """A gated full-attention layer; `slot`: its K/V layer in the cache (attention layers counted alone)."""

    recurrent = False

    def __init__(self, f: GGUFFile, c: Config, i: int, slot: int):
        p = f"blk.{i}."
        self.attn_norm = vector(f, p + "attn_norm.weight", c.n_embd)
        self.post_attention_norm = vector(f, p + "post_attention_norm.weight", c.n_embd)
        self.attn = Attention(f, p, attn_spec(c), slot)
        self.ffn = GatedMLP(f, p, c.n_embd, c.n_ff, act="silu")


class GDNBlock:
    """Gated DeltaNet: attn_qkv -> causal depthwise conv (state: the last conv-1 raw rows) -> SiLU -> q|k|v."""

    recurrent = True

    def __init__(self, f: GGUFFile, c: Config, i: int):
        p = f"blk.{i}."
        self.attn_norm = vector(f, p + "attn_norm.weight", c.n_embd)
        self.post_attention_norm = vector(f, p + "post_attention_norm.weight", c.n_embd)
        self.attn_qkv = linear(f, p + "attn_qkv.weight", c.conv_dim, c.n_embd)
        self.attn_gate = linear(f, p + "attn_gate.weight", c.val_dim, c.n_embd)
        self.ssm_conv1d = _matrix(f, p + "ssm_conv1d.weight", (c.conv_dim, c.conv))
        self.conv_taps = np.ascontiguousarray(self.ssm_conv1d.T)  # (conv, conv_dim): tap j is row j
        self.ssm_dt = vector(f, p + "ssm_dt.bias", c.v_heads)
        self.ssm_a = vector(f, p + "ssm_a", c.v_heads)
        self.ssm_beta = linear(f, p + "ssm_beta.weight", c.v_heads, c.n_embd)
        self.ssm_alpha = linear(f, p + "ssm_alpha.weight", c.v_heads, c.n_embd)
        self.ssm_norm = vector(f, p + "ssm_norm.weight", c.d_state)
        self.ssm_out = linear(f, p + "ssm_out.weight", c.n_embd, c.val_dim)
        self.ffn = GatedMLP(f, p, c.n_embd, c.n_ff, act="silu")


class MTPHead:
    """The nextn block: (token, hidden) -> eh_proj([enorm(embed), hnorm(hidden)]) -> gated-attention block ->
    shared_head_norm. Embedding and head fall back to the trunk's token_embd; the head norm to output_norm."""

    def __init__(self, f: GGUFFile, c: Config, token_embd: Linear, output_norm: np.ndarray):
        i = c.n_layer
        p = f"blk.{i}.nextn."
        self.blk = AttnBlock(f, c, i, slot=0)
        self.eh_proj = linear(f, p + "eh_proj.weight", c.n_embd, 2 * c.n_embd)
        self.enorm = vector(f, p + "enorm.weight", c.n_embd)
        self.hnorm = vector(f, p + "hnorm.weight", c.n_embd)
        has = f.tensors.__contains__
        self.head_norm = (vector(f, p + "shared_head_norm.weight", c.n_embd)
                          if has(p + "shared_head_norm.weight") else output_norm)
        self.embed = (linear(f, p + "embed_tokens.weight", c.n_vocab, c.n_embd)
                      if has(p + "embed_tokens.weight") else token_embd)
        self.head = (linear(f, p + "shared_head_head.weight", c.n_vocab, c.n_embd)
                     if has(p + "shared_head_head.weight") else token_embd)
        self._heads: dict[int, Linear] = {}

    def head_rows(self, n: int) -> Linear:
        """The head restricted to its first n rows (token ids 0..n-1): a view, no copy."""
        if n >= self.head.n_out:
            return self.head
        if n not in self._heads:
            lin = copy.copy(self.head)
            lin.w, lin.n_out = self.head.w[:n], n
            self._heads[n] = lin
        return self._heads[n]

    def coarse_rows(self, n: int) -> Linear | None:
        """A Q4_0 copy of `head_rows(n)`, made once (about 0.9 s and 38 MB for Qwen 3.5 0.8B's 65,536 x 1024
        Q8_0 rows); None where `layers.coarse_copy` makes none (a small head, or one not Q8_0 or float)."""
        key = -n  # beside head_rows' entries in the same cache
        if key not in self._heads:
            rough = coarse_copy(self.head_rows(n))
            if rough is None:
                return None
            self._heads[key] = rough
        return self._heads[key]


class Model(Decoder):
    arch = "qwen35"
    # batches of at least this many tokens (beyond any rollback) use the chunked DeltaNet form: the backend's choice
    # (Ops.deltanet_chunk_min; None, the CPU's: none, the recurrence is faster there)
    chunked_prefill_min: int | None = None

    def __init__(self, f: GGUFFile, ops: Ops):
        self.c = c = Config.from_gguf(f)
        self.ops = ops
        if ops.deltanet_chunk_min is not None:
            self.chunked_prefill_min = ops.deltanet_chunk_min
        self.path = f.path
        self.n_vocab, self.n_ctx_train = c.n_vocab, c.n_ctx_train
        self.token_embd = linear(f, "token_embd.weight", c.n_vocab, c.n_embd)
        # index of each layer within its kind: attention layers own a KV slot, DeltaNet layers a state
        counts = [0, 0]
        self.slot: list[int] = []
        for r in c.recurrent:
            self.slot.append(counts[r])
            counts[r] += 1
        self.blk: list[AttnBlock | GDNBlock] = [
            GDNBlock(f, c, i) if c.recurrent[i] else AttnBlock(f, c, i, self.slot[i]) for i in range(c.n_layer)
        ]
        self.output_norm = vector(f, "output_norm.weight", c.n_embd)
        self.output = output_head(f, self.token_embd)
        self.res = pre_norm_residuals(self.blk, [b.post_attention_norm for b in self.blk], self.output_norm, c.eps)
        self.mtp: MTPHead | None = (
            MTPHead(f, c, self.token_embd, self.output_norm) if c.n_nextn > 0 else None
        )

    # ---- caches ---------------------------------------------------------------------------------------------
    def make_cache(self, n_ctx: int) -> HybridCache:
        return HybridCache(n_ctx, self.c, self.ops)

    def make_mtp_cache(self, n_ctx: int) -> KVCache:
        """The MTP block's own K/V (one layer)."""
        c = self.c
        return self.ops.kv_cache(n_ctx, [(c.n_head_kv, c.head_dim, c.head_dim)])

    # ---- trunk ----------------------------------------------------------------------------------------------
    def head(self, h: np.ndarray) -> np.ndarray:
        """Post-norm hidden (M, n_embd) -> logits (M, n_vocab) over the whole vocabulary."""
        return self.output(self.ops, h)

    def run(self, batch: Batch) -> np.ndarray:
        """The rows of `batch` -> hidden states after output_norm, float32 (M, n_embd)."""
        c, ops = self.c, self.ops
        # per sequence: keep the state updates rollable (records, or snapshots), or the chunked form (long prefill)
        cmin = self.chunked_prefill_min
        chunked = [not s.cache.begin(s.m) and cmin is not None and s.m >= cmin for s in batch.seqs]
        x = self.token_embd.rows(ops, batch.tokens)
        h = ops.rms_norm(x, self.blk[0].attn_norm, c.eps)
        for il, (b, (r_mix, r_ffn)) in enumerate(zip(self.blk, self.res, strict=True)):
            y = self._gdn(b, self.slot[il], h, batch, chunked) if isinstance(b, GDNBlock) else b.attn(ops, h, batch)
            h = ops.residual(x, y, r_mix)
            h = ops.residual(x, b.ffn(ops, h), r_ffn)
        return h

    def _gdn(self, b: GDNBlock, li: int, h: np.ndarray, batch: Batch, chunked: list[bool]) -> np.ndarray:
        c, ops, n = self.c, self.ops, h.shape[0]
        # mixed (n, conv_dim): q | k | v, before the conv; the four projections of h in one call where they can
        mixed, z, yb, ya = ops.matmuls([b.attn_qkv, b.attn_gate, b.ssm_beta, b.ssm_alpha], h)
        kd, ds = c.key_dim, c.d_state
        scale = 1.0 / math.sqrt(ds)
        s0 = batch.seqs[0]
        if len(batch.seqs) == 1 and not chunked[0] and s0.cache.deferred and c.k_heads == c.v_heads:
            # one sequence, deferred records: the steps below in one kernel call (their bits)
            core = ops.gdn_core(b, (mixed, z, yb, ya), s0.cache.conv[li], s0.cache.ssm[li], s0.cache.records(li),
                                (c.eps, L2_EPS, scale))
            if core is not None:
                s0.cache.keep_raw(li, core[1])
                return b.ssm_out(ops, core[0])
        beta = ops.sigmoid(yb)
        g = ops.decay(ya, b.ssm_a, b.ssm_dt)
        parts = []
        for s, chunk in zip(batch.seqs, chunked, strict=True):
            r, m, cache = s.rows, s.m, s.cache
            # causal depthwise conv over [window | new rows]; tap conv-1 multiplies the current row
            x, raw = ops.causal_conv(cache.conv[li], mixed[r], b.conv_taps)  # the window moves on in place
            cache.keep_raw(li, raw)
            ops.silu(x)
            q = x[:, :kd].reshape(m, c.k_heads, ds)
            k = x[:, kd : 2 * kd].reshape(m, c.k_heads, ds)
            if c.k_heads != c.v_heads:  # fewer key heads: the converter tiles V heads, value head j reads j % k_heads
                q, k = ops.repeat_heads(q, c.v_heads // c.k_heads), ops.repeat_heads(k, c.v_heads // c.k_heads)
            v = x[:, 2 * kd :].reshape(m, c.v_heads, ds)
            if chunk:
                o = ops.empty((m, c.v_heads, ds))
                ops.deltanet_chunked((q, k, v), (g[r], beta[r]), cache.ssm[li], o, scale)
            elif cache.deferred:
                o = ops.deltanet_deferred((q, k, v), (g[r], beta[r]), cache.ssm[li], cache.records(li), (L2_EPS, scale))
            else:
                o = ops.deltanet((q, k, v), (g[r], beta[r]), cache.ssm[li], cache.snaps(li), (L2_EPS, scale))
            parts.append(o)
        o = parts[0] if len(parts) == 1 else ops.concat(parts)
        y = ops.rms_norm(o, b.ssm_norm, c.eps)
        ops.act_mul("silu", z.reshape(n, c.v_heads, ds), y, y)
        return b.ssm_out(ops, y.reshape(n, c.val_dim))

    # ---- MTP head -------------------------------------------------------------------------------------------
    def mtp_forward(self, tokens: np.ndarray, hidden: np.ndarray, positions: np.ndarray, cache: KVCache,
                    last_only: bool = False) -> np.ndarray:
        """One MTP pass: tokens (M,) int32 with the hidden states (M, n_embd) they follow (the trunk's post-norm
        rows, or the head's own output when chaining) at positions (M,) -> the head's post-norm hidden (M, n_embd).
        Writes K/V at `positions` of `cache` (the head's own). `last_only`: only the last row's output (1, n_embd);
        the rows before it only write their K/V (no query, attention, output projection or FFN: the drafter's
        catch-up on committed rows), the same bits as the full pass (batch-invariant kernels)."""
        mtp, c, ops, m = self.mtp, self.c, self.ops, tokens.shape[0]
        if mtp is None:
            raise ProviderError(f"{self.path}: the file has no prediction head")
        cache.check_room(int(positions[0]), m)
        e = ops.rms_norm(mtp.embed.rows(ops, tokens), mtp.enorm, c.eps)
        hh = ops.rms_norm(ops.contiguous(hidden), mtp.hnorm, c.eps)
        u = mtp.eh_proj(ops, ops.concat([e, hh], axis=1))
        b = mtp.blk
        if last_only and m > 1:
            hn = ops.rms_norm(u, b.attn_norm, c.eps)
            k, v = b.attn.keys_values(ops, hn, positions)
            cache.store(b.attn.slot, int(positions[0]), k, v)
            last = positions[-1:]
            q, gate = b.attn.query(ops, ops.contiguous(hn[-1:]), last)
            u = ops.contiguous(u[-1:])
            u += b.attn.output(ops, b.attn.attend(ops, q, last, cache, int(last[0]) + 1), gate)
        else:
            u += b.attn(ops, ops.rms_norm(u, b.attn_norm, c.eps), Batch([SeqRows(tokens, positions, cache)]))
        u += b.ffn(ops, ops.rms_norm(u, b.post_attention_norm, c.eps))
        cache.advance(int(positions[-1]) + 1)
        return ops.rms_norm(u, mtp.head_norm, c.eps)

    def mtp_logits(self, h: np.ndarray, n_rank: int, coarse: bool = False) -> np.ndarray:
        """The head's logits over token ids 0..n_rank-1 only, (M, n_rank); `coarse`: from its Q4_0 copy where
        `MTPHead.coarse_rows` makes one."""
        assert self.mtp is not None
        rows = self.mtp.coarse_rows(n_rank) if coarse else None
        return (rows or self.mtp.head_rows(n_rank))(self.ops, h)

    def mtp_logits_of(self, h: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The head's own logits of h (1, n_embd) for token ids `ids` (n,) only, (n,): the same bits as those ids'
        columns of `mtp_logits` (a row's result does not depend on the rows beside it)."""
        assert self.mtp is not None
        return self.ops.matmul(self.mtp.head.take(ids), h)[0]
