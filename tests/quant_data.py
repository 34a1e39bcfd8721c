"""Random but valid GGUF weight tensors of every supported type, as the raw arrays GGUFReader returns."""

from __future__ import annotations

import gguf
import numpy as np

from cuca import quants as Q

# types gguf's numpy code can quantize; the rest are built byte by byte
_GGUF_QUANTIZABLE = {Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1}


def _fp16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def random_weight(wtype: int, n_out: int, n_in: int, seed: int = 0) -> np.ndarray:
    """Raw tensor data of type wtype: float32 / float16 arrays for F32 / F16, else uint8 (n_out, bytes)."""
    rng = np.random.default_rng(seed)
    if wtype == Q.F32:
        return rng.standard_normal((n_out, n_in), dtype=np.float32)
    if wtype == Q.F16:
        return rng.standard_normal((n_out, n_in)).astype(np.float16)
    if wtype == Q.BF16:
        bits = rng.standard_normal((n_out, n_in)).astype(np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8).reshape(n_out, 2 * n_in)
    if wtype in _GGUF_QUANTIZABLE:
        w = rng.standard_normal((n_out, n_in)).astype(np.float32) * np.float32(0.05)
        w[:, :32] += rng.uniform(0.0, 0.2, (n_out, 1)).astype(np.float32)  # some blocks with an offset
        return gguf.quants.quantize(w, gguf.GGMLQuantizationType(wtype))
    bs, nbytes = Q.BLOCK[wtype]
    nb = n_out * n_in // bs
    raw = rng.integers(0, 256, (nb, nbytes), dtype=np.uint8)
    if wtype in (Q.Q4_K, Q.Q5_K):
        raw[:, 0:2] = _fp16_bytes(rng.uniform(1e-4, 2e-3, nb))
        raw[:, 2:4] = _fp16_bytes(rng.uniform(0.0, 2e-3, nb))
    elif wtype == Q.Q6_K:
        raw[:, 208:210] = _fp16_bytes(rng.uniform(1e-4, 1e-3, nb))
    else:
        raise ValueError(f"no generator for type {wtype}")
    return raw.reshape(n_out, -1)
