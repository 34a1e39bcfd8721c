"""A float64 numpy forward of Gemma 4 and its assistant, written from shared/specs/gemma4.md (not from cuca), with
switches that reproduce each trap of the spec's list the wrong way: the trap tests show that every switch moves
the logits away from transformers' while the default matches it."""

from __future__ import annotations

import math

import numpy as np

from cuca.gguf import GGUFFile
from cuca.quants import dequantize64

TRAPS = (
    "norm_plus_one",  # 1: x̂·(1+w) instead of x̂·w
    "attn_scale",  # 2: 1/sqrt(hd) instead of 1.0
    "v_norm_off",  # 3: V not RMS-normalized
    "rope_all_dims",  # 5: full layers rotate every pair
    "rope_first_128",  # 5: full layers rotate the first quarter contiguously with base^(-2i/n_rot_part)
    "no_kv_sharing",  # 6: shared layers compute their own K/V (from the unused tensors)
    "ple_unscaled",  # 8: PLE without its sqrt(n_ple), 1/sqrt(n_embd) and 1/sqrt(2) scales
    "scale_branch_only",  # 9: layer_output_scale on the PLE branch only
    "no_embd_scale",  # 10: no sqrt(n_embd) on the input embedding
    "no_softcap",  # 11: no final softcap
    "window_off",  # 13: sliding layers attend to everything
)
DRAFT_TRAPS = (
    "norm_plus_one",  # 1
    "attn_scale",  # 2 (the drafter too)
    "rope_all_dims",  # 5 / 16: the drafter's full layer uses the target's proportional RoPE
    "no_embd_scale",  # 10: the target-embedding half of the drafter input is scaled by sqrt(n_embd_target)
    "input_order",  # 14: [embedding ; hidden], embedding first
    "position_increment",  # 15: constant position across chained steps
)


def W(f: GGUFFile, name: str) -> np.ndarray:
    t = f.tensors[name]
    if len(t.shape) == 1:
        return np.asarray(t.data, np.float64)
    return dequantize64(t.data, t.ggml_type, *t.shape)


def rms(x: np.ndarray, w: np.ndarray | None, trap: str = "") -> np.ndarray:
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    if w is None:
        return y
    return y * (1.0 + w if trap == "norm_plus_one" else w)


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def mlp(f: GGUFFile, p: str, m: np.ndarray) -> np.ndarray:
    return (gelu(m @ W(f, p + "ffn_gate.weight").T) * (m @ W(f, p + "ffn_up.weight").T)) @ W(f, p + "ffn_down.weight").T


def rope(x: np.ndarray, pos: np.ndarray, hd: int, theta: float, full: bool, trap: str) -> np.ndarray:
    """Rotate-half RoPE over (T, H, hd); full layers: proportional (64 of 256 pairs at E2B scale, denominator hd)."""
    if full and trap == "rope_first_128":  # the wrong reading: a contiguous rotary block of hd/4 dims
        n = hd // 4
        return np.concatenate([rope(x[..., :n], pos, n, theta, False, ""), x[..., n:]], axis=-1)
    half = hd // 2
    i = np.arange(half, dtype=np.float64)
    inv = theta ** (-2.0 * i / hd)
    if full and trap != "rope_all_dims":
        inv[int(0.25 * hd / 2) :] = 0.0
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, qpos: np.ndarray, window: int, scale: float) -> np.ndarray:
    """q (T, H, d), k/v (S, 1, d) at positions 0..S-1 -> (T, H*d); causal, window over keys when > 0."""
    kp = np.arange(k.shape[0])
    s = np.einsum("thd,sd->ths", q, k[:, 0]) * scale
    ok = kp[None, :] <= qpos[:, None]
    if window > 0:
        ok &= qpos[:, None] - kp[None, :] < window
    s = np.where(ok[:, None, :], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("ths,sd->thd", p, v[:, 0]).reshape(q.shape[0], -1)


def forward(f: GGUFFile, tokens: list[int], trap: str = "", return_kv: bool = False):  # type: ignore[no-untyped-def]
    """Logits (T, n_vocab) for the whole sequence (and, with return_kv, the K/V per layer and the post-norm h)."""
    a = f.architecture
    n_layer, e = int(f.get(f"{a}.block_count")), int(f.get(f"{a}.embedding_length"))
    swa = list(f.get(f"{a}.attention.sliding_window_pattern"))
    hd_full, hd_swa = int(f.get(f"{a}.attention.key_length")), int(f.get(f"{a}.attention.key_length_swa"))
    n_head, window = int(f.get(f"{a}.attention.head_count")), int(f.get(f"{a}.attention.sliding_window"))
    first_shared = n_layer - int(f.get(f"{a}.attention.shared_kv_layers"))
    n_ple = int(f.get(f"{a}.embedding_length_per_layer_input"))
    T, tok = len(tokens), np.array(tokens)
    pos = np.arange(T)
    E = W(f, "token_embd.weight")
    x = E[tok] * (1.0 if trap == "no_embd_scale" else math.sqrt(e))
    tp = W(f, "per_layer_token_embd.weight")[tok].reshape(T, n_layer, n_ple)
    cp = (x @ W(f, "per_layer_model_proj.weight").T).reshape(T, n_layer, n_ple)
    if trap == "ple_unscaled":
        ple = rms(cp, W(f, "per_layer_proj_norm.weight"), trap) + tp
    else:
        cp = rms(cp / math.sqrt(e), W(f, "per_layer_proj_norm.weight"), trap)
        ple = (cp + tp * math.sqrt(n_ple)) / math.sqrt(2.0)
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for il in range(n_layer):
        p, full = f"blk.{il}.", not swa[il]
        hd, theta = (hd_full, 1e6) if full else (hd_swa, 1e4)
        h = rms(x, W(f, p + "attn_norm.weight"), trap)
        q = rms((h @ W(f, p + "attn_q.weight").T).reshape(T, n_head, hd), W(f, p + "attn_q_norm.weight"), trap)
        q = rope(q, pos, hd, theta, full, trap)
        if il < first_shared or trap == "no_kv_sharing":
            k = rms((h @ W(f, p + "attn_k.weight").T).reshape(T, 1, hd), W(f, p + "attn_k_norm.weight"), trap)
            k = rope(k, pos, hd, theta, full, trap)
            v = (h @ W(f, p + "attn_v.weight").T).reshape(T, 1, hd)
            v = v if trap == "v_norm_off" else rms(v, None)
            kv[il] = (k, v)
        else:
            src = max(j for j in range(first_shared) if swa[j] == swa[il])
            k, v = kv[src]
        scale = 1.0 / math.sqrt(hd) if trap == "attn_scale" else 1.0
        o = attend(q, k, v, pos, window if swa[il] and trap != "window_off" else 0, scale)
        x = x + rms(o @ W(f, p + "attn_output.weight").T, W(f, p + "post_attention_norm.weight"), trap)
        m = rms(x, W(f, p + "ffn_norm.weight"), trap)
        m = mlp(f, p, m)
        x = x + rms(m, W(f, p + "post_ffw_norm.weight"), trap)
        g = gelu(x @ W(f, p + "inp_gate.weight").T) * ple[:, il]
        g = rms(g @ W(f, p + "proj.weight").T, W(f, p + "post_norm.weight"), trap)
        s = W(f, p + "layer_output_scale.weight")[0]
        x = x + g * s if trap == "scale_branch_only" else (x + g) * s
    hn = rms(x, W(f, "output_norm.weight"), trap)
    logits = hn @ E.T
    if trap != "no_softcap":
        cap = float(f.get(f"{a}.final_logit_softcapping"))
        logits = cap * np.tanh(logits / cap)
    return (logits, kv, hn) if return_kv else logits


def draft_steps(d: GGUFFile, target: GGUFFile, kv: dict, start: tuple[np.ndarray, int, int], n: int,
                trap: str = "") -> tuple[list[np.ndarray], list[int]]:  # type: ignore[type-arg]
    """n chained drafter steps from start = (hidden h, token, pos), at the constant position `pos`, over the target
    K/V of positions 0..pos-1."""
    h, token, pos = start
    a, ta = d.architecture, target.architecture
    n_layer, n_head = int(d.get(f"{a}.block_count")), int(d.get(f"{a}.attention.head_count"))
    swa = list(d.get(f"{a}.attention.sliding_window_pattern"))
    window = int(d.get(f"{a}.attention.sliding_window"))
    hd_full, hd_swa = int(d.get(f"{a}.attention.key_length")), int(d.get(f"{a}.attention.key_length_swa"))
    t_swa = list(target.get(f"{ta}.attention.sliding_window_pattern"))
    first_shared = len(t_swa) - int(target.get(f"{ta}.attention.shared_kv_layers"))
    e_t = int(target.get(f"{ta}.embedding_length"))
    E_t, E_d = W(target, "token_embd.weight"), W(d, "token_embd.weight")
    qpos = np.array([pos])
    out, toks = [], []
    for step in range(n):
        if trap == "position_increment":  # 15: the position must stay at `pos` for every chained step
            qpos = np.array([pos + step])
        e = E_t[token] * (1.0 if trap == "no_embd_scale" else math.sqrt(e_t))
        x = np.concatenate([h, e] if trap == "input_order" else [e, h])  # 14: embedding first
        z = x[None, :] @ W(d, "nextn.pre_projection.weight").T
        for il in range(n_layer):
            p, full = f"blk.{il}.", not swa[il]
            hd, theta = (hd_full, 1e6) if full else (hd_swa, 1e4)
            k, v = kv[max(j for j in range(first_shared) if t_swa[j] == swa[il])]
            q = rms((rms(z, W(d, p + "attn_norm.weight"), trap) @ W(d, p + "attn_q.weight").T).reshape(1, n_head, hd),
                    W(d, p + "attn_q_norm.weight"), trap)
            q = rope(q, qpos, hd, theta, full, trap)
            scale = 1.0 / math.sqrt(hd) if trap == "attn_scale" else 1.0
            o = attend(q, k[:pos], v[:pos], np.array([pos]), window if swa[il] else 0, scale)
            z = z + rms(o @ W(d, p + "attn_output.weight").T, W(d, p + "post_attention_norm.weight"), trap)
            m = rms(z, W(d, p + "ffn_norm.weight"), trap)
            m = mlp(d, p, m)
            z = (z + rms(m, W(d, p + "post_ffw_norm.weight"), trap)) * W(d, p + "layer_output_scale.weight")[0]
        zn = rms(z, W(d, "output_norm.weight"), trap)
        logits = (zn @ E_d.T)[0]
        h = (zn @ W(d, "nextn.post_projection.weight").T)[0]
        token = int(np.argmax(logits))
        out.append(logits)
        toks.append(token)
    return out, toks
