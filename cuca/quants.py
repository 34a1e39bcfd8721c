"""GGML tensor types cuca can compute with: type ids, block geometry, and a vectorised numpy dequantizer.

`dequantize` is the reference for every weight format (the C kernels' `get_rows` must agree with it bit for
bit). `unpack` exposes the same decoding as (integer codes, per-group scale, per-group bias) so that the numpy
matmul twin can compute exactly in float64.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as _T

from .errors import CucaError


class QuantError(CucaError):
    """A tensor type is unsupported, or a shape does not fit its block size (names the type and the size)."""


F32 = int(_T.F32)
F16 = int(_T.F16)
BF16 = int(_T.BF16)
Q8_0 = int(_T.Q8_0)
Q4_0 = int(_T.Q4_0)
Q4_1 = int(_T.Q4_1)
Q5_0 = int(_T.Q5_0)
Q5_1 = int(_T.Q5_1)
Q4_K = int(_T.Q4_K)
Q5_K = int(_T.Q5_K)
Q6_K = int(_T.Q6_K)

QK_K = 256

# type id -> (elements per block, bytes per block)
BLOCK: dict[int, tuple[int, int]] = {
    F32: (1, 4),
    F16: (1, 2),
    BF16: (1, 2),
    Q8_0: (32, 34),
    Q4_0: (32, 18),
    Q4_1: (32, 20),
    Q5_0: (32, 22),
    Q5_1: (32, 24),
    Q4_K: (QK_K, 144),
    Q5_K: (QK_K, 176),
    Q6_K: (QK_K, 210),
}
SUPPORTED_TYPES: frozenset[int] = frozenset(BLOCK)
FLOAT_TYPES: frozenset[int] = frozenset({F32, F16, BF16})
K_TYPES: frozenset[int] = frozenset({Q4_K, Q5_K, Q6_K})


def type_name(wtype: int) -> str:
    try:
        return _T(int(wtype)).name
    except ValueError:
        return f"type {wtype}"


def _check(wtype: int, n_in: int) -> tuple[int, int]:
    if wtype not in BLOCK:
        raise QuantError(
            f"unsupported tensor type {type_name(wtype)} (id {wtype}); cuca supports "
            + ", ".join(type_name(t) for t in sorted(BLOCK))
        )
    bs, nbytes = BLOCK[wtype]
    if n_in <= 0 or n_in % bs:
        raise QuantError(f"{type_name(wtype)} rows need a positive multiple of {bs} values, got n_in={n_in}")
    return bs, nbytes


def block_size(wtype: int) -> int:
    return _check(wtype, BLOCK.get(wtype, (1, 0))[0])[0]


def row_bytes(wtype: int, n_in: int) -> int:
    """Bytes of one row of n_in elements of type wtype."""
    bs, nbytes = _check(wtype, n_in)
    return n_in // bs * nbytes


class Unpacked(NamedTuple):
    """value[n, g, i] = scale[n, g] * q[n, g, i] (+ bias[n, g]) for groups g of `q.shape[2]` elements."""

    q: np.ndarray  # integer codes (int16), centred where the format has an offset
    scale: np.ndarray  # float32 (n_out, n_groups)
    bias: np.ndarray | None  # float32 (n_out, n_groups) or None


def _blocks(raw: np.ndarray, wtype: int, n_out: int, n_in: int) -> np.ndarray:
    bs, nbytes = _check(wtype, n_in)
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if data.size != n_out * (n_in // bs) * nbytes:
        need = n_out * (n_in // bs) * nbytes
        raise QuantError(f"{type_name(wtype)} tensor of {n_out}x{n_in} needs {need} bytes, got {data.size}")
    return data.reshape(n_out, n_in // bs, nbytes)


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian fp16 from the last axis (2 bytes) as float32."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., 16) packed bytes -> (..., 32): low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits32(qh: np.ndarray) -> np.ndarray:
    """(..., 4) bytes of a little-endian uint32 -> (..., 32) bits, bit j for element j."""
    word = np.ascontiguousarray(qh).view("<u4")
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_scales(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12-byte Q4_K/Q5_K field -> eight 6-bit scales and eight 6-bit mins."""
    lo, mid, hi = sc[..., 0:4], sc[..., 4:8], sc[..., 8:12]
    scales = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=-1)
    mins = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return scales, mins


def unpack(raw: np.ndarray, wtype: int, n_out: int, n_in: int) -> Unpacked:
    """Decode a quantized tensor into integer codes, group scales and group biases (see `Unpacked`)."""
    b = _blocks(raw, wtype, n_out, n_in)
    nb = b.shape[1]
    if wtype in (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1):
        d = _f16(b[..., 0:2])
        if wtype == Q8_0:
            return Unpacked(b[..., 2:34].view(np.int8).astype(np.int16), d, None)
        has_min = wtype in (Q4_1, Q5_1)
        off = 4 if has_min else 2
        m = _f16(b[..., 2:4]) if has_min else None
        q = _nibbles(b[..., -16:]).astype(np.int16)
        if wtype in (Q5_0, Q5_1):
            q |= _bits32(b[..., off : off + 4]).astype(np.int16) << 4
        if not has_min:
            q -= 16 if wtype == Q5_0 else 8
        return Unpacked(q, d, m)
    if wtype in (Q4_K, Q5_K):
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _k_scales(b[..., 4:16])
        qs = b[..., -128:].reshape(n_out, nb, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(2, 1)
        q = (qs & 0x0F).reshape(n_out, nb, 8, 32).astype(np.int16)
        if wtype == Q5_K:
            qh = b[..., 16:48].reshape(n_out, nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)
            q |= (qh & 1).astype(np.int16) << 4
        scale = d[..., None] * sc.astype(np.float32)
        bias = -(dmin[..., None] * mn.astype(np.float32))
        return Unpacked(q.reshape(n_out, nb * 8, 32), scale.reshape(n_out, -1), bias.reshape(n_out, -1))
    if wtype == Q6_K:
        lo = (b[..., 0:128].reshape(n_out, nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)) & 0x0F
        hi = b[..., 128:192].reshape(n_out, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
        q = (lo.reshape(n_out, nb, 2, 4, 32) | ((hi & 3) << 4)).astype(np.int16) - 32
        scale = _f16(b[..., 208:210])[..., None] * b[..., 192:208].view(np.int8).astype(np.float32)
        return Unpacked(q.reshape(n_out, nb * 16, 16), scale.reshape(n_out, -1), None)
    raise QuantError(f"{type_name(wtype)} is a float type; it has no blocks to unpack")


def dequantize(raw: np.ndarray, wtype: int, n_out: int, n_in: int) -> np.ndarray:
    """Raw GGUF tensor bytes of type wtype -> float32 (n_out, n_in), computed in float32 as ggml does."""
    row_bytes(wtype, n_in)
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if wtype in FLOAT_TYPES:
        if data.size != n_out * row_bytes(wtype, n_in):
            raise QuantError(
                f"{type_name(wtype)} tensor of {n_out}x{n_in} needs "
                f"{n_out * row_bytes(wtype, n_in)} bytes, got {data.size}"
            )
        if wtype == F32:
            out = data.view("<f4").astype(np.float32)
        elif wtype == F16:
            out = data.view("<f2").astype(np.float32)
        else:
            out = (data.view("<u2").astype(np.uint32) << 16).view(np.float32)
        return out.reshape(n_out, n_in)
    u = unpack(data, wtype, n_out, n_in)
    v = u.scale[..., None] * u.q.astype(np.float32)
    if u.bias is not None:
        v = v + u.bias[..., None]
    return v.reshape(n_out, n_in)


def dequantize64(raw: np.ndarray, wtype: int, n_out: int, n_in: int) -> np.ndarray:
    """Like `dequantize` but in float64, where every weight value is exact."""
    if wtype in FLOAT_TYPES:
        return dequantize(raw, wtype, n_out, n_in).astype(np.float64)
    u = unpack(raw, wtype, n_out, n_in)
    v = u.scale.astype(np.float64)[..., None] * u.q
    if u.bias is not None:
        v += u.bias.astype(np.float64)[..., None]
    return v.reshape(n_out, n_in)


def quantize_q8_0(x: np.ndarray, chunk_rows: int = 4096) -> np.ndarray:
    """float32 (n_out, n_in) -> Q8_0 blocks (n_out, n_in / 32 * 34) uint8: d = fp16(amax / 127), q = round(x / d)
    (half to even). For storing float weights compactly; a row's codes depend on that row only."""
    n_out, n_in = x.shape
    row_bytes(Q8_0, n_in)
    out = np.empty((n_out, n_in // 32, 34), np.uint8)
    for r0 in range(0, n_out, chunk_rows):
        b = np.asarray(x[r0 : r0 + chunk_rows], np.float32).reshape(-1, n_in // 32, 32)
        d = (np.abs(b).max(axis=2) / np.float32(127)).astype(np.float16)
        inv = np.divide(np.float32(1), d.astype(np.float32), out=np.zeros(d.shape, np.float32), where=d != 0)
        q = np.clip(np.rint(b * inv[..., None]), -127, 127).astype(np.int8)
        out[r0 : r0 + chunk_rows, :, 0:2] = d.view(np.uint8).reshape(*d.shape, 2)
        out[r0 : r0 + chunk_rows, :, 2:] = q.view(np.uint8)
    return out.reshape(n_out, -1)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """float32 (n_out, n_in) -> Q4_0 blocks (n_out, n_in / 32 * 18) uint8, by the gguf package's reference quantizer
    (ggml's rounding: d = max / -8 of the block's largest-magnitude value). For a drafter's coarse head copy."""
    from gguf import quants

    row_bytes(Q4_0, x.shape[1])
    return np.asarray(quants.quantize(np.ascontiguousarray(x, np.float32), _T.Q4_0), np.uint8)
