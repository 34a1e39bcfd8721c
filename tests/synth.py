"""Tiny synthetic GGUF files in the real llama / gemma3 layouts (random weights, byte-fallback vocabulary)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


def _vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    toks = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [3, 3, 3, 2] + [6] * 256
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["▁"]
    extra = letters + [a + b for a in letters for b in letters]
    toks += extra[: n_vocab - len(toks)]
    types += [1] * (len(toks) - len(types))
    scores = [0.0] * 260 + [-float(i) for i in range(len(toks) - 260)]
    assert len(toks) == n_vocab
    return toks, scores, types


def _add(w: gguf.GGUFWriter, name: str, arr: np.ndarray, qtype: int) -> None:
    if qtype == Q.F32 or arr.ndim == 1:
        w.add_tensor(name, arr.astype(np.float32))
    elif qtype == Q.F16:
        w.add_tensor(name, arr.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(arr.astype(np.float32), Q(qtype)), raw_dtype=Q(qtype))


@dataclass(frozen=True)
class Edits:
    """Changes for error tests: `skip` leaves out tensors, `drop_keys` metadata keys."""

    skip: tuple[str, ...] = ()
    drop_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tiny:
    """The shape of a tiny llama / gemma3 file; `n_layer` None is 2 (llama) or 6 (gemma3: layer 5 is the first
    global, non-sliding layer); `untied` adds a separate output head (so the next token is not mostly the last one
    again: varied, prompt-dependent text)."""

    n_vocab: int = 320
    n_embd: int = 64
    n_layer: int | None = None
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_ff: int = 96
    untied: bool = False


def write_tiny(path: Path, arch: str = "llama", qtype: int = Q.Q8_0, shape: Tiny | None = None,
               seed: int = 0, edits: Edits | None = None) -> Path:
    """Write a tiny model of `shape` (default `Tiny()`) with random weights (`seed`), changed by `edits`."""
    sh, e = shape or Tiny(), edits or Edits()
    n_vocab, n_embd, n_head, n_head_kv, head_dim, n_ff = (sh.n_vocab, sh.n_embd, sh.n_head, sh.n_head_kv,
                                                          sh.head_dim, sh.n_ff)
    n_layer = sh.n_layer if sh.n_layer is not None else (6 if arch == "gemma3" else 2)
    skip, drop_keys, untied = e.skip, e.drop_keys, sh.untied
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    kv = {
        f"{arch}.context_length": ("u32", 256),
        f"{arch}.embedding_length": ("u32", n_embd),
        f"{arch}.block_count": ("u32", n_layer),
        f"{arch}.feed_forward_length": ("u32", n_ff),
        f"{arch}.attention.head_count": ("u32", n_head),
        f"{arch}.attention.head_count_kv": ("u32", n_head_kv),
        f"{arch}.attention.key_length": ("u32", head_dim),
        f"{arch}.attention.value_length": ("u32", head_dim),
        f"{arch}.attention.layer_norm_rms_epsilon": ("f32", 1e-6),
        f"{arch}.rope.freq_base": ("f32", 10000.0),
    }
    if arch == "gemma3":
        kv[f"{arch}.attention.sliding_window"] = ("u32", 8)
    for k, (t, v) in kv.items():
        if k in drop_keys:
            continue
        (w.add_uint32 if t == "u32" else w.add_float32)(k, v)
    toks, scores, types = _vocab(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)

    def mat(n_out: int, n_in: int) -> np.ndarray:
        return rng.standard_normal((n_out, n_in)).astype(np.float32) * (1.0 / np.sqrt(n_in))

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tensors: dict[str, tuple[np.ndarray, int]] = {
        "token_embd.weight": (rng.standard_normal((n_vocab, n_embd)).astype(np.float32), qtype),
        "output_norm.weight": (norm(n_embd), Q.F32),
    }
    if untied:
        tensors["output.weight"] = (rng.standard_normal((n_vocab, n_embd)).astype(np.float32) * 3.0, qtype)
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors.update({
            p + "attn_norm.weight": (norm(n_embd), Q.F32),
            p + "attn_q.weight": (mat(n_head * head_dim, n_embd), qtype),
            p + "attn_k.weight": (mat(n_head_kv * head_dim, n_embd), qtype),
            p + "attn_v.weight": (mat(n_head_kv * head_dim, n_embd), qtype),
            p + "attn_output.weight": (mat(n_embd, n_head * head_dim), qtype),
            p + "ffn_norm.weight": (norm(n_embd), Q.F32),
            p + "ffn_gate.weight": (mat(n_ff, n_embd), qtype),
            p + "ffn_up.weight": (mat(n_ff, n_embd), qtype),
            p + "ffn_down.weight": (mat(n_embd, n_ff), qtype),
        })
        if arch == "gemma3":
            tensors.update({
                p + "attn_q_norm.weight": (norm(head_dim), Q.F32),
                p + "attn_k_norm.weight": (norm(head_dim), Q.F32),
                p + "post_attention_norm.weight": (norm(n_embd), Q.F32),
                p + "post_ffw_norm.weight": (norm(n_embd), Q.F32),
            })
    for name, (arr, t) in tensors.items():
        if name not in skip:
            _add(w, name, arr, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
