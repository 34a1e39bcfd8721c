"""matmul / get_rows / activation quantizers: the C kernels against their numpy twins for every weight format,
bit-for-bit batch invariance (batch size, position in the batch, thread count), ggml's activation rounding
rules, and argument validation."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
from quant_data import random_weight

from cuca import quants as Q
from cuca.kernels import _ref, implementations

IMPLS = implementations()
C = IMPLS.get("c")
needs_c = pytest.mark.skipif(C is None, reason="C extension not built")

ALL = sorted(Q.SUPPORTED_TYPES)
NAMES = {t: Q.type_name(t) for t in ALL}
MS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32]

# |C - numpy| / (|W| @ |x|): float32 accumulation error only (the numpy twin is exact to float64)
TOL_FLOAT = 1e-6
TOL_Q8 = 1e-6  # Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
TOL_K = 1e-6  # Q4_K, Q5_K, Q6_K
# |result - float64 W @ x| / (|W| @ |x|): what 8-bit activations cost at most
TOL_ACT_QUANT = 2e-2


def tol(wtype: int) -> float:
    return TOL_FLOAT if wtype in Q.FLOAT_TYPES else TOL_K if wtype in Q.K_TYPES else TOL_Q8


def shape(wtype: int) -> tuple[int, int]:
    """n_out, n_in: odd row counts, an odd number of 32-blocks, float rows that end in a partial vector"""
    if wtype in Q.K_TYPES:
        return 37, 768
    if wtype in Q.FLOAT_TYPES:
        return 37, 100
    return 37, 352


@pytest.fixture(params=list(IMPLS), ids=list(IMPLS))
def kernels(request: pytest.FixtureRequest) -> ModuleType:
    return IMPLS[request.param]


def run(k: ModuleType, w: np.ndarray, wtype: int, x: np.ndarray, n_threads: int = 0) -> np.ndarray:
    n_out, n_in = w.shape[0], x.shape[1]
    out = np.full((x.shape[0], n_out), np.nan, np.float32)
    k.matmul(w, wtype, n_out, n_in, np.ascontiguousarray(x), out, n_threads)
    return out


def rows(n: int, n_in: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, n_in), dtype=np.float32)
    x[1, :] *= np.float32(1e-3)  # rows of very different magnitudes
    x[2, : n_in // 2] = 0.0  # and a row whose first blocks are all zero
    return x


@needs_c
@pytest.mark.parametrize("wtype", ALL, ids=NAMES.get)
def test_c_matches_numpy(wtype: int) -> None:
    n_out, n_in = shape(wtype)
    w = random_weight(wtype, n_out, n_in, seed=wtype)
    x = rows(40, n_in, seed=wtype)
    want = run(_ref, w, wtype, x)
    scale = np.abs(Q.dequantize64(w, wtype, n_out, n_in)) @ np.abs(x.astype(np.float64)).T
    exact = Q.dequantize64(w, wtype, n_out, n_in) @ x.astype(np.float64).T
    assert np.all(np.abs(want - exact.T) <= TOL_ACT_QUANT * scale.T + 1e-30)
    for M in MS:
        for start in (0, 40 - M):
            got = run(C, w, wtype, x[start : start + M])
            err = np.abs(got - want[start : start + M]) / (scale.T[start : start + M] + 1e-30)
            assert err.max() <= tol(wtype), (M, start, err.max())


@pytest.mark.parametrize("wtype", ALL, ids=NAMES.get)
def test_batch_invariance(kernels: ModuleType, wtype: int) -> None:
    """out[m] is bit-identical whatever the batch size, the row's position and the thread count."""
    n_out, n_in = shape(wtype)
    w = random_weight(wtype, n_out, n_in, seed=100 + wtype)
    x = rows(40, n_in, seed=wtype)
    single = np.concatenate([run(kernels, w, wtype, x[m : m + 1], 1) for m in range(40)])
    rng = np.random.default_rng(wtype)
    for M in MS[1:] + [40]:
        pick = rng.permutation(40)[:M]
        for n_threads in (1, 2):
            assert np.array_equal(run(kernels, w, wtype, x[pick], n_threads), single[pick]), (M, n_threads)
        start = int(rng.integers(0, 41 - M))
        assert np.array_equal(run(kernels, w, wtype, x[start : start + M]), single[start : start + M]), M


@needs_c
@pytest.mark.parametrize("wtype", [Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.F16], ids=NAMES.get)
def test_batch_invariance_prefill_sized(wtype: int) -> None:
    """A prefill-sized batch (many tiles, many row blocks per thread) against one-row calls."""
    n_out, n_in = 70, 512
    w = random_weight(wtype, n_out, n_in, seed=7)
    x = rows(130, n_in, seed=7)
    batch = run(C, w, wtype, x, 2)
    for m in (0, 1, 2, 63, 64, 65, 129):
        assert np.array_equal(run(C, w, wtype, x[m : m + 1], 1), batch[m : m + 1]), m


def test_float_weights_of_any_dtype(kernels: ModuleType) -> None:
    """w is raw bytes: F32 as uint8, BF16 as uint16 or uint8 give the same result."""
    x = rows(3, 64)
    w32 = random_weight(Q.F32, 5, 64)
    assert np.array_equal(run(kernels, w32.view(np.uint8), Q.F32, x), run(kernels, w32, Q.F32, x))
    wbf = random_weight(Q.BF16, 5, 64)
    assert np.array_equal(run(kernels, wbf.view(np.uint16), Q.BF16, x), run(kernels, wbf, Q.BF16, x))
    wf = Q.dequantize(wbf, Q.BF16, 5, 64)
    assert np.allclose(run(kernels, wbf, Q.BF16, x), x.astype(np.float64) @ wf.T, rtol=1e-5, atol=1e-5)


# ---- activation quantizers ----------------------------------------------------------------------------


@needs_c
@pytest.mark.parametrize("name", ["quantize_q8_0", "quantize_q8_1", "quantize_q8_K"])
def test_quantizers_bit_identical(name: str) -> None:
    x = rows(9, 512, seed=5)
    x[3, 256:] = 0.0
    x[4, 5] = np.float32(1e30)
    got, want = getattr(C, name)(x), getattr(_ref, name)(x)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(g, w)


def test_q8_0_rounds_half_to_even(kernels: ModuleType) -> None:
    """As ggml's x86 quantize_row_q8_0 (_mm256_round_ps, nearest): ties go to the even code."""
    x = np.zeros((1, 32), np.float32)
    x[0, :6] = [127.0, 2.5, -2.5, 0.5, -126.5, 3.5]  # amax 127: the scale factor is exactly 1
    q, d = kernels.quantize_q8_0(x)
    assert q[0, :6].tolist() == [127, 2, -2, 0, -126, 4] and d[0, 0] == np.float32(np.float16(1.0))
    q, d, s = kernels.quantize_q8_1(x)
    assert s[0, 0] == np.float32(np.float16(127 + 2 - 2 + 0 - 126 + 4))
    q, d = kernels.quantize_q8_0(np.zeros((2, 64), np.float32))
    assert not q.any() and not d.any()


def test_q8_K_rounds_half_even_and_keeps_sign_of_first_max(kernels: ModuleType) -> None:
    x = np.zeros((1, 256), np.float32)
    x[0, :4] = [-127.0, 2.5, 3.5, 127.0]  # first max is -127: scale -127/-127 = 1
    q, d, bsums = kernels.quantize_q8_K(x)
    assert q[0, :4].tolist() == [-127, 2, 4, 127] and d[0, 0] == 1.0
    assert bsums[0, 0] == -127 + 2 + 4 + 127 and not bsums[0, 1:].any()
    x[0, 0] = 127.0  # now the first max is positive: the codes flip sign
    q, d, _ = kernels.quantize_q8_K(x)
    assert q[0, :4].tolist() == [-127, -2, -4, -127] and d[0, 0] == -1.0


# ---- get_rows -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wtype", ALL, ids=NAMES.get)
def test_get_rows(kernels: ModuleType, wtype: int) -> None:
    n_out, n_in = shape(wtype)
    w = random_weight(wtype, n_out, n_in, seed=wtype)
    ids = np.array([5, 0, 36, 5], np.int32)
    out = np.zeros((4, n_in), np.float32)
    kernels.get_rows(w, wtype, n_out, n_in, ids, out)
    assert np.array_equal(out, Q.dequantize(w, wtype, n_out, n_in)[ids])
    empty = np.zeros((0, n_in), np.float32)
    kernels.get_rows(w, wtype, n_out, n_in, np.zeros(0, np.int32), empty)


def test_get_rows_rejects_bad_ids(kernels: ModuleType) -> None:
    w = random_weight(Q.Q8_0, 4, 64)
    out = np.zeros((2, 64), np.float32)
    for bad in ([0, 4], [-1, 0]):
        with pytest.raises(ValueError, match="ids"):
            kernels.get_rows(w, Q.Q8_0, 4, 64, np.array(bad, np.int32), out)
    with pytest.raises(TypeError, match="ids"):
        kernels.get_rows(w, Q.Q8_0, 4, 64, np.array([0, 1], np.int64), out)
    with pytest.raises(ValueError, match="out"):
        kernels.get_rows(w, Q.Q8_0, 4, 64, np.array([0, 1, 2], np.int32), out)


# ---- validation -----------------------------------------------------------------------------------------


def test_matmul_validation(kernels: ModuleType) -> None:
    w = random_weight(Q.Q4_0, 8, 64)
    x = np.zeros((2, 64), np.float32)
    out = np.zeros((2, 8), np.float32)
    mm = kernels.matmul
    mm(w, Q.Q4_0, 8, 64, x, out)
    cases: list[tuple[type[Exception], str, tuple]] = [
        (TypeError, "w", ([1, 2], Q.Q4_0, 8, 64, x, out)),
        (ValueError, "w", (w[:, :-1].copy(), Q.Q4_0, 8, 64, x, out)),
        (ValueError, "w", (w[::2], Q.Q4_0, 4, 64, x, out)),
        (ValueError, "wtype", (w, 10, 8, 64, x, out)),  # Q2_K: not supported
        (ValueError, "wtype", (w, 12345, 8, 64, x, out)),
        (ValueError, "n_in", (w, Q.Q4_0, 8, 48, x, out)),
        (ValueError, "n_out", (w, Q.Q4_0, 0, 64, x, out)),
        (TypeError, "x", (w, Q.Q4_0, 8, 64, x.astype(np.float64), out)),
        (TypeError, "x", (w, Q.Q4_0, 8, 64, x.tolist(), out)),
        (ValueError, "x", (w, Q.Q4_0, 8, 64, np.zeros((2, 128), np.float32)[:, ::2], out)),
        (ValueError, "x", (w, Q.Q4_0, 8, 64, np.zeros(64, np.float32), out[:1].reshape(8))),
        (ValueError, "x", (w, Q.Q4_0, 8, 64, np.zeros((0, 64), np.float32), out[:0])),
        (ValueError, "x", (w, Q.Q4_0, 8, 64, np.zeros((2, 32), np.float32), out)),
        (TypeError, "out", (w, Q.Q4_0, 8, 64, x, out.astype(np.float64))),
        (ValueError, "out", (w, Q.Q4_0, 8, 64, x, np.zeros((2, 9), np.float32))),
        (ValueError, "out", (w, Q.Q4_0, 8, 64, x, np.zeros((3, 8), np.float32))),
        (ValueError, "out", (w, Q.Q4_0, 8, 64, x, np.zeros((8, 2), np.float32).T)),
    ]
    for exc, name, args in cases:
        with pytest.raises(exc, match=name):
            mm(*args)
    ro = np.zeros((2, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        mm(w, Q.Q4_0, 8, 64, x, ro)
    xo = np.zeros((2, 64), np.float32)
    with pytest.raises(ValueError, match="overlap"):
        mm(w, Q.Q4_0, 8, 64, xo, xo.reshape(-1)[:16].reshape(2, 8))
    with pytest.raises(ValueError, match="n_threads"):
        mm(w, Q.Q4_0, 8, 64, x, out, -1)


def test_quantizer_validation(kernels: ModuleType) -> None:
    with pytest.raises(ValueError, match="x"):
        kernels.quantize_q8_0(np.zeros((2, 48), np.float32))
    with pytest.raises(ValueError, match="x"):
        kernels.quantize_q8_K(np.zeros((2, 512 + 32), np.float32))
    with pytest.raises(TypeError, match="x"):
        kernels.quantize_q8_1(np.zeros((2, 64), np.float64))
