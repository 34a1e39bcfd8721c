"""The hybrid layers' element-wise kernels (causal_conv, sigmoid, decay): the C ones against their numpy twins and
the float64 formulas, batch and thread invariance, argument checks; and the hybrid cache's copy-free rollback."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import synth_qwen35 as S  # noqa: E402

from cuca import kernels  # noqa: E402
from cuca.gguf import open_gguf  # noqa: E402
from cuca.kernels import _ref_ops  # noqa: E402
from cuca.models import load_model  # noqa: E402
from cuca.models.deltanet_state import HybridCache  # noqa: E402
from cuca.models.layers import Ops  # noqa: E402

IMPLS = {"numpy": _ref_ops}
_c = kernels.implementations().get("c")
if _c is not None and hasattr(_c, "causal_conv"):
    IMPLS["c"] = _c
needs_c = pytest.mark.skipif("c" not in IMPLS, reason="C extension not built")


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return IMPLS[request.param]


def _conv_inputs(m: int, c: int, k: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    f = np.float32
    return (rng.standard_normal((k - 1, c)).astype(f), rng.standard_normal((m, c)).astype(f),
            rng.standard_normal((k, c)).astype(f))


def _conv(impl, window, x, taps, nt=1):
    w = window.copy()
    raw = np.empty((x.shape[0] + w.shape[0], x.shape[1]), np.float32)
    out = np.empty(x.shape, np.float32)
    impl.causal_conv(w, x, taps, raw, out, nt)
    return out, raw, w


@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("m,c,k", [(1, 6144, 4), (4, 40, 4), (7, 17, 1), (3, 16, 2), (0, 8, 3), (5, 33, 6),
                                   (2, 2500, 4)])
def test_causal_conv_is_the_float32_tap_sum(impl, m, c, k, nt):
    """out = raw[0]*t0, then += raw[j]*tj in float32 (the numpy form the model used), bit for bit, whatever the
    threads (the C kernel shares channels out: 1,024 per item, 2,500 leaves a short last one); the window moves on
    to raw's last k-1 rows."""
    window, x, taps = _conv_inputs(m, c, k)
    out, raw, w = _conv(impl, window, x, taps, nt)
    want_raw = np.concatenate([window, x])
    want = want_raw[0:m] * taps[0]
    for j in range(1, k):
        want += want_raw[j : j + m] * taps[j]
    assert np.array_equal(raw, want_raw) and np.array_equal(out, want) and np.array_equal(w, want_raw[m:])


def _gate_inputs(m: int = 37, h: int = 16):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((m, h)) * 6).astype(np.float32)
    x[0, :4] = [0.0, -0.0, 80.0, -800.0]  # softplus at 0, large arguments both ways
    a = -np.exp(rng.standard_normal(h)).astype(np.float32)
    dt = rng.standard_normal(h).astype(np.float32)
    return x, a, dt


def test_gates_match_float64_formulas(impl):
    x, a, dt = _gate_inputs()
    out = np.empty_like(x)
    impl.sigmoid(x, out)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        want = (1.0 / (1.0 + np.exp(-x64))).astype(np.float32)
    assert np.abs(out.view(np.int32) - want.view(np.int32)).max() <= 1  # float64 exp may differ in its last bit
    impl.decay(x, a, dt, out)
    want = (a.astype(np.float64) * np.logaddexp(0.0, x64 + dt.astype(np.float64))).astype(np.float32)
    assert np.abs(out.view(np.int32) - want.view(np.int32)).max() <= 1
    y = x.copy()
    impl.sigmoid(y, y)  # in place
    impl.sigmoid(x, out)
    assert np.array_equal(y, out)


@needs_c
def test_rows_do_not_depend_on_batch_or_threads():
    c = IMPLS["c"]
    window, x, taps = _conv_inputs(300, 6144, 4, seed=9)
    g, a, dt = _gate_inputs(300)

    def conv(i0, i1, nt):
        out, raw, _ = _conv(c, np.concatenate([window, x])[i0 : i0 + 3], x[i0:i1], taps, nt)
        return out

    def sig(i0, i1, nt):
        o = np.empty((i1 - i0, g.shape[1]), np.float32)
        c.sigmoid(g[i0:i1], o, nt)
        return o

    def dec(i0, i1, nt):
        o = np.empty((i1 - i0, g.shape[1]), np.float32)
        c.decay(g[i0:i1], a, dt, o, nt)
        return o

    for fn in (conv, sig, dec):
        single = np.stack([fn(i, i + 1, 1)[0] for i in range(0, 300, 7)])
        for nt in (1, 2, 3):
            assert np.array_equal(fn(0, 300, nt)[::7], single), (fn.__name__, nt)


@needs_c
def test_c_matches_the_twins():
    for m, ch, k in ((4, 6144, 4), (9, 50, 3)):
        window, x, taps = _conv_inputs(m, ch, k)
        for got, want in zip(_conv(IMPLS["c"], window, x, taps, 2), _conv(_ref_ops, window, x, taps), strict=True):
            assert np.array_equal(got, want)
    x, a, dt = _gate_inputs()
    for name, args in (("sigmoid", (x,)), ("decay", (x, a, dt))):
        got, want = np.empty_like(x), np.empty_like(x)
        getattr(IMPLS["c"], name)(*args, got, 2)
        getattr(_ref_ops, name)(*args, want)
        assert np.abs(got.view(np.int32) - want.view(np.int32)).max() <= 1, name


def test_bad_arguments(impl):
    window, x, taps = _conv_inputs(4, 8, 3)
    raw, out = np.empty((6, 8), np.float32), np.empty((4, 8), np.float32)
    with pytest.raises(ValueError, match="window"):
        impl.causal_conv(window[:1], x, taps, raw, out)
    with pytest.raises(ValueError, match="raw"):
        impl.causal_conv(window, x, taps, raw[:5], out)
    with pytest.raises(TypeError, match="taps"):
        impl.causal_conv(window, x, taps.astype(np.float64), raw, out)
    with pytest.raises(ValueError, match="overlap"):
        impl.causal_conv(window, x, taps, raw, raw[:4])
    with pytest.raises(ValueError, match="n_threads"):
        impl.causal_conv(window, x, taps, raw, out, -1)
    with pytest.raises(ValueError, match="out"):
        impl.sigmoid(x, out[:3])
    with pytest.raises(ValueError, match="dt"):
        impl.decay(x, taps[0], taps[0, :7], out)
    ro = out.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        impl.decay(x, taps[0], taps[1], ro)


class _SnapOps(Ops):
    deferred_states = False  # per-token snapshots (the GPU's rollback), the live state relocated into a slot


class _CopyOps(_SnapOps):
    relocatable_states = False


@pytest.mark.parametrize("max_snaps", [16, 4])
def test_copy_free_rollback_matches_the_copying_one(tmp_path: Path, max_snaps: int) -> None:
    """Rounds of verify + rollback of every depth: the relocating cache (the live state a snapshot slot, the next
    snapshots placed around it, or moved back home when there is no room) gives the copying cache's logits and
    states bit for bit."""
    path = S.write(tmp_path / "q.gguf", S.TINY, seed=0)
    models = [load_model(open_gguf(path), ops) for ops in (_SnapOps(1), _CopyOps(1))]
    caches = [HybridCache(512, m.c, m.ops, max_snaps=max_snaps) for m in models]
    rng = np.random.default_rng(2)
    n = 0
    for step in range(24):
        m = 1 + int(rng.integers(0, max_snaps + 1)) if step else 20  # a prefill first
        toks = rng.integers(0, 320, m).astype(np.int32)
        pos = np.arange(n, n + m, dtype=np.int32)
        outs = [mod.forward(toks, pos, c, "all") for mod, c in zip(models, caches, strict=True)]
        assert np.array_equal(outs[0], outs[1])
        back = int(rng.integers(0, m)) if 1 < m <= max_snaps + 1 else 0
        for c in caches:
            c.trim(back)
        n += m - back
    for x, y in zip(caches[0].ssm + caches[0].conv, caches[1].ssm + caches[1].conv, strict=True):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("max_snaps", [16, 4])
def test_deferred_records_match_snapshots(tmp_path: Path, max_snaps: int) -> None:
    """The CPU cache keeps a rollable batch's state updates as records that the next pass applies: rounds of verify +
    rollback of every depth, plain steps, long batches (which apply the records first), snapshot / restore and a
    reset give the snapshot cache's logits and states bit for bit."""
    path = S.write(tmp_path / "q.gguf", S.TINY, seed=0)
    models = [load_model(open_gguf(path), ops) for ops in (Ops(2), _SnapOps(2))]
    caches = [HybridCache(512, m.c, m.ops, max_snaps=max_snaps) for m in models]
    assert caches[0].deferred and not caches[1].deferred
    rng = np.random.default_rng(5)
    n, saved = 0, None
    for step in range(40):
        m = 20 if step in (0, 25) else 1 if step % 7 == 3 else 1 + int(rng.integers(0, max_snaps + 1))
        toks = rng.integers(0, 320, m).astype(np.int32)
        outs = [mod.forward(toks, np.arange(n, n + m, dtype=np.int32), c, "all")
                for mod, c in zip(models, caches, strict=True)]
        assert np.array_equal(outs[0], outs[1])
        back = int(rng.integers(0, m)) if 1 < m <= max_snaps + 1 else 0
        for c in caches:
            c.trim(back)
        n += m - back
        if step == 12:
            saved = [c.snapshot() for c in caches]
        if step == 18:
            assert saved is not None
            for c, snap in zip(caches, saved, strict=True):
                c.restore(snap)
            n = saved[0][0]
        for x, y in zip(caches[0].states() + caches[0].conv, caches[1].ssm + caches[1].conv, strict=True):
            assert np.array_equal(x, y)
    for c in caches:
        c.reset()
    assert not any(a.any() for a in caches[0].states())
