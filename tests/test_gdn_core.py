"""gdn_core(): a Gated DeltaNet layer's gates, conv, SiLU, deferred recurrence, norm and gate in one call, against
those steps one by one with the same implementation's kernels (C and its numpy twin): the same bits in every output
and state it moves on; its argument checks; a Qwen 3.5 pass through it equal to one through the steps."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import synth_qwen35 as S  # noqa: E402

from cuca import kernels  # noqa: E402
from cuca.gguf import open_gguf  # noqa: E402
from cuca.kernels import _ref  # noqa: E402
from cuca.models import load_model  # noqa: E402
from cuca.models.layers import Ops  # noqa: E402

IMPLS: dict[str, Any] = {"numpy": _ref}
_c = kernels.implementations().get("c")
if _c is not None and hasattr(_c, "gdn_core"):
    IMPLS["c"] = _c

H, DK, K = 4, 16, 4
C, HV, W = 3 * H * DK, H * DK, 2 * DK + 1


def _setup(rng: np.random.Generator, m: int, n_pend: int) -> dict[str, Any]:
    f = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    pend = f(3, H, W)
    pend[:, :, -1] = rng.uniform(0.5, 1.0, (3, H)).astype(np.float32)  # exp(g) of a real record
    return {"mixed": f(m, C), "z": f(m, HV), "yb": f(m, H), "ya": f(m, H), "a": -rng.uniform(0.1, 2.0, H).astype(
        np.float32), "dt": f(H), "window": f(K - 1, C), "taps": f(K, C), "state": f(H, DK, DK) * 0.1,
        "pend": pend if n_pend else None, "norm_w": f(DK), "m": m}


def _steps(k: Any, d: dict[str, Any], n_pend: int, keep: bool, defer: int) -> tuple[np.ndarray, ...]:
    """What qwen35's _gdn does one kernel at a time."""
    m = d["m"]
    window, state = d["window"].copy(), d["state"].copy()
    beta, g = np.empty((m, H), np.float32), np.empty((m, H), np.float32)
    k.sigmoid(d["yb"], beta, 2)
    k.decay(d["ya"], d["a"], d["dt"], g, 2)
    x, raw = np.empty((m, C), np.float32), np.empty((m + K - 1, C), np.float32)
    k.causal_conv(window, d["mixed"], d["taps"], raw, x, 2)
    k.silu_mul(x, np.ones((m, C), np.float32), x, 2)
    q, kk, v = (x[:, i * HV : (i + 1) * HV].reshape(m, H, DK) for i in range(3))
    o, recs = np.empty((m, H, DK), np.float32), np.zeros((4, H, W), np.float32) if keep else None
    k.deltanet_deferred(q, kk, v, g, beta, state, o, d["pend"], n_pend, recs, defer, 1e-6, 0.25, 2)
    y = np.empty((m, H, DK), np.float32)
    k.rms_norm(o, d["norm_w"], 1e-5, y, 2)
    k.silu_mul(d["z"].reshape(m, H, DK), y, y, 2)
    return y.reshape(m, HV), raw, window, state, recs


def _core(k: Any, d: dict[str, Any], n_pend: int, keep: bool, defer: int, **kw: Any) -> tuple[np.ndarray, ...]:
    m = d["m"]
    a = {"window": d["window"].copy(), "state": d["state"].copy(), "raw": np.empty((m + K - 1, C), np.float32),
         "y": np.empty((m, HV), np.float32), "rec": np.zeros((4, H, W), np.float32) if keep else None,
         "mixed": d["mixed"], "ones": np.ones((m, C), np.float32), "pend": d["pend"]} | kw
    k.gdn_core(a["mixed"], d["yb"], d["ya"], d["z"], d["a"], d["dt"], a["window"], d["taps"], a["ones"], a["raw"],
               a["state"], a["pend"], n_pend, a["rec"], defer, d["norm_w"], 1e-5, 1e-6, 0.25, a["y"], 2)
    return a["y"], a["raw"], a["window"], a["state"], a["rec"]


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("records", ["none", "pending", "verify"])
def test_gdn_core_is_the_steps(impl: str, m: int, records: str) -> None:
    """Decode (no records, or pending ones from a verify pass) and a verify pass (records kept, state deferred)."""
    k = IMPLS[impl]
    n_pend = 0 if records == "none" else 2
    keep, defer = records == "verify", int(records == "verify")
    d = _setup(np.random.default_rng(10 * m + n_pend), m, n_pend)
    for got, want in zip(_core(k, d, n_pend, keep, defer), _steps(k, d, n_pend, keep, defer), strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            assert np.array_equal(got, want)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_gdn_core_checks_its_arguments(impl: str) -> None:
    """It names what is wrong: rows of mixed that do not match the heads, ones of another shape, an output
    overlapping an input, pending records without their array, records of the wrong width."""
    k = IMPLS[impl]
    d = _setup(np.random.default_rng(0), 2, 1)
    _core(k, d, 1, False, 0)
    with pytest.raises(ValueError, match="mixed"):
        _core(k, d, 1, False, 0, mixed=d["mixed"][:, :-4].copy())
    with pytest.raises(ValueError, match="ones"):
        _core(k, d, 1, False, 0, ones=np.ones((3, C), np.float32))
    y = np.empty((2, C), np.float32)
    with pytest.raises(ValueError, match="overlap"):
        _core(k, d, 1, False, 0, mixed=y, y=y[:, :HV])
    with pytest.raises(ValueError, match="pend"):
        _core(k, d, 1, False, 0, pend=None)
    with pytest.raises(ValueError, match="rec"):
        _core(k, d, 1, True, 1, rec=np.zeros((4, H, W + 1), np.float32))


def test_qwen35_pass_through_gdn_core_is_the_steps(tmp_path: Any) -> None:
    """The tiny Qwen 3.5 file's prefill, a verify pass of 4 rows rolled back by 2, then a decode step: through
    gdn_core, and through the steps (an Ops class whose silu is its own, which gdn_core must not stand for): the
    same logits, bit for bit."""
    class Steps(Ops):
        def silu(self, x: np.ndarray) -> np.ndarray:
            return super().silu(x)

    class Counted(Ops):  # the composite's calls that ran (not None)
        ran = 0

        def gdn_core(self, *args: Any) -> Any:
            out = super().gdn_core(*args)
            Counted.ran += out is not None
            return out

    path = S.write(tmp_path / "qwen35-tiny.gguf", S.TINY, seed=0)
    rng = np.random.default_rng(3)
    prompt, batch = rng.integers(0, 320, 12).astype(np.int32), rng.integers(0, 320, 4).astype(np.int32)
    outs = []
    for ops in (Counted(2), Steps(2)):
        model = load_model(open_gguf(path), ops)
        cache = model.make_cache(32)
        got = [model.forward(prompt, np.arange(12, dtype=np.int32), cache, "all"),
               model.forward(batch, np.arange(12, 16, dtype=np.int32), cache, "all")]
        cache.trim(2)
        got.append(model.forward(batch[2:3], np.array([14], np.int32), cache, "all"))
        outs.append(got)
    assert outs[0][0].shape[0] == 12
    n_gdn = sum((il + 1) % S.TINY.interval != 0 for il in range(S.TINY.n_layer))
    assert n_gdn > 0 and Counted.ran == 3 * n_gdn  # every Gated DeltaNet layer of the 3 passes took the composite
    for a, b in zip(*outs, strict=True):
        assert np.array_equal(a, b)
