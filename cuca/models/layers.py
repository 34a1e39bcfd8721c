"""Shared blocks for the architecture files: bound weights and thin calls into the kernels.

Every call here goes through batch-invariant kernels (never BLAS), so a row's result does not depend on how many
rows travel with it: that is what makes speculative verification equal plain decoding bit for bit.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from .. import kernels
from ..errors import ProviderError
from ..gguf import GGUFFile, TensorInfo
from ..quants import FLOAT_TYPES, Q8_0, SUPPORTED_TYPES, dequantize, quantize_q8_0, row_bytes
from .cache import KVCache
from .config import float_weight


class Ops:
    """The kernel implementation and thread count a model runs with."""

    def __init__(self, threads: int = 0, impl: ModuleType | None = None):
        self.k: ModuleType = impl if impl is not None else kernels.impl
        self.threads = threads


class Linear:
    """A GGUF weight (n_out, n_in) in any supported block format, applied as x @ W.T."""

    __slots__ = ("name", "w", "wtype", "n_out", "n_in")

    def __init__(self, t: TensorInfo, path: object = ""):
        if t.ggml_type not in SUPPORTED_TYPES or len(t.shape) != 2:
            raise ProviderError(f"{path}: tensor {t.name!r} has unsupported type {t.type_name} or shape {t.shape}")
        self.name = t.name
        self.w = t.data
        self.wtype = t.ggml_type
        self.n_out, self.n_in = t.shape
        assert self.w.nbytes == self.n_out * row_bytes(self.wtype, self.n_in)

    def __call__(self, ops: Ops, x: np.ndarray) -> np.ndarray:
        out = np.empty((x.shape[0], self.n_out), np.float32)
        ops.k.matmul(self.w, self.wtype, self.n_out, self.n_in, x, out, ops.threads)
        return out

    def as_q8_0(self) -> Linear:
        """This weight stored as Q8_0 (float matrices only; quantized ones are returned as they are)."""
        if self.wtype not in FLOAT_TYPES or self.n_in % 32:
            return self
        new = object.__new__(Linear)
        new.name, new.wtype, new.n_out, new.n_in = self.name, Q8_0, self.n_out, self.n_in
        new.w = np.empty((self.n_out, row_bytes(Q8_0, self.n_in)), np.uint8)
        for r0 in range(0, self.n_out, 8192):  # bounded float32 scratch for 262k-row tables
            rows = dequantize(self.w[r0 : r0 + 8192], self.wtype, min(8192, self.n_out - r0), self.n_in)
            new.w[r0 : r0 + 8192] = quantize_q8_0(rows)
        return new

    def rows(self, ops: Ops, ids: np.ndarray) -> np.ndarray:
        """Embedding lookup: dequantized rows `ids` (M,) -> (M, n_in)."""
        out = np.empty((ids.shape[0], self.n_in), np.float32)
        ops.k.get_rows(self.w, self.wtype, self.n_out, self.n_in, ids, out)
        return out


def linear(f: GGUFFile, name: str, n_out: int, n_in: int) -> Linear:
    return Linear(f.tensor(name, (n_out, n_in)), f.path)


def output_head(f: GGUFFile, token_embd: Linear) -> Linear:
    """`output.weight`, or the token embedding itself when the head is tied (no copy either way)."""
    if "output.weight" not in f.tensors:
        return token_embd
    return linear(f, "output.weight", token_embd.n_out, token_embd.n_in)


def vector(f: GGUFFile, name: str, n: int) -> np.ndarray:
    """A 1-D float weight (norms), as contiguous float32 (F32 or F16 only: other types are raw blocks)."""
    return float_weight(f, name, (n,))


def rms_norm(ops: Ops, x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    out = np.empty_like(x)
    ops.k.rms_norm(x, w, eps, out, ops.threads)
    return out


def head_norm(ops: Ops, x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """RMS norm over each head of x (M, n_head, hd); w None: no weight."""
    m, h, d = x.shape
    out = np.empty_like(x)
    ops.k.rms_norm(x.reshape(m * h, d), w, eps, out.reshape(m * h, d), ops.threads)
    return out


def self_attention(
    ops: Ops,
    cache: KVCache,
    layer: int,
    q: np.ndarray,
    k: np.ndarray | None,
    v: np.ndarray | None,
    positions: np.ndarray,
    window: int,
    scale: float,
    softcap: float = 0.0,
) -> np.ndarray:
    """Store k/v (M, n_kv_head, hd) at `positions` (contiguous) in `layer`; attend q (M, n_head, hd).

    Returns (M, n_head * hd_v).

    k/v None reads a cache layer another layer wrote (KV sharing).
    """
    m = q.shape[0]
    pos0 = int(positions[0])
    if k is not None and v is not None:
        cache.store(layer, pos0, k, v)
    kc, vc = cache.k[layer], cache.v[layer]
    out = np.empty((m, q.shape[1], vc.shape[2]), np.float32)
    n_kv = pos0 + m
    ops.k.attention(q, kc, vc, positions, n_kv, window, scale, softcap, out, ops.threads)
    return out.reshape(m, -1)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap), in place on float32 x (no-op for cap <= 0); returns x."""
    if cap > 0:
        c = np.float32(cap)
        x /= c
        np.tanh(x, out=x)
        x *= c
    return x


def last_or_all(model: Any, h: np.ndarray, logits: str) -> np.ndarray:
    """The logits of every row ("all") or of the last row only ("last", (1, n_vocab)) from post-norm hidden h."""
    if logits == "last":
        h = np.ascontiguousarray(h[-1:])
    elif logits != "all":
        raise ValueError(f"logits must be 'last' or 'all', got {logits!r}")
    return model.head(h)


def as_positions(positions: np.ndarray | list[int] | range) -> np.ndarray:
    pos = np.ascontiguousarray(positions, dtype=np.int32)
    if pos.ndim != 1 or (pos.size > 1 and np.any(np.diff(pos) != 1)):
        raise ValueError("positions must be one contiguous ascending run")
    return pos
