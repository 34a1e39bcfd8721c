"""attention_core(): a layer's q / k / v norms, RoPE, K/V store and attention in one call, against those steps one
by one with the same implementation's kernels (C and its numpy twin): the same bits; its argument checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cuca import kernels
from cuca.kernels import _ref

IMPLS: dict[str, Any] = {"numpy": _ref}
_c = kernels.implementations().get("c")
if _c is not None and hasattr(_c, "attention_core"):
    IMPLS["c"] = _c

M_H_HKV_HD = [(1, 8, 1, 64), (3, 4, 2, 32), (5, 6, 3, 16)]


def _setup(rng: np.random.Generator, m: int, h: int, hkv: int, hd: int, p0: int) -> dict[str, Any]:
    n_ctx = p0 + m + 3
    return {"q": rng.standard_normal((m, h, hd), dtype=np.float32),
            "k": rng.standard_normal((m, hkv, hd), dtype=np.float32),
            "v": rng.standard_normal((m, hkv, hd), dtype=np.float32),
            "kc": rng.standard_normal((hkv, n_ctx, hd), dtype=np.float32),
            "vc": rng.standard_normal((hkv, n_ctx, hd), dtype=np.float32),
            "wq": rng.standard_normal(hd, dtype=np.float32), "wk": rng.standard_normal(hd, dtype=np.float32),
            "pos": np.arange(p0, p0 + m, dtype=np.int32), "ff": rng.uniform(0.5, 2.0, hd // 2).astype(np.float32)}


def _steps(k: Any, d: dict[str, Any], o: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What layers.Attention's steps do: q norm and rope; v norm or copy, k norm or copy, k rope; store; attention."""
    q, kc, vc, pos = d["q"].copy(), d["kc"].copy(), d["vc"].copy(), d["pos"]
    rope = (o["n_rot"], 1e4, o["neox"], o["ff"], 1.0)
    if o["q_norm"] is not False:
        k.rms_norm(q.copy(), o["q_norm"], 1e-6, q, 2)
    k.rope(q, pos, *rope, 2)
    if o["kv"]:
        v = d["k"] if o["v_is_k"] else d["v"]
        vv, kk = v.copy(), d["k"].copy()
        if o["v_norm"] is not False:
            k.rms_norm(v, None, 1e-6, vv, 2)
        if o["k_norm"] is not False:
            k.rms_norm(d["k"], o["k_norm"], 1e-6, kk, 2)
        k.rope(kk, pos, *rope, 2)
        p0, m = int(pos[0]), q.shape[0]
        kc[:, p0 : p0 + m, :] = kk.transpose(1, 0, 2)
        vc[:, p0 : p0 + m, :] = vv.transpose(1, 0, 2)
    out = np.empty_like(q)
    k.attention(q, kc, vc, pos, int(pos[-1]) + 1, o["window"], 0.125, o["softcap"], out, 2)
    return out, kc, vc


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("shape", M_H_HKV_HD, ids=str)
@pytest.mark.parametrize("variant", ["gemma4", "gemma4-v-is-k", "llama", "llama-v-is-k", "shared", "window-softcap"])
def test_attention_core_is_the_steps(impl: str, shape: tuple[int, int, int, int], variant: str) -> None:
    k = IMPLS[impl]
    m, h, hkv, hd = shape
    d = _setup(np.random.default_rng(m * 100 + h), m, h, hkv, hd, p0=6)
    norms, llama = not variant.startswith(("llama", "shared")), variant.startswith("llama")
    o = {"q_norm": d["wq"] if norms else False, "k_norm": d["wk"] if norms else False,
         "v_norm": None if norms else False, "kv": variant != "shared", "v_is_k": variant.endswith("v-is-k"),
         "n_rot": hd // 2 if llama else hd, "neox": not llama, "ff": d["ff"] if variant == "gemma4" else None,
         "window": 4 if variant == "window-softcap" else 0, "softcap": 30.0 if variant == "window-softcap" else 0.0}
    want = _steps(k, d, o)
    q, kc, vc, out = d["q"].copy(), d["kc"].copy(), d["vc"].copy(), np.empty_like(d["q"])
    kk = d["k"] if o["kv"] else None
    vv = (d["k"] if o["v_is_k"] else d["v"]) if o["kv"] else None
    k.attention_core(q, kk, vv, o["q_norm"], o["k_norm"], o["v_norm"], 1e-6, d["pos"], o["n_rot"], 1e4, o["neox"],
                     o["ff"], 1.0, kc, vc, int(d["pos"][-1]) + 1, o["window"], 0.125, o["softcap"], out, 2)
    for got, w in zip((out, kc, vc), want, strict=True):
        assert np.array_equal(got, w)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_attention_core_checks_its_arguments(impl: str) -> None:
    """It names what is wrong: positions that are not one run inside the cache, k without v, a float16 cache, out
    overlapping q, a weight for v's norm, more keys than the cache holds."""
    k = IMPLS[impl]
    d = _setup(np.random.default_rng(0), 3, 4, 2, 32, p0=2)

    def call(**kw: Any) -> None:
        a = {"q": d["q"].copy(), "k": d["k"], "v": d["v"], "v_norm": None, "pos": d["pos"], "kc": d["kc"].copy(),
             "vc": d["vc"].copy(), "n_kv": 5, "out": np.empty_like(d["q"])} | kw
        k.attention_core(a["q"], a["k"], a["v"], d["wq"], d["wk"], a["v_norm"], 1e-6, a["pos"], 32, 1e4, True, None,
                         1.0, a["kc"], a["vc"], a["n_kv"], 0, 0.125, 0.0, a["out"], 2)

    call()
    with pytest.raises(ValueError, match="ascending run"):
        call(pos=np.array([2, 4, 5], np.int32))
    with pytest.raises(ValueError, match="ascending run"):
        call(pos=np.array([6, 7, 8], np.int32))  # past the cache's 8 positions
    with pytest.raises(ValueError, match="both"):
        call(v=None)
    with pytest.raises(TypeError, match="float32"):
        call(kc=d["kc"].astype(np.float16), vc=d["vc"].astype(np.float16))
    q = d["q"].copy()
    with pytest.raises(ValueError, match="overlap"):
        call(q=q, out=q)
    with pytest.raises(ValueError, match="v_norm"):
        call(v_norm=d["wk"])
    with pytest.raises(ValueError, match="n_kv"):
        call(n_kv=9)
