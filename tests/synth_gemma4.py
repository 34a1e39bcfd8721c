"""Synthetic GGUF files in exactly the layout of Gemma 4 E2B (`gemma4`) and its drafter (`gemma4-assistant`).

Names, shapes, metadata keys and tokenizer metadata follow the files llama.cpp's converter writes (see
shared/specs/gemma4.md §2-3). `TINY` / `TINY_ASSISTANT` are small enough for tests; `E2B` / `E2B_ASSISTANT` are
the real shapes, written with random quantized blocks (no quantizer pass: fast enough for multi-GB benchmark files).
Used by tests, benchmarks and tools/make_gemma4_fixtures.py (same seed -> same bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np
from synth import Edits

Q = gguf.GGMLQuantizationType
# q/k norm weights around 0.3: with attention scale 1.0, unit-RMS q and k would give scores of std sqrt(hd), a
# near-one-hot softmax that turns activation rounding into chaos; trained models keep scores moderate too
QK_NORM = 0.3

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


@dataclass(frozen=True)
class Gemma4Shape:
    n_vocab: int = 512
    n_embd: int = 64
    n_layer: int = 10
    n_head: int = 4
    n_head_kv: int = 1
    hd_swa: int = 32  # sliding layers' head dim
    hd: int = 64  # full layers' head dim
    n_ff: int = 96  # doubled on KV-shared layers (double-wide MLP)
    n_shared: int = 5  # trailing layers that reuse K/V
    period: int = 5  # [S]*(period-1) + [F], repeated
    window: int = 16
    n_ple: int = 32  # per-layer-embedding width; 0 = none (the assistant)
    n_ctx_train: int = 512
    rope_base: float = 1e6
    rope_base_swa: float = 1e4
    partial: float = 0.25  # full layers rotate partial * hd / 2 frequency pairs
    softcap: float = 30.0

    def swa(self) -> list[bool]:
        return [i % self.period != self.period - 1 for i in range(self.n_layer)]

    def n_ff_at(self, il: int) -> int:
        return self.n_ff * 2 if il >= self.n_layer - self.n_shared else self.n_ff

    def head_dim(self, il: int) -> int:
        return self.hd_swa if self.swa()[il] else self.hd


@dataclass(frozen=True)
class AssistantShape:
    n_embd: int = 32
    n_layer: int = 4
    n_head: int = 4
    n_ff: int = 64


TINY = Gemma4Shape()
TINY_ASSISTANT = AssistantShape()
E2B = Gemma4Shape(n_vocab=262144, n_embd=1536, n_layer=35, n_head=8, hd_swa=256, hd=512, n_ff=6144, n_shared=20,
                  window=512, n_ple=256, n_ctx_train=131072)
E2B_ASSISTANT = AssistantShape(n_embd=256, n_layer=4, n_head=4, n_ff=2048)


def vocab(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    """A Gemma-4-style BPE vocabulary: specials at their real ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3, <|turn>
    105, <turn|> 106), byte fallback, ▁-prefixed pieces; merges for every two-piece token."""
    toks = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<unused{i}>" for i in range(4, 105)] + ["<|turn>", "<turn|>"]
    types = [3, 3, 3, 2] + [3] * 101 + [3, 3]
    toks += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    letters = ["▁", "\n"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [".", ",", "(", ")", ":", "="]
    pairs = [a + b for a in letters[:1] + letters[2:] for b in letters[2:] if a + b not in letters]
    toks += letters + pairs
    types += [1] * (len(letters) + len(pairs))
    i = 0
    while len(toks) < n_vocab:
        toks.append(f"▁w{i}")
        types.append(1)
        i += 1
    toks, types = toks[:n_vocab], types[:n_vocab]
    have = set(toks)
    merges = [f"{p[0]} {p[1:]}" for p in pairs if p in have]
    return toks, types, merges


def _tokenizer(w: gguf.GGUFWriter, n_vocab: int) -> None:
    toks, types, merges = vocab(n_vocab)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * len(toks))
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHAT_TEMPLATE)


def _random_blocks(rng: np.random.Generator, qtype: int, n_out: int, n_in: int) -> np.ndarray:
    """Random quantized rows (n_out, row bytes) with small, finite scales: real-shape files for speed tests."""
    block, size = gguf.GGML_QUANT_SIZES[Q(qtype)]
    raw = rng.integers(0, 256, (n_out, n_in // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.02 / np.sqrt(n_in) * 16).tobytes(), np.uint8)
    if qtype in (Q.Q4_0, Q.Q8_0):
        raw[..., 0:2] = scale
    elif qtype == Q.Q6_K:
        raw[..., 192:208] = rng.integers(1, 32, (n_out, n_in // block, 16), dtype=np.uint8)  # int8 sub-scales
        raw[..., 208:210] = np.frombuffer(np.float16(0.02 / np.sqrt(n_in)).tobytes(), np.uint8)
    else:
        raise ValueError(f"no random-block writer for {Q(qtype).name}")
    return raw.reshape(n_out, -1)


class _Tensors:
    """Collects tensors; float values are drawn from `rng` in a fixed order, so a seed fixes the file."""

    def __init__(self, w: gguf.GGUFWriter, rng: np.random.Generator, random_blocks: bool, skip: tuple[str, ...]):
        self.w, self.rng, self.random_blocks, self.skip = w, rng, random_blocks, skip

    def mat(self, name: str, n_out: int, n_in: int, qtype: int, std: float | None = None) -> None:
        if self.random_blocks and qtype not in (Q.F32, Q.F16):
            arr = _random_blocks(self.rng, qtype, n_out, n_in)
            if name not in self.skip:
                self.w.add_tensor(name, arr, raw_dtype=Q(qtype))
            return
        a = self.rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(std or 1.0 / np.sqrt(n_in))
        if name in self.skip:
            return
        if qtype == Q.F32:
            self.w.add_tensor(name, a)
        elif qtype == Q.F16:
            self.w.add_tensor(name, a.astype(np.float16))
        else:
            self.w.add_tensor(name, gguf.quants.quantize(a, Q(qtype)), raw_dtype=Q(qtype))

    def vec(self, name: str, values: np.ndarray) -> None:
        if name not in self.skip:
            self.w.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))

    def norm(self, name: str, n: int, center: float = 1.0) -> None:
        self.vec(name, center * (1.0 + 0.2 * self.rng.standard_normal(n, dtype=np.float32)))


def rope_freqs(s: Gemma4Shape) -> np.ndarray:
    """llama.cpp's proportional-RoPE divisors: 1 for the rotated pairs, 1e30 (no rotation) for the rest."""
    n_rot_pairs = int(s.partial * s.hd / 2)
    return np.array([1.0] * n_rot_pairs + [1e30] * (s.hd // 2 - n_rot_pairs), np.float32)


def _common_kv(w: gguf.GGUFWriter, arch: str, s: Gemma4Shape, n_layer: int, n_head: int, swa: list[bool]) -> None:
    a = arch
    w.add_uint32(f"{a}.context_length", s.n_ctx_train)
    w.add_uint32(f"{a}.block_count", n_layer)
    w.add_uint32(f"{a}.attention.head_count", n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", s.hd)
    w.add_uint32(f"{a}.attention.value_length", s.hd)
    w.add_uint32(f"{a}.attention.key_length_swa", s.hd_swa)
    w.add_uint32(f"{a}.attention.value_length_swa", s.hd_swa)
    w.add_uint32(f"{a}.rope.dimension_count", s.hd)
    w.add_uint32(f"{a}.rope.dimension_count_swa", s.hd_swa)
    w.add_float32(f"{a}.rope.freq_base", s.rope_base)
    w.add_float32(f"{a}.rope.freq_base_swa", s.rope_base_swa)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.attention.sliding_window", s.window)
    w.add_array(f"{a}.attention.sliding_window_pattern", swa)


def _finish(w: gguf.GGUFWriter, drop_keys: tuple[str, ...]) -> None:
    for k in drop_keys:
        w.kv_data[0].pop(k, None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@dataclass(frozen=True)
class TargetOpts:
    """How a `gemma4` target is written: `embd_qtype` (default: the layers' qtype) for token_embd and
    per_layer_token_embd; `random_blocks` draws quantized blocks directly (no quantizer pass: fast at real shapes);
    `shared_kv_tensors` adds the unused K/V tensors some converters leave on KV-shared layers (the model must
    ignore them); `edits` for error tests."""

    embd_qtype: int | None = None
    random_blocks: bool = False
    shared_kv_tensors: bool = False
    edits: Edits = Edits()


@dataclass(frozen=True)
class AssistantOpts:
    """How a `gemma4-assistant` drafter is written: `n_embd_out` / `n_vocab` override the pairing with the target
    (for mismatch tests); `random_blocks` and `edits` as for the target."""

    random_blocks: bool = False
    n_embd_out: int | None = None
    n_vocab: int | None = None
    edits: Edits = Edits()


def write_gemma4(path: Path, s: Gemma4Shape = TINY, qtype: int = Q.F32, seed: int = 0,
                 opts: TargetOpts | None = None) -> Path:
    """A `gemma4` target; `qtype` for the layer matrices (per_layer_model_proj stays F32/F16 as llama-quantize
    keeps it)."""
    o = opts or TargetOpts()
    embd_qtype, random_blocks, shared_kv_tensors = o.embd_qtype, o.random_blocks, o.shared_kv_tensors
    skip, drop_keys = o.edits.skip, o.edits.drop_keys
    rng = np.random.default_rng(seed)
    embd_qtype = qtype if embd_qtype is None else embd_qtype
    w = gguf.GGUFWriter(str(path), "gemma4")
    a, swa, first_shared = "gemma4", s.swa(), s.n_layer - s.n_shared
    _common_kv(w, a, s, s.n_layer, s.n_head, swa)
    w.add_uint32(f"{a}.embedding_length", s.n_embd)
    w.add_array(f"{a}.feed_forward_length", [s.n_ff_at(i) for i in range(s.n_layer)])
    w.add_uint32(f"{a}.attention.shared_kv_layers", s.n_shared)
    w.add_uint32(f"{a}.embedding_length_per_layer_input", s.n_ple)
    w.add_float32(f"{a}.final_logit_softcapping", s.softcap)
    _tokenizer(w, s.n_vocab)
    t = _Tensors(w, rng, random_blocks, skip)
    unused = _Tensors(w, np.random.default_rng(seed + 1000), random_blocks, skip)  # keeps t's draws unchanged
    proj_type = Q.F16 if qtype not in (Q.F32,) else Q.F32
    t.mat("token_embd.weight", s.n_vocab, s.n_embd, embd_qtype, std=0.5)
    t.mat("per_layer_token_embd.weight", s.n_vocab, s.n_layer * s.n_ple, embd_qtype, std=0.5)
    t.mat("per_layer_model_proj.weight", s.n_layer * s.n_ple, s.n_embd, proj_type)
    t.norm("per_layer_proj_norm.weight", s.n_ple)
    t.norm("output_norm.weight", s.n_embd)
    t.vec("rope_freqs.weight", rope_freqs(s))
    for il in range(s.n_layer):
        p, hd, ff = f"blk.{il}.", s.head_dim(il), s.n_ff_at(il)
        t.norm(p + "attn_norm.weight", s.n_embd)
        t.mat(p + "attn_q.weight", s.n_head * hd, s.n_embd, qtype)
        kv = t if il < first_shared else unused
        if il < first_shared or shared_kv_tensors:
            kv.mat(p + "attn_k.weight", s.n_head_kv * hd, s.n_embd, qtype)
            kv.mat(p + "attn_v.weight", s.n_head_kv * hd, s.n_embd, qtype)
        t.mat(p + "attn_output.weight", s.n_embd, s.n_head * hd, qtype)
        t.norm(p + "attn_q_norm.weight", hd, QK_NORM)
        if il < first_shared or shared_kv_tensors:
            kv.norm(p + "attn_k_norm.weight", hd, QK_NORM)
        t.norm(p + "post_attention_norm.weight", s.n_embd)
        t.norm(p + "ffn_norm.weight", s.n_embd)
        t.mat(p + "ffn_gate.weight", ff, s.n_embd, qtype)
        t.mat(p + "ffn_up.weight", ff, s.n_embd, qtype)
        t.mat(p + "ffn_down.weight", s.n_embd, ff, qtype)
        t.norm(p + "post_ffw_norm.weight", s.n_embd)
        if s.n_ple:
            t.mat(p + "inp_gate.weight", s.n_ple, s.n_embd, qtype)
            t.mat(p + "proj.weight", s.n_embd, s.n_ple, qtype)
            t.norm(p + "post_norm.weight", s.n_embd)
        t.vec(p + "layer_output_scale.weight", rng.uniform(0.5, 1.0, 1).astype(np.float32))
    _finish(w, drop_keys)
    return path


def write_gemma4_assistant(path: Path, target: Gemma4Shape = TINY, s: AssistantShape = TINY_ASSISTANT,
                           qtype: int = Q.F32, seed: int = 1, opts: AssistantOpts | None = None) -> Path:
    """A `gemma4-assistant` drafter for `target`. Its layers are [S]*(n_layer-1) + [F] and read the target's
    K/V."""
    o = opts or AssistantOpts()
    random_blocks, n_embd_out, n_vocab = o.random_blocks, o.n_embd_out, o.n_vocab
    skip, drop_keys = o.edits.skip, o.edits.drop_keys
    rng = np.random.default_rng(seed)
    n_embd_out = target.n_embd if n_embd_out is None else n_embd_out
    n_vocab = target.n_vocab if n_vocab is None else n_vocab
    a = "gemma4-assistant"
    w = gguf.GGUFWriter(str(path), a)
    swa = [True] * (s.n_layer - 1) + [False]
    _common_kv(w, a, target, s.n_layer, s.n_head, swa)
    w.add_uint32(f"{a}.embedding_length", s.n_embd)
    w.add_uint32(f"{a}.embedding_length_out", n_embd_out)
    w.add_uint32(f"{a}.feed_forward_length", s.n_ff)
    w.add_uint32(f"{a}.attention.shared_kv_layers", s.n_layer)
    w.add_uint32(f"{a}.embedding_length_per_layer_input", 0)
    w.add_uint32(f"{a}.nextn_predict_layers", s.n_layer)
    _tokenizer(w, n_vocab)
    t = _Tensors(w, rng, random_blocks, skip)
    t.mat("token_embd.weight", n_vocab, s.n_embd, qtype, std=0.5)
    t.norm("output_norm.weight", s.n_embd)
    t.vec("rope_freqs.weight", rope_freqs(target))
    t.mat("nextn.pre_projection.weight", s.n_embd, 2 * n_embd_out, qtype)
    t.mat("nextn.post_projection.weight", n_embd_out, s.n_embd, qtype)
    for il in range(s.n_layer):
        p, hd = f"blk.{il}.", target.hd_swa if swa[il] else target.hd
        t.norm(p + "attn_norm.weight", s.n_embd)
        t.mat(p + "attn_q.weight", s.n_head * hd, s.n_embd, qtype)
        t.norm(p + "attn_q_norm.weight", hd, QK_NORM)
        t.mat(p + "attn_output.weight", s.n_embd, s.n_head * hd, qtype)
        t.norm(p + "post_attention_norm.weight", s.n_embd)
        t.norm(p + "ffn_norm.weight", s.n_embd)
        t.mat(p + "ffn_gate.weight", s.n_ff, s.n_embd, qtype)
        t.mat(p + "ffn_up.weight", s.n_ff, s.n_embd, qtype)
        t.mat(p + "ffn_down.weight", s.n_embd, s.n_ff, qtype)
        t.norm(p + "post_ffw_norm.weight", s.n_embd)
        t.vec(p + "layer_output_scale.weight", rng.uniform(0.5, 1.0, 1).astype(np.float32))
    _finish(w, drop_keys)
    return path


def append_centroids(src: Path, dst: Path, centroids: np.ndarray, ordering: np.ndarray) -> Path:
    """Copy `src` with masked_embd_centroids.weight (in the type of token_embd.weight) and masked_embd_ordering
    (I32) added, through gguf-py's reader and writer."""
    r = gguf.GGUFReader(str(src))
    arch = str(r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(dst), arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    embd_type = None
    for t in r.tensors:
        if t.name == "token_embd.weight":
            embd_type = t.tensor_type
        shape = [int(d) for d in reversed(t.shape)]
        data = np.array(t.data)
        w.add_tensor(t.name, data, raw_shape=data.shape if data.dtype == np.uint8 else shape, raw_dtype=t.tensor_type)
    assert embd_type is not None
    qt = gguf.GGMLQuantizationType(embd_type)
    c = gguf.quants.quantize(centroids.astype(np.float32), qt)
    w.add_tensor("masked_embd_centroids.weight", c, raw_shape=c.shape, raw_dtype=qt)
    w.add_tensor("masked_embd_ordering", ordering.astype(np.int32), raw_dtype=gguf.GGMLQuantizationType.I32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def e2b_files(folder: Path, seed: int = 0) -> tuple[Path, Path]:
    """The real-shape pair for benchmarks: target Q4_0 with Q6_K embeddings (as llama-quantize writes a Q4_0 file),
    drafter F16. Written once per folder (several GB)."""
    folder.mkdir(parents=True, exist_ok=True)
    tgt, dft = folder / "gemma4-e2b-synthetic-q4_0.gguf", folder / "gemma4-e2b-assistant-synthetic-f16.gguf"
    if not tgt.exists():
        write_gemma4(tgt.with_suffix(".tmp"), E2B, Q.Q4_0, seed, TargetOpts(Q.Q6_K, random_blocks=True))
        tgt.with_suffix(".tmp").rename(tgt)
    if not dft.exists():
        write_gemma4_assistant(dft.with_suffix(".tmp"), E2B, E2B_ASSISTANT, Q.F16, seed + 1,
                               AssistantOpts(random_blocks=True))
        dft.with_suffix(".tmp").rename(dft)
    return tgt, dft


__all__ = ["E2B", "E2B_ASSISTANT", "TINY", "TINY_ASSISTANT", "AssistantShape", "Gemma4Shape", "append_centroids",
           "e2b_files", "replace", "rope_freqs", "vocab", "write_gemma4", "write_gemma4_assistant"]
