"""An independent float64 numpy forward pass of the llama and gemma3 architectures, written from their
definitions (no cuca kernels, no activation quantization): the oracle for model math, used by tests and by
tools/make_generation_fixtures.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cuca.gguf import open_gguf
from cuca.quants import dequantize


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
    n_embd, n_head, n_kv = g("embedding_length"), g("attention.head_count"), g("attention.head_count_kv")
    hd = f.get(f"{arch}.attention.key_length", n_embd // n_head)
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
        base = f.get(f"{arch}.rope.freq_base", 10000.0)
        if arch == "gemma3":
            q = _rms(q, _w(f, p + "attn_q_norm.weight"), eps)
            k = _rms(k, _w(f, p + "attn_k_norm.weight"), eps)
            window = g("attention.sliding_window")
            if i % 6 < 5:  # sliding layer
                lmask = mask & (np.arange(t)[:, None] - np.arange(t)[None, :] < window)
                base = 10000.0
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
