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


def _deferred(mod, inputs, pend, n_pend: int, defer: int, n_threads: int = 1):
    """One deltanet_deferred call on inputs = (q, k, v, g, beta, state): (out, state after, records)."""
    q, k, v, g, beta, s = inputs
    T, H, dk = q.shape
    dv = v.shape[2]
    st, out = s.copy(), np.full((T, H, dv), np.nan, np.float32)
    rec = np.full((max(T, 1), H, dk + dv + 1), np.nan, np.float32)
    mod.deltanet_deferred(q, k, v, g, beta, st, out, pend, n_pend, rec, defer, 1e-6, 0.25, n_threads)
    return out, st, rec


@pytest.mark.parametrize("dv", [8, 136])
def test_deferred_commit_matches_the_recurrence(impl, dv: int) -> None:
    """A batch of 4 deferred (the state stays), then 2 of its tokens replayed from their records before 3 more: the
    same outputs and final state as the 5 tokens run in order."""
    q, k, v, g, beta, s0 = _inputs(7, dv=dv, seed=3)
    want_o, want_s = _by_hand(q, k, v, g, beta, s0)
    first = tuple(x[:4] for x in (q, k, v, g, beta)) + (s0,)
    out, st, rec = _deferred(impl, first, None, 0, 1)
    assert np.array_equal(st, s0)  # deferred: nothing stored
    assert np.allclose(out, want_o[:4], rtol=1e-5, atol=1e-5)
    rest = tuple(x[2:5] for x in (q, k, v, g, beta)) + (st,)
    out2, st2, _ = _deferred(impl, rest, rec, 2, 0)  # tokens 0, 1 kept (2, 3 rolled back), then 2..4 again
    assert np.allclose(out2, want_o[2:5], rtol=1e-5, atol=1e-5)
    assert np.allclose(st2, want_s[4], rtol=1e-5, atol=1e-5)


@needs_c
@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("dv", [40, 136])  # 40: one vector block and a scalar tail
def test_deferred_commit_is_bit_identical_to_in_place(n_threads: int, dv: int) -> None:
    """Every way of deferring and replaying gives the bits of the plain in-place kernel, token by token: a deferred
    batch's outputs, a flush (no new tokens), pending records applied before new tokens with or without deferring
    those, and the records themselves (replaying a record is the token's own state update)."""
    c = IMPLS["c"]
    T = 6
    q, k, v, g, beta, s0 = _inputs(T, H=5, dk=32, dv=dv, seed=4)
    states, outs, s = [], [], s0.copy()
    for t in range(T):
        o = np.empty((1, 5, dv), np.float32)
        c.deltanet(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], s, None, o, 1e-6, 0.25, 1)
        states.append(s.copy())
        outs.append(o[0])
    sl = lambda a, b: tuple(x[a:b] for x in (q, k, v, g, beta))  # noqa: E731
    out, st, rec = _deferred(c, sl(0, 4) + (s0,), None, 0, 1, n_threads)
    assert np.array_equal(out, np.array(outs[:4])) and np.array_equal(st, s0)
    for keep in (1, 2, 3, 4):  # a rollback to `keep` tokens, then a flush: the state after token keep - 1
        empty = tuple(x[:0] for x in sl(0, 1))
        _, flushed, _ = _deferred(c, empty + (s0,), rec, keep, 0, n_threads)
        assert np.array_equal(flushed, states[keep - 1])
    # 2 pending, then tokens 2..5 deferred: the pending committed, outputs as in order
    out2, st2, rec2 = _deferred(c, sl(2, 6) + (s0,), rec, 2, 1, n_threads)
    assert np.array_equal(st2, states[1]) and np.array_equal(out2, np.array(outs[2:6]))
    # 3 of those pending, then token 5 plain (not deferred): everything committed
    out3, st3, _ = _deferred(c, sl(5, 6) + (st2,), rec2, 3, 0, n_threads)
    assert np.array_equal(out3[0], outs[5]) and np.array_equal(st3, states[5])


def test_deferred_bad_arguments(impl) -> None:
    q, k, v, g, beta, s0 = _inputs(2)
    out = np.empty((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match="rec"):
        impl.deltanet_deferred(q, k, v, g, beta, s0.copy(), out, None, 0, np.empty((2, 3, 24), np.float32), 1,
                               1e-6, 0.25)
    with pytest.raises(ValueError, match="pend"):
        impl.deltanet_deferred(q, k, v, g, beta, s0.copy(), out, np.empty((1, 3, 25), np.float32), 2, None, 0,
                               1e-6, 0.25)
    with pytest.raises(ValueError, match="n_pend|pend"):
        impl.deltanet_deferred(q, k, v, g, beta, s0.copy(), out, None, 1, None, 0, 1e-6, 0.25)
