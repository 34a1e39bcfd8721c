"""Shared blocks for the architecture files: bound weights (`Linear`, `vector`), the attention sub-block
(`Attention`: projections, q/k norms, a `Rope`, the cache slot) and the gated MLP (`GatedMLP`).

Every call here goes through `Ops`, whose kernels are batch invariant (never BLAS), so a row's result does not
depend on how many rows travel with it: that is what makes speculative verification equal plain decoding bit for
bit, and rows of several sequences in one pass equal each sequence run alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ProviderError
from ..gguf import GGUFFile, TensorInfo
from ..quants import FLOAT_TYPES, Q4_0, Q8_0, SUPPORTED_TYPES, dequantize, quantize_q4_0, quantize_q8_0, row_bytes
from .batch import Batch
from .config import float_weight
from .ops import Mask, Ops, Residual, Rope

__all__ = ["Attention", "AttnSpec", "GatedMLP", "Linear", "Mask", "Ops", "Residual", "Rope", "linear",
           "next_input_norms", "output_head", "pre_norm_residuals", "sandwich_residuals", "vector"]


class Linear:
    """A GGUF weight (n_out, n_in) in any supported block format, applied as x @ W.T."""

    # _packed: the C backend's row-interleaved copy of w (cuca.kernels.packing), made at the first matmul;
    # _owned: w was made by this process (requantized), not mapped from a file;
    # _fused: the one packed buffer of the weights this one leads in `Ops.matmuls` (packing.Fused; False: none)
    __slots__ = ("name", "w", "wtype", "n_out", "n_in", "_packed", "_owned", "_fused")

    def __init__(self, t: TensorInfo, path: object = ""):
        if t.ggml_type not in SUPPORTED_TYPES or len(t.shape) != 2:
            raise ProviderError(f"{path}: tensor {t.name!r} has unsupported type {t.type_name} or shape {t.shape}")
        self.name = t.name
        self.w = t.data
        self.wtype = t.ggml_type
        self.n_out, self.n_in = t.shape
        self._packed: object = None
        self._owned = False
        self._fused: object = None
        assert self.w.nbytes == self.n_out * row_bytes(self.wtype, self.n_in)

    def __call__(self, ops: Ops, x: np.ndarray) -> np.ndarray:
        return ops.matmul(self, x)

    def as_q8_0(self) -> Linear:
        """This weight stored as Q8_0 (float matrices only; quantized ones are returned as they are)."""
        if self.wtype not in FLOAT_TYPES or self.n_in % 32:
            return self
        return self._requantized(Q8_0)

    def as_q4_0(self) -> Linear:
        """A Q4_0 copy of this weight (float or Q8_0 matrices; others are returned as they are): a drafter's
        coarse head, which only ranks candidates."""
        if (self.wtype not in FLOAT_TYPES and self.wtype != Q8_0) or self.n_in % 32:
            return self
        return self._requantized(Q4_0)

    def take(self, ids: np.ndarray) -> Linear:
        """The rows `ids` (n,) of this weight as a weight of their own, contiguous (np.take: 3x a fancy-index copy);
        a matmul with it gives those rows' bits of the whole weight's (the kernels compute each row alone)."""
        new = object.__new__(Linear)
        new.name, new.wtype, new.n_out, new.n_in = self.name, self.wtype, int(ids.shape[0]), self.n_in
        new._packed, new._owned, new._fused = None, False, None
        new.w = np.take(self.w, ids, axis=0)
        return new

    def _requantized(self, wtype: int) -> Linear:
        new = object.__new__(Linear)
        new.name, new.wtype, new.n_out, new.n_in = self.name, wtype, self.n_out, self.n_in
        new._packed, new._owned, new._fused = None, True, None
        new.w = np.empty((self.n_out, row_bytes(wtype, self.n_in)), np.uint8)
        quantize = quantize_q8_0 if wtype == Q8_0 else quantize_q4_0
        for r0 in range(0, self.n_out, 8192):  # bounded float32 scratch for 262k-row tables
            rows = dequantize(self.w[r0 : r0 + 8192], self.wtype, min(8192, self.n_out - r0), self.n_in)
            new.w[r0 : r0 + 8192] = quantize(rows)
        return new

    def rows(self, ops: Ops, ids: np.ndarray) -> np.ndarray:
        """Embedding lookup: dequantized rows `ids` (M,) -> (M, n_in)."""
        return ops.get_rows(self, ids)


def linear(f: GGUFFile, name: str, n_out: int, n_in: int) -> Linear:
    return Linear(f.tensor(name, (n_out, n_in)), f.path)


def output_head(f: GGUFFile, token_embd: Linear) -> Linear:
    """`output.weight`, or the token embedding itself when the head is tied (no copy either way)."""
    if "output.weight" not in f.tensors:
        return token_embd
    return linear(f, "output.weight", token_embd.n_out, token_embd.n_in)


def next_input_norms(blk: Sequence[Any], output_norm: np.ndarray) -> list[np.ndarray]:
    """Per layer, the norm its last residual add hands on (`Residual.norm_out`): the next layer's attn_norm, and
    output_norm after the last layer."""
    return [b.attn_norm for b in blk[1:]] + [output_norm]


def pre_norm_residuals(blk: Sequence[Any], mid_norms: Sequence[np.ndarray], output_norm: np.ndarray,
                       eps: float) -> list[tuple[Residual, Residual]]:
    """A pre-norm layer's two residual steps (`Ops.residual`): x += the mixer's output, handing on the layer's second
    input norm (mid_norms, one per layer); x += the FFN's output, handing on the next layer's input norm."""
    nxt = next_input_norms(blk, output_norm)
    return [(Residual(eps, norm_out=m), Residual(eps, norm_out=n)) for m, n in zip(mid_norms, nxt, strict=True)]


def sandwich_residuals(blk: Sequence[Any], output_norm: np.ndarray, eps: float) -> list[tuple[Residual, ...]]:
    """A sandwich-norm layer's residual steps (Gemma 3, Gemma 4 and its drafter): x += post_attention_norm(attn),
    handing on ffn_norm; x += post_ffw_norm(mlp); and where the layer has a PLE gate (`post_norm` set), x +=
    post_norm(gate). The last add takes the layer's `out_scale` where it has one and hands on the next layer's input
    norm (output_norm after the last layer)."""
    out: list[tuple[Residual, ...]] = []
    for b, n in zip(blk, next_input_norms(blk, output_norm), strict=True):
        after_attn, s = Residual(eps, b.post_attention_norm, b.ffn_norm), float(getattr(b, "out_scale", 1.0))
        if getattr(b, "post_norm", None) is not None:
            out.append((after_attn, Residual(eps, b.post_ffw_norm), Residual(eps, b.post_norm, n, s)))
        else:
            out.append((after_attn, Residual(eps, b.post_ffw_norm, n, s)))
    return out


def vector(f: GGUFFile, name: str, n: int) -> np.ndarray:
    """A 1-D float weight (norms), as contiguous float32 (F32 or F16 only: other types are raw blocks)."""
    return float_weight(f, name, (n,))


# A drafter's coarse ranking (mtp.py, gemma4_assistant.py): a head of at least COARSE_MIN_WEIGHTS weights ranks the
# vocabulary with a Q4_0 copy of itself, and a greedy draft rescores the copy's RESCORE best rows with the head
COARSE_MIN_WEIGHTS = 1 << 22  # smaller heads (tiny files) cost little: no copy
RESCORE = 8


def coarse_copy(w: Linear) -> Linear | None:
    """The Q4_0 ranking copy of a drafter head w (Linear.as_q4_0, made now), or None where w is smaller than
    COARSE_MIN_WEIGHTS or in a format as_q4_0 keeps as it is."""
    if w.n_out * w.n_in < COARSE_MIN_WEIGHTS:
        return None
    rough = w.as_q4_0()
    return None if rough is w else rough


def requantize(obj: Any) -> None:
    """Store every float `Linear` of obj (and of the blocks it holds) as Q8_0."""
    for name, v in vars(obj).items():
        if isinstance(v, Linear):
            setattr(obj, name, v.as_q8_0())
        elif isinstance(v, (Attention, GatedMLP)):
            requantize(v)


@dataclass(frozen=True)
class AttnSpec:
    """The geometry and options of one attention sub-block."""

    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope: Rope
    mask: Mask
    eps: float = 0.0  # of the q/k/v norms
    qk_norm: bool = False  # per-head RMS norms of q and k with weights attn_q_norm / attn_k_norm
    v_norm: bool = False  # unweighted per-head RMS norm of v (Gemma 4)
    gated: bool = False  # attn_q gives per head [query | gate]; the output is multiplied by sigmoid(gate)


class Attention:
    """Self-attention over each sequence's cache: q/k/v projections (no attn_v: v is the k projection), norms,
    RoPE at the rows' positions, K/V stored in cache layer `slot`, output projection. `owns_kv=False`: only the
    query side; the layer reads the K/V another layer wrote at `slot` (KV sharing, drafters). The q/k/v
    projections add their `.bias` vectors where the file has them (Qwen 2)."""

    def __init__(self, f: GGUFFile, prefix: str, spec: AttnSpec, slot: int, *, owns_kv: bool = True):
        s, e, hd = spec, spec.n_embd, spec.head_dim
        self.spec, self.slot, self.owns_kv = spec, slot, owns_kv
        self.rope, self.mask = spec.rope, spec.mask
        self.attn_q = linear(f, prefix + "attn_q.weight", (2 if s.gated else 1) * s.n_head * hd, e)
        self.attn_output = linear(f, prefix + "attn_output.weight", e, s.n_head * hd)
        self.attn_q_norm = vector(f, prefix + "attn_q_norm.weight", hd) if s.qk_norm else None
        self.bq = _bias(f, prefix + "attn_q.bias", self.attn_q.n_out)
        if owns_kv:
            kv_dim = s.n_head_kv * hd
            self.attn_k = linear(f, prefix + "attn_k.weight", kv_dim, e)
            self.attn_k_norm = vector(f, prefix + "attn_k_norm.weight", hd) if s.qk_norm else None
            name = prefix + "attn_v.weight"
            self.attn_v = linear(f, name, kv_dim, e) if name in f.tensors else None
            self.bk = _bias(f, prefix + "attn_k.bias", kv_dim)
            self.bv = _bias(f, prefix + "attn_v.bias", kv_dim) if self.attn_v is not None else None
        # the steps from the projections to the attention output can run as one `Ops.attention_core` call: no gate
        # and no biases
        self.one_call = not s.gated and self.bq is None and (not owns_kv or (self.bk is None and self.bv is None))

    def query(self, ops: Ops, h: np.ndarray, positions: np.ndarray,
              y: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """h (M, n_embd) -> (roped, normed q (M, n_head, hd), gate (M, n_head * hd) or None); y: attn_q's output
        already computed (projections), else it is computed here."""
        s, m, hd = self.spec, h.shape[0], self.spec.head_dim
        y = self.attn_q(ops, h) if y is None else y
        gate = None
        if s.gated:
            qg = _add(y, self.bq).reshape(m, s.n_head, 2 * hd)
            q = ops.rms_norm(qg[:, :, :hd], self.attn_q_norm, s.eps)
            gate = qg[:, :, hd:].reshape(m, -1)
        else:
            q = _add(y, self.bq).reshape(m, s.n_head, hd)
            if s.qk_norm:
                q = ops.rms_norm(q, self.attn_q_norm, s.eps)
        ops.rope(q, positions, self.rope)
        return q, gate

    def projections(self, ops: Ops, h: np.ndarray) -> list[np.ndarray]:
        """attn_q, attn_k (and attn_v) of h in one `Ops.matmuls` call."""
        ws = [self.attn_q, self.attn_k] + ([self.attn_v] if self.attn_v is not None else [])
        return ops.matmuls(ws, h)

    def keys_values(self, ops: Ops, h: np.ndarray, positions: np.ndarray,
                    ys: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, np.ndarray]:
        """h (M, n_embd) -> (roped, normed k, v), each (M, n_head_kv, hd); ys: attn_k's and attn_v's outputs already
        computed (projections), else they are computed here."""
        s, m, hd = self.spec, h.shape[0], self.spec.head_dim
        yk = ys[0] if ys else self.attn_k(ops, h)
        k = _add(yk, self.bk).reshape(m, s.n_head_kv, hd)
        if self.attn_v is None:
            v = k
        else:
            v = _add(ys[1] if ys else self.attn_v(ops, h), self.bv).reshape(m, s.n_head_kv, hd)
        if s.v_norm:
            v = ops.rms_norm(v, None, s.eps)
        if s.qk_norm:
            k = ops.rms_norm(k, self.attn_k_norm, s.eps)
        elif v is k:
            v = ops.copy(v)  # k is roped in place below
        ops.rope(k, positions, self.rope)
        return k, v

    def __call__(self, ops: Ops, h: np.ndarray, batch: Batch) -> np.ndarray:
        """The sub-block's output (M, n_embd) for the rows of `batch` (every sequence attends its own cache)."""
        ys = self.projections(ops, h) if self.owns_kv else [self.attn_q(ops, h)]
        if self.one_call and len(batch.seqs) == 1:
            a = ops.attention_core(self, ys, batch.seqs[0])
            if a is not None:
                return self.attn_output(ops, a)
        if self.owns_kv:
            q, gate = self.query(ops, h, batch.positions, ys[0])
            k, v = self.keys_values(ops, h, batch.positions, ys[1:])
        else:
            (q, gate), k, v = self.query(ops, h, batch.positions, ys[0]), None, None
        parts = []
        for sq in batch.seqs:
            r = sq.rows
            if k is not None and v is not None:
                sq.cache.store(self.slot, sq.pos0, k[r], v[r])
            parts.append(self.attend(ops, q[r], sq.positions, sq.cache, sq.pos0 + sq.m))
        a = parts[0] if len(parts) == 1 else ops.concat(parts)
        return self.output(ops, a, gate)

    def attend(self, ops: Ops, q: np.ndarray, positions: np.ndarray, cache: Any, n_kv: int) -> np.ndarray:
        """q (M, n_head, hd) at `positions` against the first n_kv positions of cache layer `slot` -> (M, n_head*hd)."""
        a = ops.attention(q, (cache.k[self.slot], cache.v[self.slot]), positions, n_kv, self.mask)
        return a.reshape(q.shape[0], -1)

    def output(self, ops: Ops, a: np.ndarray, gate: np.ndarray | None) -> np.ndarray:
        if gate is not None:
            a *= ops.sigmoid(gate)
        return self.attn_output(ops, a)


def _bias(f: GGUFFile, name: str, n: int) -> np.ndarray | None:
    return vector(f, name, n) if name in f.tensors else None


def _add(x: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """x (M, n) + b (n,) in place, row by row the same whatever M (b None: x as is)."""
    if b is not None:
        x += b
    return x


class GatedMLP:
    """down(act(gate(h)) * up(h)), act "silu" (SwiGLU) or "gelu" (GELU-tanh)."""

    def __init__(self, f: GGUFFile, prefix: str, n_embd: int, n_ff: int, *, act: str):
        if act not in ("silu", "gelu"):
            raise ValueError(f"act must be 'silu' or 'gelu', got {act!r}")
        self.act = act
        self.ffn_gate = linear(f, prefix + "ffn_gate.weight", n_ff, n_embd)
        self.ffn_up = linear(f, prefix + "ffn_up.weight", n_ff, n_embd)
        self.ffn_down = linear(f, prefix + "ffn_down.weight", n_embd, n_ff)

    def __call__(self, ops: Ops, h: np.ndarray) -> np.ndarray:
        return ops.mlp(self, h)


def as_positions(positions: np.ndarray | list[int] | range) -> np.ndarray:
    pos = np.ascontiguousarray(positions, dtype=np.int32)
    if pos.ndim != 1 or (pos.size > 1 and np.any(np.diff(pos) != 1)):
        raise ValueError("positions must be one contiguous ascending run")
    return pos
