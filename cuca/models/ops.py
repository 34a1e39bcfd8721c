"""`Ops`: the compute backend as the model files see it. Every kernel call and every array the models make go
through these methods, which always pass the configured thread count.

A backend is a kernel module with the signatures of `cuca.kernels._ckernels` (the C extension; its numpy twins in
`cuca.kernels._ref` are the second backend) plus the few array helpers below (`empty`, `concat`, `contiguous`,
...). Both present backends hold numpy arrays, so `Ops` implements the helpers with numpy (the hybrid layers'
element-wise ones, causal_conv, sigmoid and decay, are kernels too); a backend on another array library subclasses
`Ops` and overrides them (the PyTorch one: cuca/gpu/ops.py), and no model file changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .. import kernels
from ..kernels import packing

if TYPE_CHECKING:
    from .layers import Linear


@dataclass(frozen=True)
class Rope:
    """One layer's rotary embedding: the first n_rot dims of each head, NeoX pairing (i, i + n_rot/2) or adjacent
    pairs; angles pos * scale * base^(-2i/n_rot) / freq_factors[i] (freq_factors None: 1)."""

    n_rot: int
    base: float
    neox: bool
    freq_factors: np.ndarray | None = None
    scale: float = 1.0


class Records(NamedTuple):
    """A deferred deltanet call's records (normalised k, d, exp(g) per token and head): the first n of pend are
    applied before the new tokens, whose own go to rec (None: nowhere); defer: the state after them is not stored."""

    pend: np.ndarray | None
    n: int
    rec: np.ndarray | None
    defer: bool


@dataclass(frozen=True)
class Mask:
    """How attention scores are formed: scale, causal window (0 = none), score softcap (0 = none)."""

    scale: float
    window: int = 0
    softcap: float = 0.0


@dataclass(frozen=True, eq=False)
class Residual:
    """One residual step of a block (`Ops.residual`): x += rms_norm(y) * norm_y (y as it is where norm_y is False),
    x *= scale, then the next sub-block's input rms_norm(x) * norm_out (none where norm_out is False). A norm's weight
    None: a norm without one."""

    eps: float
    norm_y: np.ndarray | None | bool = False
    norm_out: np.ndarray | None | bool = False
    scale: float = 1.0


class Ops:
    """The kernel implementation (`k`, a module) and thread count (`threads`, 0 = every core) a model runs with."""

    requantize_drafters = True  # a drafter file's float matrices are stored as Q8_0 (it only proposes)
    coarse_draft_heads = True  # drafters rank the vocabulary with a Q4_0 copy of the head (mtp.py, gemma4_assistant.py)
    relocatable_states = True  # a hybrid cache may swap its live recurrent state for a snapshot slot on rollback
    deferred_states = True  # ... or keep a rollable batch's state updates as records, applied by the next pass
    # batches of at least this many rows run the chunked DeltaNet form (`deltanet_chunked`); None: none do. On the CPU
    # the C recurrence is faster at every length measured (Qwen 3.5 0.8B prefills of 80 / 256 / 1024 tokens: 0.46 /
    # 0.44 / 0.49x the time of the float64 chunked form with its BLAS on one thread, 0.45x at 256 with numpy's BLAS
    # threads spinning beside the pool as they did; AVX2 Zen 3, 2 threads), and it leaves the very state a
    # token-by-token run does, wherever a batch starts
    deltanet_chunk_min: int | None = None
    # a layer's q / k / v and gate / up run as one matmul where the backend packs them into one buffer (`matmuls`):
    # SmolLM2-135M whole passes 0.964-0.976x / 0.907-0.947x the time at M = 1 / 4 (AVX-512), Gemma 3 270M 0.985-1.003x
    # / 0.982-1.011x (q / k and gate / up: v differs in format on some layers), E2B 0.976x / 0.989x (Zen 4, 2
    # threads, on / off alternated in one process, the same logits)
    fuse_projections = True

    def __init__(self, threads: int = 0, impl: ModuleType | None = None):
        self.k: ModuleType = impl if impl is not None else kernels.impl
        self.threads = threads
        self._c_paths: tuple[Any, dict[str, bool]] = (None, {})
        self._ones = np.ones((0, 0), np.float32)
        self.arena = packing.Arena()  # the packed weights' memory (huge pages where the system has them)

    def _c_path(self, kernel: str, steps: tuple[str, ...]) -> bool:
        """Whether the one C call `kernel` may stand for the methods `steps`: the kernel module has it and this class
        keeps Ops' own steps. Checked once per kernel module (hundreds of calls a pass ask)."""
        k, known = self._c_paths
        if k is not self.k:
            known = {}
            self._c_paths = (self.k, known)
        ok = known.get(kernel)
        if ok is None:
            ok = hasattr(self.k, kernel) and all(getattr(type(self), n) is getattr(Ops, n) for n in steps)
            known[kernel] = ok
        return ok

    # ---- arrays (float32, rows first) --------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.empty(shape, np.float32)

    def concat(self, parts: Sequence[np.ndarray], axis: int = 0) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate(parts, axis=axis), np.float32)

    def contiguous(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, np.float32)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, np.float32)

    def copy(self, x: np.ndarray) -> np.ndarray:
        return x.copy()

    def repeat_heads(self, x: np.ndarray, n: int) -> np.ndarray:
        """(M, H, d) -> (M, n * H, d): head j of the result is head j % H of x."""
        return np.tile(x, (1, n, 1))

    def kv_cache(self, n_ctx: int, shapes: list[tuple[int, int, int]]) -> Any:
        """A K/V cache of this backend's arrays (cache.KVCache)."""
        from .cache import KVCache

        return KVCache(n_ctx, shapes)

    def snapshot_buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        """Uninitialised float32 room for the recurrent states after each token of a batch."""
        from .deltanet_state import _aligned

        return _aligned(shape)

    def available_memory(self) -> int | None:
        """Free bytes of the memory the caches live in, None: the host's (LocalModel checks that)."""
        return None

    def bind(self, model: Any) -> Any:
        """A model (or drafter) built on these Ops, as callers use it: here itself (a device backend moves its
        weights to the device and returns a host-facing view)."""
        return model

    # ---- kernels ---------------------------------------------------------------------------------------------
    def matmul(self, w: Linear, x: np.ndarray) -> np.ndarray:
        """x (M, n_in) @ W.T -> (M, n_out)."""
        out = np.empty((x.shape[0], w.n_out), np.float32)
        packing.matmul(self.k, w, x, out, self.threads, self.arena)
        return out

    def matmuls(self, ws: Sequence[Linear], x: np.ndarray) -> list[np.ndarray]:
        """x (M, n_in) @ W.T for weights that take the same x -> one (M, n_out) array each, contiguous. Where
        `fuse_projections` is on and the C backend packs them (or a run of them from the first) into one buffer
        (packing.fused), one kernel call computes those, bit for bit what separate calls give; the rest one
        matmul each."""
        f = (packing.fused(self.k, ws, self.threads, self.arena)
             if self.fuse_projections and type(self).matmul is Ops.matmul else None)
        if f is None:
            return [self.matmul(w, x) for w in ws]
        ys = [np.empty((x.shape[0], w.n_out), np.float32) for w in f.ws]
        self.k.matmul_packed_split(f.p, f.wtype, f.n_rows, f.n_in, x, tuple(ys), self.threads)
        return ys + [self.matmul(w, x) for w in ws[len(f.ws) :]]  # the weights after the run that shares a buffer

    def mlp(self, m: Any, x: np.ndarray) -> np.ndarray:
        """down(act(gate(x)) * up(x)) (M, n_embd) of a gated MLP `m` (ffn_gate / ffn_up / ffn_down, act "silu" or
        "gelu"). One kernel call where the C backend packs gate and up into one buffer (`matmuls`): the bits of the
        steps, which run otherwise."""
        f = (packing.fused(self.k, [m.ffn_gate, m.ffn_up], self.threads, self.arena)
             if self.fuse_projections and self._c_path("mlp", ("matmul", "matmuls", "act_mul")) else None)
        if f is None:
            g, u = self.matmuls([m.ffn_gate, m.ffn_up], x)
            self.act_mul(m.act, g, u, g)
            return self.matmul(m.ffn_down, g)
        down = m.ffn_down
        buf, rows, packed = packing.operand(self.k, down, self.threads, self.arena)
        n, n_ff = x.shape[0], m.ffn_gate.n_out
        g, u, out = self.empty((n, n_ff)), self.empty((n, n_ff)), self.empty((n, down.n_out))
        self.k.mlp(f.p, f.wtype, f.n_rows, buf, down.wtype, rows, packed, x, g, u, out, int(m.act == "gelu"),
                   self.threads)
        return out

    def get_rows(self, w: Linear, ids: np.ndarray) -> np.ndarray:
        """Embedding lookup: dequantized rows `ids` (M,) -> (M, n_in)."""
        out = self.empty((ids.shape[0], w.n_in))
        self.k.get_rows(w.w, w.wtype, w.n_out, w.n_in, ids, out)
        return out

    def rms_norm(self, x: np.ndarray, w: np.ndarray | None, eps: float, out: np.ndarray | None = None) -> np.ndarray:
        """RMS norm over the last axis of x (any leading axes), times w (None: no weight); into `out` if given."""
        out = self.empty(x.shape) if out is None else out
        self.k.rms_norm(x, w, eps, out, self.threads)
        return out

    def residual(self, x: np.ndarray, y: np.ndarray, r: Residual) -> np.ndarray:
        """x (M, n) += y (normed where r says), then scaled, in place; returns rms_norm(x) * r.norm_out (M, n), or
        scratch where r.norm_out is False. One kernel call on the C backend (the bits of the steps one by one);
        a backend with its own rms_norm gets the steps."""
        if not self._c_path("residual_norm", ("rms_norm",)):
            return self._residual_steps(x, y, r)
        out = self.empty(x.shape)
        self.k.residual_norm(x, y, r.norm_y, r.norm_out, r.eps, r.scale, out, self.threads)
        return out

    def _residual_steps(self, x: Any, y: Any, r: Residual) -> Any:
        x += y if r.norm_y is False else self.rms_norm(y, r.norm_y, r.eps)  # type: ignore[arg-type]
        if r.scale != 1.0:
            x *= np.float32(r.scale)
        return y if r.norm_out is False else self.rms_norm(x, r.norm_out, r.eps)  # type: ignore[arg-type]

    def rope(self, x: np.ndarray, positions: np.ndarray, r: Rope) -> None:
        """In place on x (M, n_head, hd)."""
        self.k.rope(x, positions, r.n_rot, r.base, r.neox, r.freq_factors, r.scale, self.threads)

    def act_mul(self, act: str, g: np.ndarray, u: np.ndarray, out: np.ndarray) -> np.ndarray:
        """out = act(g) * u, act "silu" or "gelu" (tanh form); out may be g."""
        fn = self.k.silu_mul if act == "silu" else self.k.gelu_mul
        fn(g, u, out, self.threads)
        return out

    def silu(self, x: np.ndarray) -> np.ndarray:
        """x = silu(x) in place on a contiguous (M, C) array (the activation kernel times ones)."""
        return self.act_mul("silu", x, self._ones_for(*x.shape), x)

    def _ones_for(self, m: int, c: int) -> np.ndarray:
        if self._ones.shape[0] < m or self._ones.shape[1] != c:
            self._ones = np.ones((max(m, self._ones.shape[0]), c), np.float32)
        return self._ones[:m]

    def gdn_core(self, b: Any, proj: Sequence[np.ndarray], window: np.ndarray, state: np.ndarray, records: Records,
                 eps_scale: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray] | None:
        """A Gated DeltaNet layer (qwen35.GDNBlock `b`) between its projections for the rows of one sequence: proj =
        (mixed, z, yb, ya); the conv `window` and recurrent `state` move on in place, the deferred `records` as
        deltanet_deferred; eps_scale = (rms eps, L2 eps, scale) -> (y (M, val_dim) for ssm_out, raw [window | mixed]
        (M + K - 1, C)), in one kernel call (the bits of the steps). None where this backend cannot (a class with
        steps of its own): the caller takes the steps."""
        if not self._c_path("gdn_core", ("sigmoid", "decay", "causal_conv", "silu", "act_mul", "deltanet_deferred",
                                         "rms_norm")):
            return None
        mixed, z, yb, ya = proj
        m, c = mixed.shape
        raw, y = self.empty((m + window.shape[0], c)), self.empty(z.shape)
        self.k.gdn_core(mixed, yb, ya, z, b.ssm_a, b.ssm_dt, window, b.conv_taps, self._ones_for(m, c), raw, state,
                        records.pend, records.n, records.rec, int(records.defer), b.ssm_norm, eps_scale[0],
                        eps_scale[1], eps_scale[2], y, self.threads)
        return y, raw

    def attention(self, q: np.ndarray, kv: tuple[np.ndarray, np.ndarray], positions: np.ndarray, n_kv: int,
                  mask: Mask) -> np.ndarray:
        """q (M, n_head, hd_k) at `positions` against the first n_kv cached positions of kv = (k (n_kv_head, n_ctx,
        hd_k), v (n_kv_head, n_ctx, hd_v)) -> (M, n_head, hd_v)."""
        kc, vc = kv
        out = self.empty((q.shape[0], q.shape[1], vc.shape[2]))
        self.k.attention(q, kc, vc, positions, n_kv, mask.window, mask.scale, mask.softcap, out, self.threads)
        return out

    def attention_core(self, attn: Any, ys: Sequence[np.ndarray], sq: Any) -> np.ndarray | None:
        """A layer's attention (layers.Attention `attn`, `one_call`) from its projections ys (attn_q's, then attn_k's
        and attn_v's where it owns K/V) for the rows of one sequence `sq` -> (M, n_head * hd): q / k / v norms, RoPE,
        the K/V rows stored, attention, in one kernel call (the bits of the steps). None where this backend or the
        cache cannot (a backend with its own kernels, a float16 cache): the caller takes the steps."""
        if not self._c_path("attention_core", ("attention", "rms_norm", "rope")):
            return None
        kc, vc = sq.cache.k[attn.slot], sq.cache.v[attn.slot]
        if not (isinstance(kc, np.ndarray) and kc.dtype == np.float32 and vc.dtype == np.float32):
            return None
        s, m, r = attn.spec, ys[0].shape[0], attn.rope
        q = ys[0].reshape(m, s.n_head, s.head_dim)
        k = v = None
        if len(ys) > 1:
            k = ys[1].reshape(m, s.n_head_kv, s.head_dim)
            v = ys[2].reshape(m, s.n_head_kv, s.head_dim) if len(ys) > 2 else k
        out = self.empty((m, s.n_head, s.head_dim))
        self.k.attention_core(q, k, v, attn.attn_q_norm if s.qk_norm else False,
                              attn.attn_k_norm if s.qk_norm and k is not None else False, None if s.v_norm else False,
                              s.eps, sq.positions, r.n_rot, r.base, r.neox, r.freq_factors, r.scale, kc, vc,
                              sq.pos0 + sq.m, attn.mask.window, attn.mask.scale, attn.mask.softcap, out, self.threads)
        return out.reshape(m, -1)

    def deltanet(self, qkv: tuple[np.ndarray, np.ndarray, np.ndarray], gates: tuple[np.ndarray, np.ndarray],
                 state: np.ndarray, snaps: np.ndarray | None, eps_scale: tuple[float, float]) -> np.ndarray:
        """Gated DeltaNet recurrence: q, k (T, H, dk), v (T, H, dv); gates = (g log-decay, beta) (T, H); state
        (H, dk, dv) updated in place; snaps None or (>= T-1, H, dk, dv) receives the state after each token."""
        q, k, v = qkv
        out = self.empty(v.shape)
        self.k.deltanet(q, k, v, gates[0], gates[1], state, snaps, out, eps_scale[0], eps_scale[1], self.threads)
        return out

    def deltanet_deferred(self, qkv: tuple[np.ndarray, np.ndarray, np.ndarray], gates: tuple[np.ndarray, np.ndarray],
                          state: np.ndarray, records: Records, eps_scale: tuple[float, float]) -> np.ndarray:
        """`deltanet` with deferred commit: records.n pending records applied to state first (and stored), the new
        tokens' records written to records.rec, and with records.defer the state after them left unstored."""
        q, k, v = qkv
        out = self.empty(v.shape)
        self.k.deltanet_deferred(q, k, v, gates[0], gates[1], state, out, records.pend, records.n, records.rec,
                                 int(records.defer), eps_scale[0], eps_scale[1], self.threads)
        return out

    def deltanet_chunked(self, qkv: tuple[np.ndarray, np.ndarray, np.ndarray], gates: tuple[np.ndarray, np.ndarray],
                         state: np.ndarray, out: np.ndarray, scale: float) -> None:
        """The chunked form of `deltanet`: the same results up to rounding, no snapshots. The torch backend's long
        prefills take it (`deltanet_chunk_min`); here it is the float64 reference of that form."""
        from .deltanet_state import gdn_chunked

        gdn_chunked(qkv, gates, state, out, scale)

    def top_groups(self, scores: np.ndarray, k: int, groups: np.ndarray) -> np.ndarray:
        """scores (M, G), groups (G, n) -> per row the ids of its k best-scoring groups, (M, k * n)."""
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        return groups[top].reshape(scores.shape[0], -1)

    def masked_logits(self, w: Linear, ids: np.ndarray, x: np.ndarray, n_vocab: int) -> np.ndarray:
        """Logits (M, n_vocab) of rows x (M, n_in) over only the weight rows ids (M, n_sel) of w; every other id
        gets the row's smallest selected logit - 1. The selected ones come from the same matmul kernel as w's."""
        out = np.empty((x.shape[0], n_vocab), np.float32)
        for i in range(x.shape[0]):
            sel = self.matmul(w.take(ids[i]), x[i : i + 1])
            out[i].fill(sel.min() - np.float32(1.0))
            out[i, ids[i]] = sel[0]
        return out

    # ---- element-wise helpers of the hybrid layers (kernels computing each row alone: batch invariant) -------
    def sigmoid(self, x: np.ndarray) -> np.ndarray:
        """1 / (1 + exp(-x)) of a contiguous (M, H) array, computed in float64."""
        out = self.empty(x.shape)
        self.k.sigmoid(x, out, self.threads)
        return out

    def decay(self, alpha: np.ndarray, a: np.ndarray, dt: np.ndarray) -> np.ndarray:
        """DeltaNet log-decay a * softplus(alpha + dt) of alpha (M, H), a and dt float32 (H,), in float64."""
        out = self.empty(alpha.shape)
        self.k.decay(alpha, a, dt, out, self.threads)
        return out

    def causal_conv(self, window: np.ndarray, x: np.ndarray, taps: Sequence[np.ndarray]) -> tuple[np.ndarray, Any]:
        """Depthwise causal conv of x (M, C) after `window` (K-1, C) with taps (K, C), tap K-1 on the current
        row -> (out (M, C), [window | x] (M+K-1, C)); `window` becomes the next one (its last K-1 rows), in place."""
        m, c = x.shape
        out, raw = self.empty((m, c)), self.empty((m + window.shape[0], c))
        self.k.causal_conv(window, x, taps, raw, out, self.threads)
        return out, raw

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        """cap * tanh(x / cap), in place on float32 x (no-op for cap <= 0); returns x."""
        if cap > 0:
            self.k.softcap(x, cap, self.threads)
        return x

