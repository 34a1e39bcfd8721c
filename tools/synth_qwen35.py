"""Synthetic Qwen 3.5 GGUF files (`general.architecture = qwen35`) in the real layout: tensor names, shapes, dtypes,
metadata and tokenizer metadata as in unsloth's Qwen3.5-*-MTP files, random weights. `TINY` is for tests (F32, or
Q8_0 for the matrices), `REAL_0_8B` has the real 0.8B shapes (Q8_0) for benchmarks.

Importable from tests, benchmarks and the fixture script (it needs only numpy and gguf). Weights are drawn in a
fixed order from one seeded generator, so the same call writes the same file in any environment.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Shape:
    n_vocab: int
    n_embd: int
    n_layer: int  # trunk layers (the MTP block, when present, is one more)
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_rot: int
    d_state: int  # GDN head dim (keys and values)
    k_heads: int  # ssm.group_count
    v_heads: int  # ssm.time_step_rank
    conv: int = 4
    interval: int = 4
    n_ctx_train: int = 262144
    sections: tuple[int, int, int, int] = (11, 11, 10, 0)
    specials_at: int = 0  # id of <|endoftext|>; the padding rows follow the 33 special tokens


TINY = Shape(n_vocab=384, n_embd=64, n_layer=8, n_head=4, n_head_kv=2, head_dim=32, n_ff=96, n_rot=8, d_state=16,
             k_heads=4, v_heads=4, n_ctx_train=4096, sections=(2, 1, 1, 0), specials_at=320)
REAL_0_8B = Shape(n_vocab=248320, n_embd=1024, n_layer=24, n_head=8, n_head_kv=2, head_dim=256, n_ff=3584, n_rot=64,
                  d_state=128, k_heads=16, v_heads=16, specials_at=248044)

DRAFT_VOCAB_TINY = 256  # the tests' draft vocabulary (the real head ranks the first 65,536 of 248,320 ids)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
            "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
            "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
            "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>",
            "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def is_recurrent(s: Shape, il: int) -> bool:
    return (il + 1) % s.interval != 0


def _byte_chars() -> list[str]:
    """The 256 byte-level BPE symbols, in byte order (GPT-2's printable mapping)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def vocab(s: Shape) -> tuple[list[str], list[int], list[str]]:
    """tokens, token types, merges: 256 bytes, merged pairs of common symbols, then the specials and padding."""
    chars = _byte_chars()
    toks, types = list(chars), [1] * 256
    merges: list[str] = []
    seen = set(toks)
    common = [chars[ord(c)] for c in "etaoinshrdlucmfwypvbgk"] + ["Ġ"]
    budget = min(s.specials_at, 4096) - 256
    for a in common:
        for b in common:
            if len(merges) >= budget:
                break
            if a + b not in seen:
                merges.append(f"{a} {b}")
                toks.append(a + b)
                types.append(1)
                seen.add(a + b)
    while len(toks) < s.specials_at:
        toks.append(f"[UNUSED{len(toks)}]")
        types.append(4)
    for name in SPECIALS:
        if len(toks) < s.n_vocab:
            toks.append(name)
            types.append(3)
    while len(toks) < s.n_vocab:
        toks.append(f"[PAD{len(toks)}]")
        types.append(4)
    return toks, types, merges


def add_tokenizer(w: gguf.GGUFWriter, s: Shape, pre: str) -> None:
    """The vocabulary of `vocab(s)` as gpt2 BPE tokenizer metadata with pre-tokenizer `pre`, BOS <|endoftext|>, EOS
    <|im_end|>, no added BOS, and the chat template (what the converter writes for Qwen files)."""
    toks, types, merges = vocab(s)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(s.specials_at)
    w.add_eos_token_id(s.specials_at + 2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def _add(w: gguf.GGUFWriter, name: str, arr: np.ndarray, qtype: int) -> None:
    if qtype == Q.F32 or arr.ndim == 1:
        w.add_tensor(name, np.ascontiguousarray(arr, np.float32))
    else:
        w.add_tensor(name, gguf.quants.quantize(arr.astype(np.float32), Q(qtype)), raw_dtype=Q(qtype))


def weights(s: Shape, seed: int = 0, mtp: bool = True) -> dict[str, np.ndarray]:
    """Every tensor as GGUF stores it (numpy shape = reversed `ne`), norms already shifted by +1 (but `ssm_norm`),
    `ssm_a` = -exp(A_log). The matrices are float32 here; `write` quantizes them."""
    rng = np.random.default_rng(seed)

    def mat(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(1.0 / np.sqrt(n_in)))

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    q_dim, kv_dim = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    key_dim, val_dim = s.k_heads * s.d_state, s.v_heads * s.d_state
    t: dict[str, np.ndarray] = {
        "token_embd.weight": rng.standard_normal((s.n_vocab, s.n_embd), dtype=np.float32),
        "output_norm.weight": norm(s.n_embd),
    }

    def attn_block(p: str) -> None:
        t[p + "attn_q.weight"] = mat(2 * q_dim, s.n_embd)
        t[p + "attn_k.weight"] = mat(kv_dim, s.n_embd)
        t[p + "attn_v.weight"] = mat(kv_dim, s.n_embd)
        t[p + "attn_output.weight"] = mat(s.n_embd, q_dim)
        t[p + "attn_q_norm.weight"] = norm(s.head_dim)
        t[p + "attn_k_norm.weight"] = norm(s.head_dim)

    def ffn(p: str) -> None:
        t[p + "ffn_gate.weight"] = mat(s.n_ff, s.n_embd)
        t[p + "ffn_up.weight"] = mat(s.n_ff, s.n_embd)
        t[p + "ffn_down.weight"] = mat(s.n_embd, s.n_ff)

    for il in range(s.n_layer):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = norm(s.n_embd)
        t[p + "post_attention_norm.weight"] = norm(s.n_embd)
        if is_recurrent(s, il):
            t[p + "attn_qkv.weight"] = mat(2 * key_dim + val_dim, s.n_embd)
            t[p + "attn_gate.weight"] = mat(val_dim, s.n_embd)
            t[p + "ssm_conv1d.weight"] = (rng.standard_normal((2 * key_dim + val_dim, s.conv), dtype=np.float32)
                                          * np.float32(0.5))
            t[p + "ssm_dt.bias"] = (0.5 * rng.standard_normal(s.v_heads)).astype(np.float32)
            t[p + "ssm_a"] = (-rng.uniform(0.05, 1.5, s.v_heads)).astype(np.float32)
            t[p + "ssm_beta.weight"] = mat(s.v_heads, s.n_embd)
            t[p + "ssm_alpha.weight"] = mat(s.v_heads, s.n_embd)
            t[p + "ssm_norm.weight"] = norm(s.d_state)
            t[p + "ssm_out.weight"] = mat(s.n_embd, val_dim)
        else:
            attn_block(p)
        ffn(p)
    if mtp:
        p = f"blk.{s.n_layer}."
        t[p + "attn_norm.weight"] = norm(s.n_embd)
        t[p + "post_attention_norm.weight"] = norm(s.n_embd)
        attn_block(p)
        ffn(p)
        t[p + "nextn.eh_proj.weight"] = mat(s.n_embd, 2 * s.n_embd)
        t[p + "nextn.enorm.weight"] = norm(s.n_embd)
        t[p + "nextn.hnorm.weight"] = norm(s.n_embd)
        t[p + "nextn.shared_head_norm.weight"] = norm(s.n_embd)
    return t


# tensors stored as F32 even in a Q8_0 file (llama.cpp never quantizes them; small projections stay F32)
_F32_ALWAYS = ("ssm_conv1d.weight", "ssm_beta.weight", "ssm_alpha.weight")


@dataclass(frozen=True)
class Edits:
    """Changes to a written file: `skip` leaves out tensors and `drop_keys` metadata keys (for error tests);
    `tensors` replaces the seeded weights."""

    skip: tuple[str, ...] = ()
    drop_keys: tuple[str, ...] = ()
    tensors: dict[str, np.ndarray] | None = None


def write(path: str | Path, s: Shape = TINY, qtype: int = Q.F32, seed: int = 0, mtp: bool = True,
          edits: Edits | None = None) -> Path:
    """Write the model, with `edits` (none by default)."""
    e = edits or Edits()
    skip, drop_keys, tensors = e.skip, e.drop_keys, e.tensors
    path = Path(path)
    a = "qwen35"
    w = gguf.GGUFWriter(str(path), a)
    w.add_name("synthetic-qwen3.5")
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == Q.Q8_0 else gguf.LlamaFileType.ALL_F32))
    kv: dict[str, tuple[str, object]] = {
        "block_count": ("u32", s.n_layer + (1 if mtp else 0)),
        "context_length": ("u32", s.n_ctx_train),
        "embedding_length": ("u32", s.n_embd),
        "feed_forward_length": ("u32", s.n_ff),
        "attention.head_count": ("u32", s.n_head),
        "attention.head_count_kv": ("u32", s.n_head_kv),
        "rope.dimension_sections": ("arr", list(s.sections)),
        "rope.freq_base": ("f32", 1e7),
        "attention.layer_norm_rms_epsilon": ("f32", 1e-6),
        "attention.key_length": ("u32", s.head_dim),
        "attention.value_length": ("u32", s.head_dim),
        "ssm.conv_kernel": ("u32", s.conv),
        "ssm.state_size": ("u32", s.d_state),
        "ssm.group_count": ("u32", s.k_heads),
        "ssm.time_step_rank": ("u32", s.v_heads),
        "ssm.inner_size": ("u32", s.v_heads * s.d_state),
        "full_attention_interval": ("u32", s.interval),
        "rope.dimension_count": ("u32", s.n_rot),
    }
    if mtp:
        kv["nextn_predict_layers"] = ("u32", 1)
    for k, (typ, v) in kv.items():
        if k in drop_keys:
            continue
        key = f"{a}.{k}"
        if typ == "u32":
            w.add_uint32(key, int(v))  # type: ignore[call-overload]
        elif typ == "f32":
            w.add_float32(key, float(v))  # type: ignore[arg-type]
        else:
            w.add_array(key, v)  # type: ignore[arg-type]
    toks, types, merges = vocab(s)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(s.specials_at + 2)  # <|im_end|>
    w.add_pad_token_id(s.specials_at + 11)  # <|vision_pad|>
    w.add_bos_token_id(s.specials_at)  # <|endoftext|>
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    t = tensors if tensors is not None else weights(s, seed, mtp)
    for name, arr in t.items():
        if name in skip:
            continue
        qt = Q.F32 if name.endswith(_F32_ALWAYS) else qtype
        _add(w, name, arr, qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def checksum(t: dict[str, np.ndarray]) -> str:
    """A digest of the weights (names and float32 values), to check two environments built the same model."""
    h = hashlib.sha256()
    for name, a in t.items():
        h.update(name.encode())
        h.update(np.ascontiguousarray(a, np.float32).tobytes())
    return h.hexdigest()


def tiny(**kw: object) -> Shape:
    return replace(TINY, **kw)  # type: ignore[arg-type]
