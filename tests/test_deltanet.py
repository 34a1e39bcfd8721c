"""deltanet(): the C kernel against the float64 numpy twin, snapshots equal to the states of token-by-token
calls, bit-identical rows and states whatever the batch or the threads, and argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from cuca import kernels
from cuca.kernels import _ref_ops

IMPLS = {"numpy": _ref_ops}
_c = kernels.implementations().get("c")
if _c is not None and hasattr(_c, "deltanet"):
    IMPLS["c"] = _c

needs_c = pytest.mark.skipif("c" not in IMPLS, reason="C extension not built")


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return IMPLS[request.param]


def _inputs(T: int, H: int = 3, dk: int = 16, dv: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    # q, k, v as strided views into one fused row, as the model passes them
    fused = rng.standard_normal((T, H * (2 * dk + dv)), dtype=np.float32)
    q = fused[:, : H * dk].reshape(T, H, dk)
    k = fused[:, H * dk : 2 * H * dk].reshape(T, H, dk)
    v = fused[:, 2 * H * dk :].reshape(T, H, dv)
    g = -rng.uniform(0.0, 2.0, (T, H)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (T, H)).astype(np.float32)
    s0 = rng.standard_normal((H, dk, dv), dtype=np.float32)
    return q, k, v, g, beta, s0


def _run(mod, inputs, snaps: bool = False, n_threads: int = 0):
    """One deltanet call on inputs = (q, k, v, g, beta, s0), s0 left untouched."""
    q, k, v, g, beta, s0 = inputs
    T, H, dk = q.shape
    dv = v.shape[2]
    st = s0.copy()
    sn = np.full((max(T - 1, 1), H, dk, dv), np.nan, np.float32) if snaps else None
    out = np.full((T, H, dv), np.nan, np.float32)
    mod.deltanet(q, k, v, g, beta, st, sn, out, 1e-6, 0.25, n_threads)
    return out, st, sn


def _by_hand(q, k, v, g, beta, s0):
    """The spec's recurrence, literally, in float64."""
    s = s0.astype(np.float64)
    outs, states = [], []
    for t in range(q.shape[0]):
        o = np.empty(v.shape[1:])
        for h in range(q.shape[1]):
            qh = q[t, h] / np.sqrt(np.sum(q[t, h].astype(np.float64) ** 2) + 1e-6) * 0.25
            kh = k[t, h] / np.sqrt(np.sum(k[t, h].astype(np.float64) ** 2) + 1e-6)
            s[h] *= np.exp(np.float64(g[t, h]))
            delta = beta[t, h] * (v[t, h] - kh @ s[h])
            s[h] += np.outer(kh, delta)
            o[h] = qh @ s[h]
        outs.append(o)
        states.append(s.copy())
    return np.array(outs), states


@pytest.mark.parametrize("T", [1, 2, 7])
@pytest.mark.parametrize("dv", [8, 136])  # 136: vector blocks of columns plus a scalar tail
def test_matches_the_recurrence(impl, T: int, dv: int) -> None:
    q, k, v, g, beta, s0 = _inputs(T, dv=dv)
    want_o, want_s = _by_hand(q, k, v, g, beta, s0)
    assert want_o.shape == (T, 3, dv)
    out, st, sn = _run(impl, (q, k, v, g, beta, s0), True)
    assert np.allclose(out, want_o, rtol=1e-5, atol=1e-5)
    assert np.allclose(st, want_s[-1], rtol=1e-5, atol=1e-5)
    for t in range(T - 1):
        assert np.allclose(sn[t], want_s[t], rtol=1e-5, atol=1e-5)
    if T == 1:
        assert np.isnan(sn).all()  # no snapshot for the last (only) token


@needs_c
@pytest.mark.parametrize("n_threads", [1, 2, 3, 4])
def test_batch_and_threads_invariance(n_threads: int) -> None:
    c = IMPLS["c"]
    T = 6
    q, k, v, g, beta, s0 = _inputs(T, H=5, dk=32, dv=136, seed=1)
    out, st, sn = _run(c, (q, k, v, g, beta, s0), True, n_threads)
    # token by token, one call each, no snapshots, one thread
    s = s0.copy()
    for t in range(T):
        o = np.empty((1, 5, 136), np.float32)
        c.deltanet(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], s, None, o, 1e-6, 0.25, 1)
        assert np.array_equal(o[0], out[t])
        assert np.array_equal(s, sn[t] if t < T - 1 else st)
    # a batch without snapshots gives the same bits too
    out2, st2, _ = _run(c, (q, k, v, g, beta, s0), False, n_threads)
    assert np.array_equal(out2, out) and np.array_equal(st2, st)


def test_bad_arguments(impl) -> None:
    q, k, v, g, beta, s0 = _inputs(4)
    out = np.empty((4, 3, 8), np.float32)
    with pytest.raises(ValueError, match="snaps"):
        impl.deltanet(q, k, v, g, beta, s0.copy(), np.empty((2, 3, 16, 8), np.float32), out, 1e-6, 0.25)
    with pytest.raises(ValueError, match="state"):
        impl.deltanet(q, k, v, g, beta, np.empty((3, 16, 9), np.float32), None, out, 1e-6, 0.25)
    with pytest.raises(ValueError, match="state"):
        impl.deltanet(q, k, v, g, beta, np.empty((3, 8, 16), np.float32).transpose(0, 2, 1), None, out, 1e-6, 0.25)
    with pytest.raises(ValueError, match="beta"):
        impl.deltanet(q, k, v, g, beta[:3], s0.copy(), None, out, 1e-6, 0.25)
    with pytest.raises(TypeError, match="g"):
        impl.deltanet(q, k, v, g.astype(np.float64), beta, s0.copy(), None, out, 1e-6, 0.25)
    with pytest.raises(ValueError, match="overlap|must not overlap"):
        impl.deltanet(q, k, v, g, beta, s0.copy(), None, v, 1e-6, 0.25)
    with pytest.raises(ValueError, match="writeable"):
        ro = s0.copy()
        ro.flags.writeable = False
        impl.deltanet(q, k, v, g, beta, ro, None, out, 1e-6, 0.25)


@needs_c
@pytest.mark.parametrize("offset", [0, 1, 4])  # floats past a 64-byte boundary: streamed or plain snapshot stores
def test_snapshot_alignment(offset: int) -> None:
    c = IMPLS["c"]
    q, k, v, g, beta, s0 = _inputs(5, H=2, dk=16, dv=128, seed=2)
    n = 4 * 2 * 16 * 128
    raw = np.full(n + 32, np.nan, np.float32)
    base = (-raw.ctypes.data % 64) // 4 + offset
    sn = raw[base : base + n].reshape(4, 2, 16, 128)
    st, out = s0.copy(), np.empty((5, 2, 128), np.float32)
    c.deltanet(q, k, v, g, beta, st, sn, out, 1e-6, 0.25, 1)
    want_out, want_st, want_sn = _run(c, (q, k, v, g, beta, s0), True, 1)
    assert np.array_equal(sn, want_sn) and np.array_equal(st, want_st) and np.array_equal(out, want_out)
