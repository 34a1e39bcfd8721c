"""rms_norm, residual_norm, rope, silu_mul, gelu_mul, softcap: C against the numpy twins and float64 formulas, row
invariance (a row's result does not depend on the batch or the threads), aliasing, argument checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuca import kernels
from cuca.kernels import _ref_ops

IMPLS = {"numpy": _ref_ops}
_c = kernels.implementations().get("c")
if _c is not None and hasattr(_c, "rms_norm"):
    IMPLS["c"] = _c


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return IMPLS[request.param]


needs_c = pytest.mark.skipif("c" not in IMPLS, reason="C extension not built")


def _rms64(x, w, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w.astype(np.float64)


# ------------------------------------------------------------------------------------------ rms_norm
@pytest.mark.parametrize("shape", [(1, 640), (5, 1152), (33, 64), (3, 7), (4, 4, 256), (2, 3, 17), (100,)])
@pytest.mark.parametrize("with_w", [True, False])
def test_rms_norm(impl, shape, with_w):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32) if with_w else None
    out = np.full_like(x, np.nan)
    impl.rms_norm(x, w, 1e-6, out)
    np.testing.assert_allclose(out, _rms64(x, w, 1e-6), rtol=1e-6, atol=1e-7)
    # in place
    y = x.copy()
    impl.rms_norm(y, w, 1e-6, y)
    np.testing.assert_allclose(y, out, rtol=1e-6, atol=1e-7)


def test_rms_norm_views_and_eps(impl):
    rng = np.random.default_rng(7)
    fused = rng.standard_normal((3, 6, 32)).astype(np.float32)
    view = fused[:, 1:5]  # per-head norm of a slice of a fused buffer
    out = np.empty((3, 4, 32), np.float32)
    impl.rms_norm(view, None, 1e-5, out)
    np.testing.assert_allclose(out, _rms64(view, None, 1e-5), rtol=1e-6, atol=1e-7)
    rows = fused.reshape(3, 192)[:, :64]
    out2 = np.empty((3, 64), np.float32)
    impl.rms_norm(rows, None, 1e-5, out2)
    np.testing.assert_allclose(out2, _rms64(rows, None, 1e-5), rtol=1e-6, atol=1e-7)
    z = np.zeros((2, 8), np.float32)
    impl.rms_norm(z, None, 1e-6, z)  # zero rows stay zero (eps keeps it finite)
    assert np.array_equal(z, np.zeros_like(z))


@needs_c
def test_rms_norm_mirrors_ggml_rounding():
    # float products, double sum, float mean, scale = 1/sqrtf(mean + eps), y = (x*scale)*w in float
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 640)).astype(np.float32)
    w = rng.standard_normal(640).astype(np.float32)
    out = np.empty_like(x)
    IMPLS["c"].rms_norm(x, w, 1e-6, out)
    s = np.sum((x * x).astype(np.float64), axis=1)
    mean = (s / 640).astype(np.float32)
    scale = np.float32(1) / np.sqrt(mean + np.float32(1e-6))
    expect = (x * scale[:, None]) * w
    assert np.max(np.abs(out - expect) / np.abs(expect)) < 3e-7  # only the order of the double sum differs


@pytest.mark.parametrize("norm_y, norm_out, scale", [(False, True, 1.0), (True, True, 1.0), (True, False, 0.5),
                                                     (True, True, 0.25), (False, False, 2.0)])
def test_residual_norm_is_the_steps_one_by_one(impl, norm_y, norm_out, scale):
    """x += rms_norm(y) * w_y (or y), x *= scale, out = rms_norm(x) * w_out: the bits of those calls in turn (what the
    models ran before the fused step), with and without weights."""
    rng = np.random.default_rng(9)
    for w_y, w_out in ((rng.standard_normal(640).astype(np.float32), rng.standard_normal(640).astype(np.float32)),
                       (None, None)):
        x = rng.standard_normal((6, 640)).astype(np.float32)
        y = rng.standard_normal((6, 640)).astype(np.float32)
        x0 = x.copy()
        t = y
        if norm_y:
            t = np.empty_like(y)
            impl.rms_norm(y, w_y, 1e-6, t)
        x0 += t
        if scale != 1.0:
            x0 *= np.float32(scale)
        out = np.empty_like(x)
        impl.residual_norm(x, y, w_y if norm_y else False, w_out if norm_out else False, 1e-6, scale, out)
        assert np.array_equal(x, x0)
        if norm_out:
            ref = np.empty_like(x)
            impl.rms_norm(x0, w_out, 1e-6, ref)
            assert np.array_equal(out, ref)


# ------------------------------------------------------------------------------------------ rope
def _rope64(x, pos, n_rot, base, neox, freq):
    """rope in float64 with exact angles (independent of the float32 angle recurrence); freq = (freq_factors or
    None, freq_scale)."""
    ff, fscale = freq
    y = x.astype(np.float64).copy()
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    if ff is not None:
        inv = inv / ff.astype(np.float64)
    th = pos.astype(np.float64)[:, None] * fscale * inv
    c, s = np.cos(th)[:, None], np.sin(th)[:, None]
    i0, i1 = (
        (np.arange(half), np.arange(half) + half)
        if neox
        else (np.arange(0, n_rot, 2), np.arange(1, n_rot, 2))
    )
    x0, x1 = y[:, :, i0].copy(), y[:, :, i1].copy()
    y[:, :, i0] = x0 * c - x1 * s
    y[:, :, i1] = x0 * s + x1 * c
    return y


ROPE_CASES = [
    # M, n_head, hd, n_rot, base, neox, with ff, freq_scale
    (3, 4, 64, 64, 10000.0, False, False, 1.0),
    (5, 2, 128, 128, 500000.0, False, True, 1.0),
    (4, 4, 256, 256, 1000000.0, True, False, 1.0),
    (2, 3, 256, 256, 10000.0, True, False, 0.125),
    (3, 2, 128, 64, 10000.0, True, True, 0.5),  # partial rotation
    (3, 2, 80, 32, 10000.0, False, False, 1.0),
]


@pytest.mark.parametrize("case", ROPE_CASES, ids=[f"rope{i}" for i in range(len(ROPE_CASES))])
def test_rope(impl, case):
    M, H, hd, n_rot, base, neox, with_ff, fscale = case
    rng = np.random.default_rng(hd + n_rot)
    x = rng.standard_normal((M, H, hd)).astype(np.float32)
    ff = rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32) if with_ff else None
    pos = np.array([0, 1, 17, 100, 250][:M], dtype=np.int32)
    y = x.copy()
    impl.rope(y, pos, n_rot, base, neox, ff, fscale)
    assert np.array_equal(y[:, :, n_rot:], x[:, :, n_rot:])  # unrotated dims untouched
    # small positions: the float32 angle recurrence is within ~1e-5 rad of the exact angle
    np.testing.assert_allclose(y, _rope64(x, pos, n_rot, base, neox, (ff, fscale)), rtol=0, atol=2e-5)


@needs_c
@pytest.mark.parametrize("neox", [False, True])
def test_rope_c_matches_twin_at_large_positions(neox):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 4, 128)).astype(np.float32)
    pos = np.array([0, 999, 4097, 12345, 32767, 40000], dtype=np.int32)
    ff = rng.uniform(1.0, 4.0, 64).astype(np.float32)
    for f in (None, ff):
        a, b = x.copy(), x.copy()
        IMPLS["c"].rope(a, pos, 128, 1000000.0, neox, f, 1.0)
        _ref_ops.rope(b, pos, 128, 1000000.0, neox, f, 1.0)
        np.testing.assert_allclose(a, b, rtol=0, atol=3e-6)


def test_rope_rotation_by_hand(impl):
    # pos 1, hd 4, base 100: pair 0 turns by 1 rad, pair 1 by 100^(-1/2) = 0.1 rad
    x = np.array([[[1.0, 0.0, 1.0, 0.0]]], np.float32)
    y = x.copy()
    impl.rope(y, np.array([1], np.int32), 4, 100.0, False, None, 1.0)
    np.testing.assert_allclose(y[0, 0], [math.cos(1), math.sin(1), math.cos(0.1), math.sin(0.1)], atol=1e-6)
    y = np.array([[[1.0, 1.0, 0.0, 0.0]]], np.float32)  # neox pairs are (0, 2) and (1, 3)
    impl.rope(y, np.array([1], np.int32), 4, 100.0, True, None, 1.0)
    np.testing.assert_allclose(y[0, 0], [math.cos(1), math.cos(0.1), math.sin(1), math.sin(0.1)], atol=1e-6)


def test_rope_strided_view(impl):
    rng = np.random.default_rng(12)
    fused = rng.standard_normal((3, 8, 64)).astype(np.float32)
    qk = fused[:, :6]  # q and k heads of a fused qkv buffer, rotated in one call
    expect = np.ascontiguousarray(qk)
    pos = np.array([5, 6, 7], np.int32)
    impl.rope(expect, pos, 64, 10000.0, True, None, 1.0)
    v_before = fused[:, 6:].copy()
    impl.rope(qk, pos, 64, 10000.0, True, None, 1.0)
    assert np.array_equal(fused[:, :6], expect)
    assert np.array_equal(fused[:, 6:], v_before)


# ------------------------------------------------------------------------------------------ gating
def _silu64(g):
    g = g.astype(np.float64)
    return g / (1.0 + np.exp(-g))


def _gelu64(g):
    g = g.astype(np.float64)
    return 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)))


def _gate_inputs():
    rng = np.random.default_rng(13)
    g = np.concatenate(
        [np.linspace(-30, 30, 6001), rng.standard_normal(3000) * 3, [0.0, -0.0, 100.0, -100.0, 1e-30, -1e-30]]
    ).astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    return g, u


@pytest.mark.parametrize("name,f64", [("silu_mul", _silu64), ("gelu_mul", _gelu64)])
def test_gating(impl, name, f64):
    g, u = _gate_inputs()
    out = np.full_like(g, np.nan)
    getattr(impl, name)(g, u, out)
    ref = f64(g) * u.astype(np.float64)
    assert np.isfinite(out).all()
    # ~1e-7 relative for silu; gelu's exp argument carries float rounding (about 1e-6 relative where
    # |gelu| > 1e-2, a few 1e-7 absolute elsewhere)
    tol = 1e-6 * np.abs(ref) + 6e-7 * np.abs(u)
    assert np.all(np.abs(out - ref) <= tol), name
    # aliasing: out is g, or out is u
    g2, u2 = g.copy(), u.copy()
    getattr(impl, name)(g2, u, g2)
    getattr(impl, name)(g, u2, u2)
    assert np.array_equal(g2, out) and np.array_equal(u2, out)


@pytest.mark.parametrize("name", ["silu_mul", "gelu_mul"])
def test_gating_views(impl, name):
    # gate and up halves of a fused (M, 2F) matmul output
    rng = np.random.default_rng(14)
    gu = rng.standard_normal((5, 2 * 37)).astype(np.float32)
    out = np.empty((5, 37), np.float32)
    getattr(impl, name)(gu[:, :37], gu[:, 37:], out)
    ref = np.empty_like(out)
    getattr(impl, name)(np.ascontiguousarray(gu[:, :37]), np.ascontiguousarray(gu[:, 37:]), ref)
    assert np.array_equal(out, ref)


# ------------------------------------------------------------------------------------------ softcap
@pytest.mark.parametrize("shape", [(1, 262144 + 5), (3, 1000), (2, 3, 17), (7,)])
def test_softcap(impl, shape):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 40).astype(np.float32)
    x.reshape(-1)[:6] = [0.0, -0.0, 1e4, -1e4, 1e-30, np.inf]
    ref = 30.0 * np.tanh(x.astype(np.float64) / 30.0)
    y = x.copy()
    impl.softcap(y, 30.0)
    # float tanh (vmath.h): ~1e-7 relative; near 0 it is odd and exact in sign
    assert np.all(np.abs(y - ref) <= 4e-7 * np.abs(ref) + 1e-37)
    assert y.reshape(-1)[1] == 0.0 and np.signbit(y.reshape(-1)[1])


@needs_c
def test_softcap_elements_do_not_depend_on_rows_or_threads():
    c = IMPLS["c"]
    x = (np.random.default_rng(3).standard_normal((5, 40001)) * 50).astype(np.float32)  # 3 chunks per row
    alone = []
    for i in range(5):
        r = x[i].copy()
        c.softcap(r, 30.0, 1)
        alone.append(r)
    for nt in (1, 2, 3):
        y = x.copy()
        c.softcap(y, 30.0, nt)
        assert np.array_equal(y, np.stack(alone)), nt
        z = x[1:4, 3:].copy()  # other chunk boundaries
        c.softcap(z, 30.0, nt)
        assert np.array_equal(z[:, 16384 - 3:], np.stack(alone)[1:4, 16384:]), nt


def test_softcap_checks(impl):
    x = np.zeros((2, 8), np.float32)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="cap"):
            impl.softcap(x, bad)
    with pytest.raises(TypeError, match="cap"):
        impl.softcap(x, "30")
    with pytest.raises(TypeError, match="x"):
        impl.softcap(x.astype(np.float64), 30.0)
    ro = x.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="x"):
        impl.softcap(ro, 30.0)


# ------------------------------------------------------------------------------------------ row invariance
@needs_c
def test_rows_do_not_depend_on_batch_or_threads():
    c = IMPLS["c"]
    rng = np.random.default_rng(15)
    n = 1152
    x = rng.standard_normal((300, n)).astype(np.float32)
    y = rng.standard_normal((300, n)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    pos = rng.integers(0, 30000, 300).astype(np.int32)

    def each(fn):
        return np.stack([fn(i, i + 1, 1)[0] for i in range(0, 300, 7)])

    def rms(i0, i1, nt):
        o = np.empty((i1 - i0, n), np.float32)
        c.rms_norm(x[i0:i1], w, 1e-6, o, nt)
        return o

    def residual(i0, i1, nt):
        xx = x[i0:i1].copy()
        o = np.empty_like(xx)
        c.residual_norm(xx, y[i0:i1], w, w[::-1].copy(), 1e-6, 0.75, o, nt)
        return np.concatenate([xx, o], axis=1)

    def rope(i0, i1, nt):
        xx = x[i0:i1].reshape(i1 - i0, 9, 128).copy()
        c.rope(xx, pos[i0:i1], 128, 1e6, True, None, 1.0, nt)
        return xx.reshape(i1 - i0, n)

    def silu(i0, i1, nt):
        o = np.empty((i1 - i0, n), np.float32)
        c.silu_mul(x[i0:i1], y[i0:i1], o, nt)
        return o

    def gelu(i0, i1, nt):
        o = np.empty((i1 - i0, n), np.float32)
        c.gelu_mul(x[i0:i1], y[i0:i1], o, nt)
        return o

    for fn in (rms, residual, rope, silu, gelu):
        single = each(fn)
        for nt in (1, 2, 3):
            assert np.array_equal(fn(0, 300, nt)[::7], single), (fn.__name__, nt)


# ------------------------------------------------------------------------------------------ argument checks
def test_bad_arguments(impl):
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(TypeError, match="x"):
        impl.rms_norm(x.astype(np.float64), None, 1e-6, x)
    with pytest.raises(ValueError, match="w"):
        impl.rms_norm(x, np.ones(7, np.float32), 1e-6, x)
    with pytest.raises(ValueError, match="out"):
        impl.rms_norm(x, None, 1e-6, np.zeros((2, 9), np.float32))
    with pytest.raises(ValueError, match="out"):
        impl.rms_norm(x, None, 1e-6, x[:, ::-1])
    with pytest.raises(ValueError, match="contiguous"):
        impl.rms_norm(np.zeros((2, 16), np.float32)[:, ::2], None, 1e-6, x)
    with pytest.raises(TypeError, match="eps"):
        impl.rms_norm(x, None, None, x)
    with pytest.raises(ValueError, match="n_threads"):
        impl.rms_norm(x, None, 1e-6, x, -2)
    with pytest.raises(ValueError, match="y"):
        impl.residual_norm(x, np.zeros((3, 8), np.float32), None, None, 1e-6, 1.0, x.copy())
    ro = np.zeros((2, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="x"):
        impl.residual_norm(ro, x.copy(), None, None, 1e-6, 1.0, x.copy())
    with pytest.raises(ValueError, match="out"):
        impl.residual_norm(x, x.copy(), None, None, 1e-6, 1.0, x)  # out is x: it would be overwritten
    with pytest.raises(ValueError, match="x"):
        impl.residual_norm(x, x, None, None, 1e-6, 1.0, x.copy())
    with pytest.raises(ValueError, match="w_y"):
        impl.residual_norm(x, x.copy(), np.ones(7, np.float32), None, 1e-6, 1.0, x.copy())
    with pytest.raises(TypeError, match="w_out"):
        impl.residual_norm(x, x + 1, None, np.ones(8, np.float64), 1e-6, 1.0, x.copy())
    assert not x.any()  # refused before x was touched

    r = np.zeros((2, 3, 16), np.float32)
    p = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match="n_rot"):
        impl.rope(r, p, 15, 10000.0, False, None, 1.0)
    with pytest.raises(ValueError, match="n_rot"):
        impl.rope(r, p, 18, 10000.0, False, None, 1.0)
    with pytest.raises(ValueError, match="freq_base"):
        impl.rope(r, p, 16, 0.0, False, None, 1.0)
    with pytest.raises(TypeError, match="pos"):
        impl.rope(r, p.astype(np.int64), 16, 10000.0, False, None, 1.0)
    with pytest.raises(ValueError, match="pos"):
        impl.rope(r, np.zeros(3, np.int32), 16, 10000.0, False, None, 1.0)
    with pytest.raises(ValueError, match="freq_factors"):
        impl.rope(r, p, 16, 10000.0, False, np.ones(7, np.float32), 1.0)
    with pytest.raises(ValueError, match="x"):
        impl.rope(r[0], p, 16, 10000.0, False, None, 1.0)

    with pytest.raises(ValueError, match="u"):
        impl.silu_mul(x, np.zeros((2, 9), np.float32), x.copy())
    with pytest.raises(TypeError, match="g"):
        impl.gelu_mul([1.0], x, x.copy())
    buf = np.zeros(20, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        impl.silu_mul(buf[:16].reshape(2, 8), x, buf[4:].reshape(2, 8))
    with pytest.raises(TypeError):
        impl.silu_mul(x, x)
