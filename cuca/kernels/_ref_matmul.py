"""numpy twins of the quantized matmul kernels (same names, signatures and argument checks as the C ones).

Activations are quantized exactly as the C kernels quantize them (the quantizers agree bit for bit); the dot
products are then computed in float64 from the exact integer codes and scales, so the C float32 results differ
from these only by float32 accumulation error. Each x row is computed on its own, so these twins are batch
invariant too.
"""

from __future__ import annotations

import numpy as np

from cuca import quants as Q

__all__ = ["matmul", "get_rows", "quantize_q8_0", "quantize_q8_1", "quantize_q8_K"]

_Q8_0_WEIGHTS = frozenset({Q.Q8_0, Q.Q4_0, Q.Q5_0})
_Q8_1_WEIGHTS = frozenset({Q.Q4_1, Q.Q5_1})


def _array(fn: str, name: str, a: object, dtype: type | None) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{fn}(): {name} must be a numpy.ndarray, got {type(a).__name__}")
    if dtype is not None and (a.dtype != dtype or not a.dtype.isnative):
        raise TypeError(f"{fn}(): {name} must have dtype {np.dtype(dtype)}, got {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{fn}(): {name} must be C-contiguous")
    return a


def _weight(fn: str, w: object, wtype: int, n_out: int, n_in: int) -> tuple[np.ndarray, int]:
    wa = _array(fn, "w", w, None)
    if wtype not in Q.SUPPORTED_TYPES:
        raise ValueError(
            f"{fn}(): wtype {wtype} is not a supported GGML type (F32, F16, BF16, Q8_0, Q4_0, "
            "Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"
        )
    bs, nbytes = Q.BLOCK[wtype]
    if not 0 < n_out < 2**31:
        raise ValueError(f"{fn}(): n_out must be in [1, 2^31), got {n_out}")
    if n_in <= 0 or n_in % bs or n_in >= 2**31:
        raise ValueError(f"{fn}(): n_in must be a positive multiple of {bs} for wtype {wtype}, got {n_in}")
    rb = n_in // bs * nbytes
    if wa.nbytes != rb * n_out:
        raise ValueError(
            f"{fn}(): w has {wa.nbytes} bytes, a {n_out} x {n_in} tensor of wtype {wtype} needs {rb * n_out}"
        )
    return wa.reshape(-1).view(np.uint8).reshape(n_out, rb), rb


def _out(fn: str, out: object, shape: tuple[int, int]) -> np.ndarray:
    o = _array(fn, "out", out, np.float32)
    if o.shape != shape:
        raise ValueError(f"{fn}(): out must have shape {shape}")
    if not o.flags.writeable:
        raise ValueError(f"{fn}(): out must be writeable")
    return o


def _x(fn: str, x: object, bs: int) -> np.ndarray:
    xa = _array(fn, "x", x, np.float32)
    if xa.ndim != 2 or xa.shape[1] < 1 or xa.shape[1] % bs:
        raise ValueError(f"{fn}(): x must have shape (M, n) with n a positive multiple of {bs}")
    return xa


def _fp16(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond fp16 range: inf, as the C conversion gives
        return v.astype(np.float16).astype(np.float32)


def _q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(M, n) -> codes (M, n) int8, raw scale (M, n/32) float32, code sums (M, n/32)."""
    xb = x.reshape(x.shape[0], x.shape[1] // 32, 32)
    amax = np.abs(xb).max(axis=-1)
    d = amax / np.float32(127)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax != 0)
    v = (xb * inv[..., None]).astype(np.float64)
    q = np.rint(v).astype(np.int8)  # nearest, ties to even, as ggml's x86 path
    return q.reshape(x.shape), d, q.sum(axis=-1, dtype=np.int32)


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's Q8_0 activations: per 32 values d = fp16(amax/127), q = round(x * 127/amax)."""
    q, d, _ = _q8(_x("quantize_q8_0", x, 32))
    return q, _fp16(d)


def quantize_q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q8_0 plus s = fp16(d * sum(q)) per block (d before its fp16 rounding)."""
    q, d, tot = _q8(_x("quantize_q8_1", x, 32))
    return q, _fp16(d), _fp16(d * tot.astype(np.float32))


def quantize_q8_K(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's Q8_K: per 256 values d = max/-127 (max = first value of largest magnitude), q = rint(x/d),
    bsums = sums of 16 consecutive q."""
    xa = _x("quantize_q8_K", x, 256)
    xb = xa.reshape(xa.shape[0], xa.shape[1] // 256, 256)
    vmax = np.take_along_axis(xb, np.abs(xb).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    nz = vmax != 0
    iscale = np.divide(np.float32(-127), vmax, out=np.zeros_like(vmax), where=nz)
    q = np.minimum(np.rint(iscale[..., None] * xb), 127).astype(np.int8)
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=nz)
    bsums = q.reshape(*q.shape[:2], 16, 16).sum(axis=-1, dtype=np.int16)
    return q.reshape(xa.shape), d, bsums.reshape(xa.shape[0], xa.shape[1] // 16)


def _blockwise(q: np.ndarray, d: np.ndarray, bs: int) -> np.ndarray:
    return (q.reshape(*d.shape, bs).astype(np.float64) * d.astype(np.float64)[..., None]).reshape(q.shape)


def matmul(
    w: np.ndarray, wtype: int, n_out: int, n_in: int, x: np.ndarray, out: np.ndarray, n_threads: int = 0
) -> None:
    """out[m, n] = sum_k x[m, k] * W[n, k] for raw GGUF weights w of GGML type wtype."""
    fn = "matmul"
    rows, _ = _weight(fn, w, wtype, n_out, n_in)
    xa = _array(fn, "x", x, np.float32)
    if xa.ndim != 2 or xa.shape[1] != n_in or xa.shape[0] < 1:
        raise ValueError(f"{fn}(): x must have shape (M, {n_in}) with M >= 1")
    o = _out(fn, out, (xa.shape[0], n_out))
    if np.shares_memory(o, xa) or np.shares_memory(o, w):
        raise ValueError(f"{fn}(): out must not overlap x or w")
    if n_threads < 0:
        raise ValueError(f"{fn}(): n_threads must be >= 0, got {n_threads}")
    bias = s = None
    if wtype in Q.FLOAT_TYPES:
        wf, xf = Q.dequantize(rows, wtype, n_out, n_in).astype(np.float64), xa.astype(np.float64)
    elif wtype in _Q8_0_WEIGHTS:
        wf = Q.dequantize64(rows, wtype, n_out, n_in)
        xf = _blockwise(*quantize_q8_0(xa), 32)
    elif wtype in _Q8_1_WEIGHTS:
        u = Q.unpack(rows, wtype, n_out, n_in)
        wf = (u.scale.astype(np.float64)[..., None] * u.q).reshape(n_out, n_in)
        assert u.bias is not None
        bias = u.bias.astype(np.float64)
        q, d, s = quantize_q8_1(xa)
        xf = _blockwise(q, d, 32)
    else:
        wf = Q.dequantize64(rows, wtype, n_out, n_in)
        q, d, _ = quantize_q8_K(xa)
        xf = _blockwise(q, d, 256)
    for m in range(xa.shape[0]):  # row by row: a row's result never depends on the others
        r = wf @ xf[m]
        if bias is not None and s is not None:
            r = r + bias @ s[m].astype(np.float64)
        o[m] = r


def get_rows(w: np.ndarray, wtype: int, n_out: int, n_in: int, ids: np.ndarray, out: np.ndarray) -> None:
    """out[m] = dequantized row ids[m] of w (an embedding lookup)."""
    fn = "get_rows"
    rows, _ = _weight(fn, w, wtype, n_out, n_in)
    ia = _array(fn, "ids", ids, np.int32)
    if ia.ndim != 1:
        raise ValueError(f"{fn}(): ids must be 1-dimensional")
    bad = np.flatnonzero((ia < 0) | (ia >= n_out))
    if bad.size:
        raise ValueError(f"{fn}(): ids[{bad[0]}] = {ia[bad[0]]} is out of range [0, {n_out})")
    o = _out(fn, out, (ia.shape[0], n_in))
    if np.shares_memory(o, w) or np.shares_memory(o, ia):
        raise ValueError(f"{fn}(): out must not overlap w or ids")
    if ia.size:
        o[:] = Q.dequantize(rows[ia], wtype, ia.size, n_in)
