"""cuca.quants: block geometry, errors, and the numpy dequantizer against gguf's own (bit for bit), on random
valid blocks of every type and on real tensors of the PyPI models when they are installed."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import real_model_path
from quant_data import random_weight

from cuca import quants as Q
from cuca.errors import CucaError

ALL = sorted(Q.SUPPORTED_TYPES)
NAMES = {t: Q.type_name(t) for t in ALL}


def gguf_dequantize(raw: np.ndarray, wtype: int, n_out: int, n_in: int) -> np.ndarray:
    t = gguf.GGMLQuantizationType(wtype)
    if wtype in (Q.F32, Q.F16):
        return gguf.quants.dequantize(raw, t).reshape(n_out, n_in)
    return gguf.quants.dequantize(raw.reshape(n_out, -1).view(np.uint8), t).reshape(n_out, n_in)


@pytest.mark.parametrize("wtype", ALL, ids=NAMES.get)
def test_geometry_matches_gguf(wtype: int) -> None:
    bs, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(wtype)]
    assert Q.BLOCK[wtype] == (bs, nbytes)
    assert Q.block_size(wtype) == bs
    assert Q.row_bytes(wtype, 4 * bs) == 4 * nbytes


@pytest.mark.parametrize("wtype", ALL, ids=NAMES.get)
def test_dequantize_matches_gguf(wtype: int) -> None:
    n_out, n_in = 7, 512
    raw = random_weight(wtype, n_out, n_in, seed=wtype)
    got = Q.dequantize(raw, wtype, n_out, n_in)
    assert got.dtype == np.float32 and got.shape == (n_out, n_in)
    assert np.array_equal(got, gguf_dequantize(raw, wtype, n_out, n_in))
    # the float64 variant is the exact value of every weight
    np.testing.assert_allclose(Q.dequantize64(raw, wtype, n_out, n_in), got, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("wtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1], ids=NAMES.get)
def test_dequantize_roundtrips_gguf_quantize(wtype: int) -> None:
    w = np.random.default_rng(3).standard_normal((5, 256)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(wtype))
    got = Q.dequantize(raw, wtype, 5, 256)
    err = np.abs(got - w).max() / np.abs(w).max()
    assert err < (0.01 if wtype == Q.Q8_0 else 0.1)


def test_unpack_groups() -> None:
    raw = random_weight(Q.Q6_K, 3, 512)
    u = Q.unpack(raw, Q.Q6_K, 3, 512)
    assert u.q.shape == (3, 32, 16) and u.scale.shape == (3, 32) and u.bias is None
    assert u.q.min() >= -32 and u.q.max() <= 31
    u = Q.unpack(random_weight(Q.Q4_K, 3, 512), Q.Q4_K, 3, 512)
    assert u.q.shape == (3, 16, 32) and u.bias is not None and (u.bias <= 0).all()


def test_unsupported_type_is_named() -> None:
    with pytest.raises(CucaError, match="Q2_K"):
        Q.row_bytes(int(gguf.GGMLQuantizationType.Q2_K), 256)
    with pytest.raises(CucaError, match="IQ4_NL"):
        Q.dequantize(np.zeros(18, np.uint8), int(gguf.GGMLQuantizationType.IQ4_NL), 1, 32)
    with pytest.raises(CucaError, match="type 99"):
        Q.row_bytes(99, 32)


def test_bad_sizes_are_named() -> None:
    with pytest.raises(CucaError, match="Q4_K.*n_in=300"):
        Q.row_bytes(Q.Q4_K, 300)
    with pytest.raises(CucaError, match="Q8_0.*n_in=0"):
        Q.row_bytes(Q.Q8_0, 0)
    with pytest.raises(CucaError, match="bytes"):
        Q.dequantize(np.zeros(33, np.uint8), Q.Q8_0, 1, 32)
    with pytest.raises(CucaError, match="bytes"):
        Q.dequantize(np.zeros(3, np.float32), Q.F32, 1, 4)


def _model(name: str) -> Path:
    return real_model_path(name)


@pytest.mark.parametrize("model", ["gemma3", "smollm2"])
def test_real_tensors(model: str) -> None:
    """A few rows of every 2-D tensor type of a real model: ours == gguf's, and get_rows agrees."""
    from cuca.gguf import open_gguf
    from cuca.kernels import implementations

    seen: set[int] = set()
    for t in open_gguf(_model(model)):
        wtype = t.ggml_type
        if len(t.shape) != 2 or wtype in seen or wtype not in Q.SUPPORTED_TYPES:
            continue
        seen.add(wtype)
        n_out, n_in = t.shape
        rows = np.ascontiguousarray(t.data.reshape(n_out, -1)[:4])
        want = gguf_dequantize(rows, wtype, 4, n_in)
        assert np.array_equal(Q.dequantize(rows, wtype, 4, n_in), want), t.name
        for impl in implementations().values():
            out = np.zeros((2, n_in), np.float32)
            impl.get_rows(t.data, wtype, n_out, n_in, np.array([3, 0], np.int32), out)
            assert np.array_equal(out, want[[3, 0]]), (t.name, impl.__name__)
    assert len(seen) >= 2
