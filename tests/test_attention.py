"""attention(): the C kernel against the float64 numpy twin, batch invariance (bit-identical rows whatever the
batch, the row order or the thread count), edge cases and argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from cuca import kernels
from cuca.kernels import _ref_ops

IMPLS = {"numpy": _ref_ops}
_c = kernels.implementations().get("c")
if _c is not None and hasattr(_c, "attention"):
    IMPLS["c"] = _c


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return IMPLS[request.param]


needs_c = pytest.mark.skipif("c" not in IMPLS, reason="C extension not built")


def _cache(rng, shape, n_kv, dtype=np.float32):
    """Random K/V caches of shape (n_kv_head, n_ctx, hd_k, hd_v), NaN past n_kv."""
    n_kv_head, n_ctx, hd_k, hd_v = shape
    k = rng.standard_normal((n_kv_head, n_ctx, hd_k), dtype=np.float32).astype(dtype)
    v = rng.standard_normal((n_kv_head, n_ctx, hd_v), dtype=np.float32).astype(dtype)
    # positions past n_kv hold garbage that must never be read
    k[:, n_kv:] = np.nan
    v[:, n_kv:] = np.nan
    return k, v


def _run(mod, q, kv, pos, attn, n_threads=0):
    """One attention call; kv = (k, v), attn = (n_kv, window, scale, softcap)."""
    (k, v), (n_kv, window, scale, softcap) = kv, attn
    out = np.full((q.shape[0], q.shape[1], v.shape[2]), np.nan, dtype=np.float32)
    mod.attention(
        q, k, v, np.ascontiguousarray(pos, dtype=np.int32), n_kv, window, scale, softcap, out, n_threads
    )
    return out


CASES = [
    # M, n_head, n_kv_head, hd_k, hd_v, n_ctx, n_kv, window, softcap
    (1, 4, 1, 256, 256, 2100, 2000, 0, 0.0),  # gemma3-270m-like decode, split over superblocks
    (4, 4, 1, 256, 256, 1100, 1030, 0, 0.0),
    (3, 8, 8, 64, 64, 300, 300, 0, 0.0),  # GQA ratio 1
    (5, 6, 2, 128, 128, 700, 650, 0, 50.0),  # ratio 3, softcap
    (7, 32, 4, 64, 64, 520, 513, 0, 0.0),  # ratio 8, one key past a superblock
    (6, 4, 1, 256, 256, 900, 900, 64, 0.0),  # sliding window
    (9, 8, 2, 512, 512, 200, 180, 17, 30.0),  # hd 512, window + softcap
    (5, 6, 2, 80, 72, 400, 390, 100, 0.0),  # head dims that are not a multiple of the vector width
    (2, 3, 1, 20, 12, 50, 33, 0, 0.0),
]


@needs_c
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_matches_reference(case, dtype):
    M, H, Hkv, D, Dv, n_ctx, n_kv, window, softcap = case
    rng = np.random.default_rng(hash(case) % 2**32)
    q = rng.standard_normal((M, H, D), dtype=np.float32)
    k, v = _cache(rng, (Hkv, n_ctx, D, Dv), n_kv, dtype)
    # the last positions (decode / verify) plus a few arbitrary ones, one past n_kv (clamped)
    pos = np.arange(n_kv - M, n_kv, dtype=np.int32)
    pos[0] = min(pos[0], rng.integers(0, n_kv))
    if M > 2:
        pos[1] = n_kv + 5
    scale = 1.0 / np.sqrt(D)
    ref = _run(_ref_ops, q, (k, v), pos, (n_kv, window, scale, softcap))
    got = _run(IMPLS["c"], q, (k, v), pos, (n_kv, window, scale, softcap))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)


@needs_c
def test_sharp_softmax_and_large_scores():
    # scores far apart: the softmax is nearly one-hot; exp must neither overflow nor lose the winner
    rng = np.random.default_rng(1)
    M, H, Hkv, D, n_ctx = 3, 4, 2, 64, 1500
    q = rng.standard_normal((M, H, D), dtype=np.float32) * 8
    k, v = _cache(rng, (Hkv, n_ctx, D, D), n_ctx)
    pos = np.array([1499, 700, 3], dtype=np.int32)
    for scale in (0.125, 3.0):
        ref = _run(_ref_ops, q, (k, v), pos, (n_ctx, 0, scale, 0.0))
        got = _run(IMPLS["c"], q, (k, v), pos, (n_ctx, 0, scale, 0.0))
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_probabilities_below_the_normal_floats_are_exactly_zero(impl):
    # A key scoring 95 below the best has probability exp(-95) = 5.5e-42, a subnormal float; the kernels make it
    # exactly 0 instead (a subnormal operand costs a microcode assist in every later multiply: hd-512 attention
    # ran 5-6x slower). With that key's V at 1e30 a subnormal would leave 5.5e-12 in the output.
    q = np.zeros((1, 2, 16), np.float32)
    q[0, :, 0] = 1.0
    k = np.zeros((1, 4, 16), np.float32)
    v = np.zeros((1, 4, 16), np.float32)
    k[0, 1, 0], v[0, 1, :] = -95.0, 1e30  # scores 0, -95, -87, 0 with scale 1
    k[0, 2, 0], v[0, 2, :] = -87.0, 1.0
    out = _run(impl, q, (k, v), [3], (4, 0, 1.0, 0.0))
    assert np.isfinite(out).all()
    # key 2 (exp(-87) = 1.65e-38, normal) still counts: its share over the three surviving weights
    np.testing.assert_allclose(out[0, :, :], np.exp(-87.0) / (2 + np.exp(-87.0)), rtol=1e-5)


def test_window_one_and_first_position(impl):
    # window 1: each row sees only its own key, so out = v[pos]; position 0 sees only key 0 too
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, 4, 32), dtype=np.float32)
    k, v = _cache(rng, (2, 40, 32, 16), 30)
    pos = np.array([5, 0, 29], dtype=np.int32)
    out = _run(impl, q, (k, v), pos, (30, 1, 0.2, 0.0))
    for i, p in enumerate(pos):
        for h in range(4):
            np.testing.assert_allclose(out[i, h], v[h // 2, p], rtol=1e-6, atol=1e-7)
    out = _run(impl, q, (k, v), pos, (30, 0, 0.2, 0.0))
    np.testing.assert_allclose(out[1, 0], v[0, 0], rtol=1e-6, atol=1e-7)


def test_no_visible_key_gives_zeros(impl):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((3, 2, 16), dtype=np.float32)
    k, v = _cache(rng, (1, 20, 16, 16), 10)
    out = _run(impl, q, (k, v), [-1, -5, 4], (10, 0, 0.25, 0.0))
    assert np.array_equal(out[:2], np.zeros_like(out[:2]))
    assert np.isfinite(out[2]).all() and np.abs(out[2]).sum() > 0
    out = _run(impl, q, (k, v), [3, 4, 5], (0, 0, 0.25, 0.0))  # empty cache
    assert np.array_equal(out, np.zeros_like(out))
    empty = np.zeros((0, 2, 16), np.float32)
    impl.attention(empty, k, v, np.zeros(0, np.int32), 10, 0, 0.25, 0.0, empty.copy())


def test_strided_views(impl):
    # q as a view into a fused qkv buffer, caches as views into a longer per-layer buffer
    rng = np.random.default_rng(4)
    M, H, Hkv, D = 4, 4, 2, 32
    fused = rng.standard_normal((M, H + 2 * Hkv, D), dtype=np.float32)
    q = fused[:, :H]
    big_k = rng.standard_normal((2, Hkv, 100, D), dtype=np.float32)
    big_v = rng.standard_normal((2, Hkv, 100, D), dtype=np.float32)
    pos = np.array([60, 61, 62, 63], dtype=np.int32)
    out = np.empty((M, H, D), np.float32)
    impl.attention(q, big_k[1, :, :64], big_v[1, :, :64], pos, 64, 0, 0.3, 0.0, out)
    ref = _run(_ref_ops, np.ascontiguousarray(q), (big_k[1].copy(), big_v[1].copy()), pos, (64, 0, 0.3, 0.0))
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6)
    out_big = np.zeros((M, H + 2, D), np.float32)
    impl.attention(q, big_k[1], big_v[1], pos, 64, 0, 0.3, 0.0, out_big[:, 1 : H + 1])
    np.testing.assert_allclose(out_big[:, 1 : H + 1], ref, rtol=2e-5, atol=2e-6)
    assert not out_big[:, 0].any() and not out_big[:, H + 1].any()


# ------------------------------------------------------------------------------------------ batch invariance
INV_CASES = [
    # n_head, n_kv_head, hd_k, hd_v, n_ctx, n_kv, window, softcap, cache dtype
    (4, 1, 256, 256, 1600, 1500, 0, 0.0, np.float32),
    (6, 2, 80, 72, 1200, 1100, 0, 20.0, np.float32),
    (8, 8, 64, 64, 700, 650, 40, 0.0, np.float32),
    (16, 2, 128, 128, 1100, 1030, 300, 0.0, np.float32),
    (4, 1, 256, 256, 1300, 1200, 0, 0.0, np.float16),
    (6, 3, 40, 40, 1200, 1100, 0, 0.0, np.float16),
    # one superblock of keys, split by blocks of keys at decode (E2B's and Gemma 3's decode shapes)
    (8, 1, 256, 256, 520, 300, 0, 0.0, np.float32),
    (4, 1, 256, 256, 520, 201, 128, 0.0, np.float32),
]


@needs_c
@pytest.mark.parametrize("case", INV_CASES, ids=[f"inv{i}" for i in range(len(INV_CASES))])
def test_batch_invariance(case):
    H, Hkv, D, Dv, n_ctx, n_kv, window, softcap, dtype = case
    c = IMPLS["c"]
    rng = np.random.default_rng(int(sum(case[:-1])))
    n_rows = 40
    q = rng.standard_normal((n_rows, H, D), dtype=np.float32)
    k, v = _cache(rng, (Hkv, n_ctx, D, Dv), n_kv, dtype)
    # decode/verify-like positions near the end, spread positions and a few small ones
    pos = np.concatenate([np.arange(n_kv - 20, n_kv), rng.integers(0, n_kv, 17), [0, 1, n_kv + 3]]).astype(
        np.int32
    )
    scale = D**-0.5
    single = np.stack(
        [
            _run(c, q[i : i + 1], (k, v), pos[i : i + 1], (n_kv, window, scale, softcap), 1)[0]
            for i in range(n_rows)
        ]
    )
    for nt in (1, 2, 3):
        got = _run(c, q, (k, v), pos, (n_kv, window, scale, softcap), nt)
        assert np.array_equal(got, single), f"full batch, n_threads={nt}"
    for nt in (2, 4):
        got = np.stack(
            [
                _run(c, q[i : i + 1], (k, v), pos[i : i + 1], (n_kv, window, scale, softcap), nt)[0]
                for i in range(8)
            ]
        )
        assert np.array_equal(got.view(np.uint32), single[:8].view(np.uint32)), f"M=1, n_threads={nt}"
    for m in (2, 3, 4, 5, 16, 32):
        idx = rng.permutation(n_rows)[:m]
        for nt in (1, 2):
            got = _run(c, q[idx], (k, v), pos[idx], (n_kv, window, scale, softcap), nt)
            assert np.array_equal(got, single[idx]), f"M={m}, n_threads={nt}"


@needs_c
def test_prefill_rows_match_single_rows():
    # a causal prefill of 700 rows (many tiles, mixed visible ranges) against rows computed alone
    c = IMPLS["c"]
    rng = np.random.default_rng(5)
    M, H, Hkv, D = 700, 4, 1, 64
    q = rng.standard_normal((M, H, D), dtype=np.float32)
    k, v = _cache(rng, (Hkv, 800, D, D), M)
    pos = np.arange(M, dtype=np.int32)
    for window in (0, 100):
        full = _run(c, q, (k, v), pos, (M, window, 0.125, 0.0), 2)
        for i in (0, 1, 15, 16, 17, 127, 128, 129, 511, 512, 513, 699):
            one = _run(c, q[i : i + 1], (k, v), pos[i : i + 1], (M, window, 0.125, 0.0), 1)
            assert np.array_equal(full[i], one[0]), f"row {i}, window {window}"
        ref = _run(_ref_ops, q[::50], (k, v), pos[::50], (M, window, 0.125, 0.0))
        np.testing.assert_allclose(full[::50], ref, rtol=2e-5, atol=2e-6)


# ------------------------------------------------------------------------------------------ argument checks
def _args():
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 4, 16), dtype=np.float32)
    k = rng.standard_normal((2, 10, 16), dtype=np.float32)
    v = rng.standard_normal((2, 10, 8), dtype=np.float32)
    pos = np.array([3, 4], dtype=np.int32)
    out = np.zeros((2, 4, 8), np.float32)
    return dict(q=q, k_cache=k, v_cache=v, q_pos=pos, n_kv=5, window=0, scale=0.25, softcap=0.0, out=out)


BAD = [
    ("q", lambda a: a["q"].astype(np.float64), TypeError),
    ("q", lambda a: a["q"].tolist(), TypeError),
    ("q", lambda a: a["q"][:, :, ::2], ValueError),
    ("q", lambda a: a["q"][0], ValueError),
    ("k_cache", lambda a: a["k_cache"][:, :, :8], ValueError),
    ("k_cache", lambda a: np.zeros((2, 20, 16), np.float32)[:, ::2], ValueError),
    ("k_cache", lambda a: np.zeros((3, 10, 16), np.float32), ValueError),
    ("k_cache", lambda a: np.zeros((2, 10, 16), np.float64), TypeError),
    ("v_cache", lambda a: a["v_cache"].astype(np.float16), TypeError),  # k and v differ in dtype
    ("v_cache", lambda a: np.zeros((2, 9, 8), np.float32), ValueError),
    ("q_pos", lambda a: a["q_pos"].astype(np.int64), TypeError),
    ("q_pos", lambda a: np.zeros(3, np.int32), ValueError),
    ("out", lambda a: np.zeros((2, 4, 16), np.float32), ValueError),
    ("out", lambda a: np.zeros((2, 4, 8), np.float16), TypeError),
    ("n_kv", lambda a: 11, ValueError),
    ("n_kv", lambda a: -1, ValueError),
    ("n_kv", lambda a: 2.0, TypeError),
    ("window", lambda a: -3, ValueError),
    ("scale", lambda a: "x", TypeError),
    ("softcap", lambda a: float("nan"), ValueError),
]


@pytest.mark.parametrize("name,make,exc", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_arguments(impl, name, make, exc):
    a = _args()
    a[name] = make(a)
    with pytest.raises(exc, match=name):
        impl.attention(**a)


def test_bad_arguments_more(impl):
    a = _args()
    with pytest.raises(ValueError, match="n_threads"):
        impl.attention(**a, n_threads=-1)
    bad_out = np.zeros((2, 4, 8), np.float32)
    bad_out.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        impl.attention(**{**a, "out": bad_out})
    # out overlapping the inputs
    buf = np.zeros((2, 4, 16), np.float32)
    with pytest.raises(ValueError, match="out"):
        impl.attention(**{**a, "q": buf, "out": buf[:, :, :8]})
    # heads not a multiple of the kv heads
    with pytest.raises(ValueError, match="heads"):
        impl.attention(**{**a, "q": np.zeros((2, 3, 16), np.float32), "out": np.zeros((2, 3, 8), np.float32)})
    with pytest.raises(TypeError):
        impl.attention(a["q"], a["k_cache"])
    with pytest.raises(TypeError, match="bogus"):
        impl.attention(**a, bogus=1)
