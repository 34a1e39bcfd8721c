"""Numpy twins of the attention and small-op kernels: same names, signatures and argument checks as the C
functions in `_ckernels`, computed straightforwardly in float64 (results stored as float32). They are the
reference the C kernels are tested against, and the fallback when the extension is not built."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["attention", "rms_norm", "residual_norm", "rope", "silu_mul", "gelu_mul", "deltanet",
           "deltanet_deferred", "causal_conv", "sigmoid", "decay", "softcap"]

_GELU_C = math.sqrt(2.0 / math.pi)


# ---------------------------------------------------------------------------------------------- checks
def _array(fn: str, name: str, a: Any, kind: str, ndims: tuple[int, ...]) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{fn}(): {name} must be a numpy.ndarray, got {type(a).__name__}")
    wants = {"f": ("float32",), "i": ("int32",), "c": ("float32", "float16")}[kind]
    if a.dtype.name not in wants or not a.dtype.isnative:
        raise TypeError(f"{fn}(): {name} must have dtype {' or '.join(wants)}, got {a.dtype}")
    if a.ndim not in ndims:
        if len(ndims) == 1:
            raise ValueError(f"{fn}(): {name} must be {ndims[0]}-dimensional, got shape {a.shape}")
        raise ValueError(
            f"{fn}(): {name} must have {ndims[0]} to {ndims[-1]} dimensions, got shape {a.shape}"
        )
    if a.size == 0:  # layout irrelevant (numpy gives empty arrays zero strides)
        return a
    if not a.flags.aligned:
        raise ValueError(f"{fn}(): {name} must be aligned")
    if any(s % a.itemsize for s in a.strides):
        raise ValueError(f"{fn}(): {name} has strides that are not whole elements")
    if a.ndim and a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
        raise ValueError(f"{fn}(): {name} must be contiguous in its last dimension")
    return a


def _shape(fn: str, name: str, a: np.ndarray, shape: tuple[int, ...]) -> None:
    if a.shape != tuple(shape):
        raise ValueError(f"{fn}(): {name} must have shape {tuple(shape)}, got {a.shape}")


def _writeable(fn: str, name: str, a: np.ndarray) -> None:
    if not a.flags.writeable:
        raise ValueError(f"{fn}(): {name} must be writeable")


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    if a.__array_interface__["data"][0] != b.__array_interface__["data"][0] or a.shape != b.shape:
        return False
    return all(n <= 1 or sa == sb for n, sa, sb in zip(a.shape, a.strides, b.strides, strict=True))


def _alias_ok(fn: str, an: str, a: np.ndarray, bn: str, b: np.ndarray) -> None:
    if not _identical(a, b) and np.may_share_memory(a, b):
        raise ValueError(f"{fn}(): {an} and {bn} overlap (they must be the same array or disjoint)")


def _disjoint(fn: str, an: str, a: np.ndarray, bn: str, b: np.ndarray) -> None:
    if np.may_share_memory(a, b):
        raise ValueError(f"{fn}(): {an} must not overlap {bn}")


def _int(fn: str, name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not hasattr(v, "__index__"):
        raise TypeError(f"{fn}(): {name} must be an integer, got {type(v).__name__}")
    i = v.__index__()
    if not lo <= i <= hi:
        raise ValueError(f"{fn}(): {name} must be in [{lo}, {hi}], got {i}")
    return i


def _float(fn: str, name: str, v: Any) -> float:
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{fn}(): {name} must be a number, got {type(v).__name__}")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}(): {name} must be a number, got {type(v).__name__}") from None
    if math.isnan(f):
        raise ValueError(f"{fn}(): {name} must not be NaN")
    return f


def _nthreads(fn: str, v: Any) -> int:
    return _int(fn, "n_threads", v, 0, 1 << 16)


_INT_MAX = 2**31 - 1


# ---------------------------------------------------------------------------------------------- attention
EXP_LO = -87.33  # VM_EXP_LO of vmath.h: exp(x) below it is exactly 0 (exp(-87.33) = 1.18e-38, still normal)


def attention(q, k_cache, v_cache, q_pos, n_kv, window, scale, softcap, out, n_threads=0) -> None:
    """Causal (sliding-window when window > 0) grouped-query attention of q over the first n_kv cache
    positions, written to out; the caches hold float32 or float16. See the C kernel for the exact contract."""
    fn = "attention"
    q = _array(fn, "q", q, "f", (3,))
    k_cache = _array(fn, "k_cache", k_cache, "c", (3,))
    v_cache = _array(fn, "v_cache", v_cache, "c", (3,))
    q_pos = _array(fn, "q_pos", q_pos, "i", (1,))
    out = _array(fn, "out", out, "f", (3,))
    n_kv = _int(fn, "n_kv", n_kv, 0, _INT_MAX)
    window = _int(fn, "window", window, 0, _INT_MAX)
    scale = _float(fn, "scale", scale)
    softcap = _float(fn, "softcap", softcap)
    _nthreads(fn, n_threads)
    M, H, D = q.shape
    Hkv, n_ctx, _ = k_cache.shape
    Dv = v_cache.shape[2]
    if H < 1 or D < 1 or Dv < 1 or Hkv < 1:
        raise ValueError(f"{fn}(): empty head or head-dimension axis in q, k_cache or v_cache")
    if H % Hkv:
        raise ValueError(f"{fn}(): q has {H} heads, not a multiple of the {Hkv} kv heads of k_cache")
    _shape(fn, "k_cache", k_cache, (Hkv, n_ctx, D))
    _shape(fn, "v_cache", v_cache, (Hkv, n_ctx, Dv))
    _shape(fn, "q_pos", q_pos, (M,))
    _shape(fn, "out", out, (M, H, Dv))
    if v_cache.dtype != k_cache.dtype:
        raise TypeError(f"{fn}(): k_cache and v_cache must have the same dtype")
    es = k_cache.itemsize
    if n_ctx > 1 and (k_cache.strides[1] != es * D or v_cache.strides[1] != es * Dv):
        raise ValueError(f"{fn}(): the positions of each head of k_cache and v_cache must be contiguous")
    if n_kv > n_ctx:
        raise ValueError(f"{fn}(): n_kv={n_kv} exceeds the cache length {n_ctx}")
    _writeable(fn, "out", out)
    for name, a in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("q_pos", q_pos)):
        _disjoint(fn, "out", out, name, a)

    G = H // Hkv
    for i in range(M):
        p = int(q_pos[i])
        hi = min(p + 1, n_kv)
        lo = max(0, p - window + 1) if window > 0 else 0
        if hi <= lo:
            out[i] = 0.0
            continue
        kk = k_cache[:, lo:hi].astype(np.float64)  # (Hkv, L, D)
        vv = v_cache[:, lo:hi].astype(np.float64)
        qi = q[i].astype(np.float64).reshape(Hkv, G, D)
        s = np.einsum("kgd,kld->kgl", qi, kk) * scale
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        s -= s.max(axis=-1, keepdims=True)
        pr = np.where(s < EXP_LO, 0.0, np.exp(s))  # the kernels' exp is exactly 0 there, never subnormal
        pr /= pr.sum(axis=-1, keepdims=True)
        out[i] = np.einsum("kgl,kld->kgd", pr, vv).reshape(H, Dv)


# ---------------------------------------------------------------------------------------------- norms
def _norm_weight(fn: str, w: Any, n: int, name: str = "w") -> np.ndarray | None:
    if w is None:
        return None
    w = _array(fn, name, w, "f", (1,))
    _shape(fn, name, w, (n,))
    return w


def _rms(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * w.astype(np.float64)
    return y


def rms_norm(x, w, eps, out, n_threads=0) -> None:
    """out = x / sqrt(mean(x^2, last axis) + eps) * w (w may be None); out may be x itself."""
    fn = "rms_norm"
    x = _array(fn, "x", x, "f", (1, 2, 3))
    out = _array(fn, "out", out, "f", (1, 2, 3))
    eps = _float(fn, "eps", eps)
    _nthreads(fn, n_threads)
    _shape(fn, "out", out, x.shape)
    _writeable(fn, "out", out)
    _alias_ok(fn, "out", out, "x", x)
    if x.shape[-1] < 1:
        raise ValueError(f"{fn}(): x must have a non-empty last dimension")
    w = _norm_weight(fn, w, x.shape[-1])
    out[...] = _rms(x, w, eps)


def residual_norm(x, y, w_y, w_out, eps, scale, out, n_threads=0) -> None:
    """x += rms_norm(y, w_y) (x += y where w_y is False), x *= scale, then out = rms_norm(x, w_out) (not where w_out
    is False: out is scratch); a weight None: a norm without one. out, x and y must not overlap."""
    fn = "residual_norm"
    x = _array(fn, "x", x, "f", (1, 2, 3))
    y = _array(fn, "y", y, "f", (1, 2, 3))
    out = _array(fn, "out", out, "f", (1, 2, 3))
    eps, scale = _float(fn, "eps", eps), _float(fn, "scale", scale)
    _nthreads(fn, n_threads)
    _shape(fn, "y", y, x.shape)
    _shape(fn, "out", out, x.shape)
    _writeable(fn, "x", x)
    _writeable(fn, "out", out)
    _disjoint(fn, "out", out, "x", x)
    _disjoint(fn, "out", out, "y", y)
    _disjoint(fn, "y", y, "x", x)
    if x.shape[-1] < 1:
        raise ValueError(f"{fn}(): x must have a non-empty last dimension")
    wy = _norm_weight(fn, w_y, x.shape[-1], "w_y") if w_y is not False else None  # both checked before any write
    wo = _norm_weight(fn, w_out, x.shape[-1], "w_out") if w_out is not False else None
    if w_y is not False:
        out[...] = _rms(y, wy, eps)
        y = out
    x += y
    if scale != 1.0:
        x *= np.float32(scale)
    if w_out is not False:
        out[...] = _rms(x, wo, eps)


# ---------------------------------------------------------------------------------------------- rope
def rope(x, pos, n_rot, freq_base, neox, freq_factors, freq_scale, n_threads=0) -> None:
    """In-place rotary embedding of the first n_rot dims of each head of x (M, n_head, hd) at positions pos.
    neox=False rotates pairs (2i, 2i+1), neox=True pairs (i, i + n_rot/2); pair i turns by
    pos * freq_scale * freq_base^(-2i/n_rot) / freq_factors[i], that angle built in float32 like ggml."""
    fn = "rope"
    x = _array(fn, "x", x, "f", (3,))
    pos = _array(fn, "pos", pos, "i", (1,))
    M, _, hd = x.shape
    n_rot = _int(fn, "n_rot", n_rot, 0, hd)
    freq_base = _float(fn, "freq_base", freq_base)
    freq_scale = _float(fn, "freq_scale", freq_scale)
    _nthreads(fn, n_threads)
    if n_rot % 2:
        raise ValueError(f"{fn}(): n_rot must be even, got {n_rot}")
    if not (freq_base > 0 and math.isfinite(freq_base)):
        raise ValueError(f"{fn}(): freq_base must be a positive finite number")
    neox = bool(neox)
    _shape(fn, "pos", pos, (M,))
    _writeable(fn, "x", x)
    half = n_rot // 2
    if freq_factors is not None:
        freq_factors = _array(fn, "freq_factors", freq_factors, "f", (1,))
        _shape(fn, "freq_factors", freq_factors, (half,))
    if half == 0 or M == 0:
        return
    # angles in float32 the way ggml builds them (theta *= base^(-2/n_rot) pair after pair), so the twin stays
    # as close to llama.cpp as the C kernel; cos/sin and the rotation itself in float64
    f32 = np.float32
    theta_scale = f32(np.float64(f32(freq_base)) ** np.float64(f32(-2.0) / f32(n_rot)))
    th = pos.astype(np.float32)
    theta = np.empty((M, half), dtype=np.float64)
    for i in range(half):
        t = th / freq_factors[i] if freq_factors is not None else th
        theta[:, i] = f32(freq_scale) * t
        th = th * theta_scale
    c = np.cos(theta)[:, None, :]
    s = np.sin(theta)[:, None, :]
    if neox:
        x0 = x[:, :, :half].astype(np.float64)
        x1 = x[:, :, half:n_rot].astype(np.float64)
        x[:, :, :half] = x0 * c - x1 * s
        x[:, :, half:n_rot] = x0 * s + x1 * c
    else:
        x0 = x[:, :, 0:n_rot:2].astype(np.float64)
        x1 = x[:, :, 1:n_rot:2].astype(np.float64)
        x[:, :, 0:n_rot:2] = x0 * c - x1 * s
        x[:, :, 1:n_rot:2] = x0 * s + x1 * c


# ---------------------------------------------------------------------------------------------- gating
def _act_args(fn: str, g, u, out, n_threads) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = _array(fn, "g", g, "f", (1, 2, 3))
    u = _array(fn, "u", u, "f", (1, 2, 3))
    out = _array(fn, "out", out, "f", (1, 2, 3))
    _nthreads(fn, n_threads)
    _shape(fn, "u", u, g.shape)
    _shape(fn, "out", out, g.shape)
    _writeable(fn, "out", out)
    _alias_ok(fn, "out", out, "g", g)
    _alias_ok(fn, "out", out, "u", u)
    return g, u, out


def silu_mul(g, u, out, n_threads=0) -> None:
    """out = g * sigmoid(g) * u (out may be g or u)."""
    g, u, out = _act_args("silu_mul", g, u, out, n_threads)
    g64 = g.astype(np.float64)
    with np.errstate(over="ignore"):
        out[...] = g64 / (1.0 + np.exp(-g64)) * u.astype(np.float64)


def gelu_mul(g, u, out, n_threads=0) -> None:
    """out = gelu_tanh(g) * u, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    g, u, out = _act_args("gelu_mul", g, u, out, n_threads)
    g64 = g.astype(np.float64)
    out[...] = 0.5 * g64 * (1.0 + np.tanh(_GELU_C * (g64 + 0.044715 * g64**3))) * u.astype(np.float64)


def softcap(x, cap, n_threads=0) -> None:
    """x = cap * tanh(x / cap) in place (cap > 0), in float64."""
    fn = "softcap"
    x = _array(fn, "x", x, "f", (1, 2, 3))
    _nthreads(fn, n_threads)
    _writeable(fn, "x", x)
    if not isinstance(cap, (int, float, np.floating, np.integer)) or isinstance(cap, bool):
        raise TypeError(f"{fn}(): cap must be a number, got {type(cap).__name__}")
    c = float(np.float32(cap))
    if not (c > 0 and math.isfinite(c)):
        raise ValueError(f"{fn}(): cap must be a positive finite number, got {cap}")
    x[...] = c * np.tanh(x.astype(np.float64) / c)


# ---------------------------------------------------------------------------------------------- deltanet
def deltanet(q, k, v, g, beta, state, snaps, out, eps, scale, n_threads=0) -> None:
    """Gated DeltaNet recurrence, token by token. q, k (T, H, dk) are L2-normalised here (x / sqrt(sum x^2 +
    eps)), q then scaled; per token and head: S = exp(g) S, kv = k^T S, S += k (beta (v - kv))^T, o = q^T S.
    state (H, dk, dv) is updated in place; snaps (>= T-1, H, dk, dv) or None receives the state after each
    token but the last."""
    a = _dn_args("deltanet", q, k, v, g, beta, state, snaps, out, eps, scale, n_threads)
    state[...] = _dn_steps(a, state.astype(np.float64), None)


def deltanet_deferred(q, k, v, g, beta, state, out, pend, n_pend, rec, defer, eps, scale, n_threads=0) -> None:
    """deltanet with deferred commit. A token's record (dk + dv + 1 floats per head) is its normalised k, d = beta
    (v - kv) and exp(g). The n_pend records of pend (>= n_pend, H, dk + dv + 1) are applied to state first
    (S = exp(g) S + k d^T) and stored; the new tokens' records go to rec (or None); with defer the state after the new
    tokens is not stored."""
    fn = "deltanet_deferred"
    a = _dn_args(fn, q, k, v, g, beta, state, None, out, eps, scale, n_threads)
    H, dk, dv = state.shape
    for name, r, n in (("pend", pend, n_pend), ("rec", rec, a["q"].shape[0])):
        if r is not None:
            r = _array(fn, name, r, "f", (3,))
            if r.shape[0] < n or r.shape[1:] != (H, dk + dv + 1):
                raise ValueError(f"{fn}(): {name} must have shape (>= {n}, {H}, {dk + dv + 1})")
    if not (isinstance(n_pend, (int, np.integer)) and 0 <= n_pend) or (n_pend and pend is None):
        raise ValueError(f"{fn}(): n_pend must be an integer >= 0 with pend given")
    s = state.astype(np.float64)
    for p in range(int(n_pend)):
        r = pend[p].astype(np.float64)
        s = s * r[:, dk + dv][:, None, None] + r[:, :dk, None] * r[:, None, dk : dk + dv]
    if n_pend and defer:
        state[...] = s
    s = _dn_steps(a, s, rec)
    if not defer:
        state[...] = s


def _dn_args(fn: str, q, k, v, g, beta, state, snaps, out, eps, scale, n_threads) -> dict[str, Any]:
    """deltanet's arguments checked as the C kernel checks them."""
    q = _array(fn, "q", q, "f", (3,))
    k = _array(fn, "k", k, "f", (3,))
    v = _array(fn, "v", v, "f", (3,))
    g = _array(fn, "g", g, "f", (2,))
    beta = _array(fn, "beta", beta, "f", (2,))
    state = _array(fn, "state", state, "f", (3,))
    out = _array(fn, "out", out, "f", (3,))
    if snaps is not None:
        snaps = _array(fn, "snaps", snaps, "f", (4,))
    eps = _float(fn, "eps", eps)
    scale = _float(fn, "scale", scale)
    _nthreads(fn, n_threads)
    T, H, dk = q.shape
    dv = v.shape[2]
    if H < 1 or dk < 1 or dv < 1:
        raise ValueError(f"{fn}(): q and v must have non-empty head axes of int size")
    _shape(fn, "k", k, (T, H, dk))
    _shape(fn, "v", v, (T, H, dv))
    _shape(fn, "g", g, (T, H))
    _shape(fn, "beta", beta, (T, H))
    _shape(fn, "state", state, (H, dk, dv))
    _shape(fn, "out", out, (T, H, dv))
    if not state.flags.c_contiguous:
        raise ValueError(f"{fn}(): state must be C-contiguous")
    _writeable(fn, "state", state)
    _writeable(fn, "out", out)
    ins = (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))
    for name, x in ins:
        _disjoint(fn, "out", out, name, x)
        _disjoint(fn, "state", state, name, x)
    _disjoint(fn, "out", out, "state", state)
    if snaps is not None:
        if snaps.shape[0] < T - 1 or snaps.shape[1:] != (H, dk, dv):
            raise ValueError(f"{fn}(): snaps must have shape (>= {max(T - 1, 0)}, {H}, {dk}, {dv})")
        if not snaps.flags.c_contiguous:
            raise ValueError(f"{fn}(): snaps must be C-contiguous")
        _writeable(fn, "snaps", snaps)
        for name, x in (*ins, ("state", state), ("out", out)):
            _disjoint(fn, "snaps", snaps, name, x)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "snaps": snaps, "out": out, "eps": eps, "scale": scale}


def _dn_steps(a: dict[str, Any], s: np.ndarray, rec) -> np.ndarray:
    """The tokens of a (from _dn_args) on the float64 state s: outputs, snapshots and (rec given) each token's
    record (normalised k, d, exp(g)); returns the state after the last token."""
    q, k, v, g, beta, snaps, out, eps = a["q"], a["k"], a["v"], a["g"], a["beta"], a["snaps"], a["out"], a["eps"]
    T, dk = q.shape[0], q.shape[2]
    for t in range(T):
        q64 = q[t].astype(np.float64)
        k64 = k[t].astype(np.float64)
        q64 = q64 / np.sqrt(np.sum(q64 * q64, axis=-1, keepdims=True) + eps) * a["scale"]
        k64 = k64 / np.sqrt(np.sum(k64 * k64, axis=-1, keepdims=True) + eps)
        e = np.exp(g[t].astype(np.float64))
        s = s * e[:, None, None]
        kv = np.einsum("hi,hij->hj", k64, s)
        delta = beta[t].astype(np.float64)[:, None] * (v[t].astype(np.float64) - kv)
        s = s + k64[:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hi,hij->hj", q64, s)
        if snaps is not None and t < T - 1:
            snaps[t] = s
        if rec is not None:
            rec[t, :, :dk], rec[t, :, dk:-1], rec[t, :, -1] = k64, delta, e
    return s


# ---------------------------------------------------------------------------------------------- hybrid layers
def causal_conv(window, x, taps, raw, out, n_threads=0) -> None:
    """Depthwise causal conv: raw (M+K-1, C) = [window (K-1, C) | x (M, C)], out[i] = sum_j raw[i+j] * taps[j]
    (float32 products summed in tap order, as the C kernel), then window = raw[M:] (in place)."""
    fn = "causal_conv"
    window, x, taps, raw, out = (_array(fn, n, a, "f", (2,)) for n, a in
                                 (("window", window), ("x", x), ("taps", taps), ("raw", raw), ("out", out)))
    _nthreads(fn, n_threads)
    (m, c), k = x.shape, taps.shape[0]
    if k < 1 or c < 1:
        raise ValueError(f"{fn}(): taps must have at least one row and x at least one column")
    for name, a, shape in (("window", window, (k - 1, c)), ("taps", taps, (k, c)), ("raw", raw, (m + k - 1, c)),
                           ("out", out, (m, c))):
        _shape(fn, name, a, shape)
    named = (("window", window), ("x", x), ("taps", taps), ("raw", raw), ("out", out))
    for i, (an, a) in enumerate(named):
        for bn, b in named[i + 1 :]:
            if an == "window" or bn in ("raw", "out"):
                _disjoint(fn, bn, b, an, a)
    for name, a in (("window", window), ("raw", raw), ("out", out)):
        _writeable(fn, name, a)
    raw[: k - 1], raw[k - 1 :] = window, x
    out[...] = raw[0:m] * taps[0]
    for j in range(1, k):
        out += raw[j : j + m] * taps[j]
    window[...] = raw[m:]


def _gate_args(fn: str, x, out, n_threads) -> tuple[np.ndarray, np.ndarray]:
    x = _array(fn, "x" if fn == "sigmoid" else "alpha", x, "f", (2,))
    out = _array(fn, "out", out, "f", (2,))
    _nthreads(fn, n_threads)
    _shape(fn, "out", out, x.shape)
    _writeable(fn, "out", out)
    _alias_ok(fn, "out", out, "x" if fn == "sigmoid" else "alpha", x)
    return x, out


def sigmoid(x, out, n_threads=0) -> None:
    """out = 1 / (1 + exp(-x)) in float64, row by row (out may be x)."""
    x, out = _gate_args("sigmoid", x, out, n_threads)
    with np.errstate(over="ignore"):
        for i in range(x.shape[0]):
            out[i] = 1.0 / (1.0 + np.exp(-x[i].astype(np.float64)))


def decay(alpha, a, dt, out, n_threads=0) -> None:
    """DeltaNet log-decay out = a * softplus(alpha + dt) in float64, row by row; a, dt (H,) (out may be alpha)."""
    fn = "decay"
    alpha, out = _gate_args(fn, alpha, out, n_threads)
    a, dt = _array(fn, "a", a, "f", (1,)), _array(fn, "dt", dt, "f", (1,))
    _shape(fn, "a", a, alpha.shape[1:])
    _shape(fn, "dt", dt, alpha.shape[1:])
    _disjoint(fn, "out", out, "a", a)
    _disjoint(fn, "out", out, "dt", dt)
    a64, dt64 = a.astype(np.float64), dt.astype(np.float64)
    for i in range(alpha.shape[0]):
        out[i] = a64 * np.logaddexp(0.0, alpha[i].astype(np.float64) + dt64)
