"""Architectures on tiny synthetic files in the real layouts: math against an independent float64 numpy
reference, batched prefill == token-by-token decode bit for bit, cache rollback, and load errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth import Q, write_tiny

from cuca.errors import GGUFError, ProviderError
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.layers import Ops
from cuca.quants import dequantize

ARCHS = ["llama", "gemma3"]


def _w(f, name: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    t = f.tensor(name)
    if len(t.shape) == 1:
        return np.asarray(t.data, np.float64)
    return dequantize(np.asarray(t.data), t.ggml_type, *t.shape).astype(np.float64)


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, pos: np.ndarray, base: float, neox: bool) -> np.ndarray:
    """x (T, H, D): rotate all D dims; pairs (2i, 2i+1) or (i, i + D/2)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = pos[:, None, None] * inv[None, None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def reference_forward(path: Path, tokens: list[int]) -> np.ndarray:
    """All-position logits of the tiny model in float64, written from the architecture's definition."""
    f = open_gguf(path)
    arch = f.architecture
    g = lambda k: f.require(f"{arch}.{k}")  # noqa: E731
    n_embd, n_head, n_kv, hd = g("embedding_length"), g("attention.head_count"), g("attention.head_count_kv"), \
        g("attention.key_length")
    eps = g("attention.layer_norm_rms_epsilon")
    t = len(tokens)
    pos = np.arange(t, dtype=np.float64)
    x = _w(f, "token_embd.weight")[tokens]
    if arch == "gemma3":
        x = x * np.sqrt(n_embd)
    mask = np.tril(np.ones((t, t), bool))
    for i in range(g("block_count")):
        p = f"blk.{i}."
        h = _rms(x, _w(f, p + "attn_norm.weight"), eps)
        q = (h @ _w(f, p + "attn_q.weight").T).reshape(t, n_head, hd)
        k = (h @ _w(f, p + "attn_k.weight").T).reshape(t, n_kv, hd)
        v = (h @ _w(f, p + "attn_v.weight").T).reshape(t, n_kv, hd)
        lmask = mask
        base = 10000.0
        if arch == "gemma3":
            q = _rms(q, _w(f, p + "attn_q_norm.weight"), eps)
            k = _rms(k, _w(f, p + "attn_k_norm.weight"), eps)
            window = g("attention.sliding_window")
            if i % 6 < 5:  # sliding layer
                lmask = mask & (np.arange(t)[:, None] - np.arange(t)[None, :] < window)
            else:
                base = 1e6 if f.get("gemma3.rope.freq_base") is None else g("rope.freq_base")
        q, k = _rope(q, pos, base, arch == "gemma3"), _rope(k, pos, base, arch == "gemma3")
        rep = n_head // n_kv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        s = np.where(lmask[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(t, n_head * hd) @ _w(f, p + "attn_output.weight").T
        if arch == "gemma3":
            o = _rms(o, _w(f, p + "post_attention_norm.weight"), eps)
        x = x + o
        h = _rms(x, _w(f, p + "ffn_norm.weight"), eps)
        gate, up = h @ _w(f, p + "ffn_gate.weight").T, h @ _w(f, p + "ffn_up.weight").T
        if arch == "gemma3":
            act = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate**3)))
        else:
            act = gate / (1 + np.exp(-gate))
        d = (act * up) @ _w(f, p + "ffn_down.weight").T
        if arch == "gemma3":
            d = _rms(d, _w(f, p + "post_ffw_norm.weight"), eps)
        x = x + d
    x = _rms(x, _w(f, "output_norm.weight"), eps)
    return x @ _w(f, "token_embd.weight").T


def _load(path: Path, threads: int = 2):  # type: ignore[no-untyped-def]
    return load_model(open_gguf(path), Ops(threads))


PROMPT = [2, 100, 7, 42, 300, 5, 17, 260, 99, 1, 150, 151, 152, 33, 34]


@pytest.mark.parametrize("arch", ARCHS)
def test_f32_math_matches_reference(tmp_path: Path, arch: str) -> None:
    path = write_tiny(tmp_path / f"{arch}.gguf", arch=arch, qtype=Q.F32)
    m = _load(path)
    cache = m.make_cache(64)
    got = m.forward(np.array(PROMPT, np.int32), np.arange(len(PROMPT), dtype=np.int32), cache, "all")
    want = reference_forward(path, PROMPT)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.F16])
def test_quantized_close_to_reference(tmp_path: Path, arch: str, qtype: int) -> None:
    """Quantized activations add a little error; the reference uses the same dequantized weights."""
    path = write_tiny(tmp_path / f"{arch}.gguf", arch=arch, qtype=qtype)
    m = _load(path)
    got = m.forward(np.array(PROMPT, np.int32), np.arange(len(PROMPT), dtype=np.int32), m.make_cache(64), "all")
    want = reference_forward(path, PROMPT)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 0.03, err
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.8


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1])
def test_prefill_equals_decode_bit_for_bit(tmp_path: Path, arch: str, qtype: int) -> None:
    """The model-level consequence of batch-invariant kernels: a position's logits do not depend on how the
    tokens before it were batched."""
    path = write_tiny(tmp_path / f"{arch}.gguf", arch=arch, qtype=qtype)
    m = _load(path)
    toks = np.array(PROMPT, np.int32)
    pos = np.arange(len(PROMPT), dtype=np.int32)
    batched = m.forward(toks, pos, m.make_cache(64), "all")
    cache = m.make_cache(64)
    one_by_one = np.concatenate([m.forward(toks[i : i + 1], pos[i : i + 1], cache, "all") for i in range(len(toks))])
    assert np.array_equal(batched, one_by_one)
    # mixed chunks, and another thread count
    m1 = _load(path, threads=1)
    cache = m1.make_cache(64)
    parts = [m1.forward(toks[a:b], pos[a:b], cache, "all") for a, b in ((0, 4), (4, 5), (5, 12), (12, 15))]
    assert np.array_equal(batched, np.concatenate(parts))


@pytest.mark.parametrize("arch", ARCHS)
def test_trim_rolls_back_exactly(tmp_path: Path, arch: str) -> None:
    path = write_tiny(tmp_path / f"{arch}.gguf", arch=arch)
    m = _load(path)
    toks = np.array(PROMPT, np.int32)
    pos = np.arange(len(PROMPT), dtype=np.int32)
    cache = m.make_cache(64)
    m.forward(toks[:10], pos[:10], cache)
    m.forward(np.array([3, 4, 5], np.int32), pos[10:13], cache, "all")  # rejected drafts
    cache.trim(3)
    assert cache.n == 10
    after = m.forward(toks[10:], pos[10:], cache, "all")
    clean = m.forward(toks, pos, m.make_cache(64), "all")[10:]
    assert np.array_equal(after, clean)


def test_missing_tensor_and_key_are_named(tmp_path: Path) -> None:
    p = write_tiny(tmp_path / "a.gguf", skip=("blk.1.ffn_up.weight",))
    with pytest.raises(ProviderError, match=r"blk\.1\.ffn_up\.weight"):
        _load(p)
    p = write_tiny(tmp_path / "b.gguf", arch="gemma3", drop_keys=("gemma3.attention.key_length",))
    with pytest.raises(GGUFError, match="gemma3.attention.key_length"):
        _load(p)


def test_unsupported_architecture(tmp_path: Path) -> None:
    import gguf

    p = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(p), "mamba")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ProviderError, match="mamba"):
        _load(p)
