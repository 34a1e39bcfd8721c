"""The numpy twins of the composite kernels (block.c): their steps' twins one after another."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._ref_ops import (
    _array,
    _disjoint,
    _shape,
    attention,
    causal_conv,
    decay,
    deltanet_deferred,
    rms_norm,
    rope,
    sigmoid,
    silu_mul,
)

__all__ = ["attention_core", "gdn_core"]


def attention_core(q, k, v, q_norm, k_norm, v_norm, eps, pos, n_rot, freq_base, neox, freq_factors, freq_scale,
                   k_cache, v_cache, n_kv, window, scale, softcap, out, n_threads=0) -> None:
    """A layer's attention in one call: q normed (q_norm False, None or its weight) and roped in place; k / v (None:
    read the caches only) normed (v_norm False or None; k_norm as q_norm) or copied into the float32 cache rows pos
    (k roped there); then attention() into out."""
    fn = "attention_core"
    q = _array(fn, "q", q, "f", (3,))
    kc, vc = (_array(fn, n, c, "c", (3,)) for n, c in (("k_cache", k_cache), ("v_cache", v_cache)))
    pos = _array(fn, "pos", pos, "i", (1,))
    out = _array(fn, "out", out, "f", (3,))
    m, hd = q.shape[0], q.shape[2]
    if (k is None) != (v is None):
        raise ValueError(f"{fn}(): k and v must both be given or both None")
    if kc.dtype != np.float32 or vc.dtype != np.float32:
        raise TypeError(f"{fn}(): k_cache and v_cache must be float32")
    if m < 1 or np.any(pos != pos[0] + np.arange(m)) or pos[0] < 0 or pos[0] + m > kc.shape[1]:
        raise ValueError(f"{fn}(): pos must be one ascending run inside the cache's {kc.shape[1]} positions")
    if v_norm is not False and v_norm is not None:
        raise ValueError(f"{fn}(): v_norm must be False or None (a norm without weight)")
    for name, c in (("k_cache", kc), ("v_cache", vc)):
        _disjoint(fn, "q", q, name, c)
        _disjoint(fn, "out", out, name, c)
    rows: list[tuple[Any, np.ndarray]] = []
    if k is not None:
        k, v = _array(fn, "k", k, "f", (3,)), _array(fn, "v", v, "f", (3,))
        _shape(fn, "k", k, (m, kc.shape[0], hd))
        _shape(fn, "v", v, (m, kc.shape[0], hd))
        p0 = int(pos[0])
        rows = [(v_norm, v), (k_norm, k)]  # v first: v may be k's own projection; neither is written
        dst = [vc[:, p0 : p0 + m, :].transpose(1, 0, 2), kc[:, p0 : p0 + m, :].transpose(1, 0, 2)]
    if q_norm is not False:
        rms_norm(q, q_norm, eps, q, n_threads)
    rope(q, pos, n_rot, freq_base, neox, freq_factors, freq_scale, n_threads)
    for i, (w, x) in enumerate(rows):
        y = x.copy()
        if w is not False:
            rms_norm(x, w, eps, y, n_threads)
        if i == 1:
            rope(y, pos, n_rot, freq_base, neox, freq_factors, freq_scale, n_threads)
        dst[i][...] = y
    attention(q, kc, vc, pos, n_kv, window, scale, softcap, out, n_threads)


def gdn_core(mixed, yb, ya, z, a, dt, window, taps, ones, raw, state, pend, n_pend, rec, defer, norm_w, norm_eps,
             l2_eps, scale, y, n_threads=0) -> None:
    """A Gated DeltaNet layer between its projections: beta = sigmoid(yb), g = decay(ya, a, dt), x = silu of the
    causal conv of mixed (raw, window as causal_conv), the deferred recurrence over q, k, v = x's column ranges (H
    from yb, dk / dv from state), y = silu(z) * rms_norm(o, norm_w) per head."""
    fn = "gdn_core"
    mixed = _array(fn, "mixed", mixed, "f", (2,))
    state = _array(fn, "state", state, "f", (3,))
    m, h, dk, dv = mixed.shape[0], np.shape(yb)[1], state.shape[1], state.shape[2]
    if mixed.shape[1] != 2 * h * dk + h * dv:
        raise ValueError(f"{fn}(): mixed must have rows of 2 H dk + H dv floats")
    ins = {n: _array(fn, n, v, "f", (1, 2, 3)) for n, v in (("yb", yb), ("ya", ya), ("z", z), ("ones", ones),
                                                            ("taps", taps), ("norm_w", norm_w))}
    for n, shape in (("yb", (m, h)), ("ya", (m, h)), ("z", (m, h * dv)), ("ones", mixed.shape)):
        _shape(fn, n, ins[n], shape)
    outs = {n: _array(fn, n, v, "f", (2, 3)) for n, v in (("window", window), ("raw", raw), ("y", y))}
    outs["state"] = state
    if rec is not None:
        outs["rec"] = _array(fn, "rec", rec, "f", (3,))
    ins["mixed"] = mixed
    if pend is not None:
        ins["pend"] = _array(fn, "pend", pend, "f", (3,))
    names = list(outs)
    for i, n in enumerate(names):
        for other in names[i + 1 :]:
            _disjoint(fn, n, outs[n], other, outs[other])
        for other, arr in ins.items():
            _disjoint(fn, n, outs[n], other, arr)
    beta, g = np.empty((m, h), np.float32), np.empty((m, h), np.float32)
    sigmoid(yb, beta, n_threads)
    decay(ya, a, dt, g, n_threads)
    x = np.empty(mixed.shape, np.float32)
    causal_conv(window, mixed, taps, raw, x, n_threads)
    silu_mul(x, ones, x, n_threads)
    hk = h * dk
    q, k, v = x[:, :hk].reshape(m, h, dk), x[:, hk : 2 * hk].reshape(m, h, dk), x[:, 2 * hk :].reshape(m, h, dv)
    o = np.empty((m, h, dv), np.float32)
    deltanet_deferred(q, k, v, g, beta, state, o, pend, n_pend, rec, defer, l2_eps, scale, n_threads)
    y = _array(fn, "y", y, "f", (2,))
    if not y.flags.c_contiguous:
        raise ValueError(f"{fn}(): y must be C-contiguous")
    y3 = y.reshape(m, h, dv)
    rms_norm(o, norm_w, norm_eps, y3, n_threads)
    silu_mul(_array(fn, "z", z, "f", (2,)).reshape(m, h, dv), y3, y3, n_threads)
