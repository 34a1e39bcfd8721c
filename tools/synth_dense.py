"""Real-shape synthetic Qwen 3 files for benchmarks: random quantized blocks (small finite scales) in the layouts of
Qwen3-8B (Q4_0 with a Q6_K head, as llama-quantize writes a Q4_0 file) and Qwen3-0.6B (Q8_0, tied head), with a
151,936-id byte-level BPE vocabulary shared by both (so they pass the draft-model pairing check). Tensors are
generated and written one at a time (the 8B file is ~4.7 GB; memory stays at one tensor).

    python tools/synth_dense.py [--folder ~/.cache/cuca-synth-dense]      # writes both once, prints their paths
    python tools/synth_dense.py --smoke FILE    # a tiny Q8_0 file (46 MB): the peer build's AMX smoke test
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth_qwen35  # noqa: E402

Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class DenseShape:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    tied: bool
    specials_at: int = 151643  # <|endoftext|>


QWEN3_8B = DenseShape(151936, 4096, 36, 32, 8, 128, 12288, tied=False)
QWEN3_0_6B = DenseShape(151936, 1024, 28, 16, 8, 128, 3072, tied=True)
SMOKE = DenseShape(151936, 256, 1, 4, 2, 64, 512, tied=True)  # one small layer: enough for llama.cpp to load and run


def random_blocks(rng: np.random.Generator, qtype: int, n_out: int, n_in: int) -> np.ndarray:
    """Random quantized rows (n_out, row bytes) with small finite scales (outputs stay O(1) through the layers)."""
    block, size = gguf.GGML_QUANT_SIZES[Q(qtype)]
    raw = np.frombuffer(bytearray(rng.bytes(n_out * (n_in // block) * size)), np.uint8).reshape(n_out, -1, size)
    if qtype in (Q.Q4_0, Q.Q8_0):
        raw[..., 0:2] = np.frombuffer(np.float16((0.2 if qtype == Q.Q4_0 else 0.02) / np.sqrt(n_in)).tobytes(),
                                      np.uint8)
    elif qtype == Q.Q6_K:
        raw[..., 192:208] = rng.integers(1, 32, (n_out, n_in // block, 16), dtype=np.uint8)
        raw[..., 208:210] = np.frombuffer(np.float16(0.02 / np.sqrt(n_in)).tobytes(), np.uint8)
    else:
        raise ValueError(f"no random-block writer for {Q(qtype).name}")
    return raw.reshape(n_out, -1)


def _plan(s: DenseShape, qtype: int, head_type: int) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape (n_out, n_in) or (n,), type) of every tensor, in file order."""
    e, kv, q = s.n_embd, s.n_head_kv * s.head_dim, s.n_head * s.head_dim
    out: list[tuple[str, tuple[int, ...], int]] = [("token_embd.weight", (s.n_vocab, e), qtype)]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (e,), Q.F32), (p + "attn_q.weight", (q, e), qtype),
                (p + "attn_k.weight", (kv, e), qtype), (p + "attn_v.weight", (kv, e), qtype),
                (p + "attn_q_norm.weight", (s.head_dim,), Q.F32), (p + "attn_k_norm.weight", (s.head_dim,), Q.F32),
                (p + "attn_output.weight", (e, q), qtype), (p + "ffn_norm.weight", (e,), Q.F32),
                (p + "ffn_gate.weight", (s.n_ff, e), qtype), (p + "ffn_up.weight", (s.n_ff, e), qtype),
                (p + "ffn_down.weight", (e, s.n_ff), qtype)]
    out.append(("output_norm.weight", (e,), Q.F32))
    if not s.tied:
        out.append(("output.weight", (s.n_vocab, e), head_type))
    return out


def write(path: Path, s: DenseShape, qtype: int, head_type: int, seed: int = 0) -> Path:
    """Write a qwen3 file of shape `s` (matrices `qtype`, untied head `head_type`), tensor by tensor."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen3")
    a = "qwen3."
    for k, v in (("context_length", 40960), ("embedding_length", s.n_embd), ("block_count", s.n_layer),
                 ("feed_forward_length", s.n_ff), ("attention.head_count", s.n_head),
                 ("attention.head_count_kv", s.n_head_kv), ("attention.key_length", s.head_dim),
                 ("attention.value_length", s.head_dim)):
        w.add_uint32(a + k, v)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(a + "rope.freq_base", 1e6)
    synth_qwen35.add_tokenizer(w, replace(synth_qwen35.TINY, n_vocab=s.n_vocab, specials_at=s.specials_at), "qwen2")
    plan = _plan(s, qtype, head_type)
    for name, shape, t in plan:
        if len(shape) == 1:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            n_out, n_in = shape
            row = (n_in // gguf.GGML_QUANT_SIZES[Q(t)][0]) * gguf.GGML_QUANT_SIZES[Q(t)][1]
            w.add_tensor_info(name, (n_out, row), np.dtype(np.uint8), n_out * row, raw_dtype=Q(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, shape, t in plan:
        if len(shape) == 1:
            w.write_tensor_data((1.0 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32))
        else:
            w.write_tensor_data(random_blocks(rng, t, *shape))
    w.close()
    return path


def pair_files(folder: Path) -> tuple[Path, Path]:
    """(Qwen3-8B-shaped Q4_0 target, Qwen3-0.6B-shaped Q8_0 drafter), written once per folder."""
    folder.mkdir(parents=True, exist_ok=True)
    tgt, dft = folder / "qwen3-8b-synthetic-q4_0.gguf", folder / "qwen3-0.6b-synthetic-q8_0.gguf"
    for path, s, qtype, head, seed in ((dft, QWEN3_0_6B, Q.Q8_0, Q.Q8_0, 1), (tgt, QWEN3_8B, Q.Q4_0, Q.Q6_K, 0)):
        if not path.exists():
            write(path.with_suffix(".tmp"), s, qtype, head, seed).rename(path)
    return tgt, dft


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, default=Path("~/.cache/cuca-synth-dense").expanduser())
    ap.add_argument("--smoke", type=Path, default=None, help="write only the tiny Q8_0 smoke-test file here")
    a = ap.parse_args()
    if a.smoke is not None:
        print(write(a.smoke, SMOKE, Q.Q8_0, Q.Q8_0))
    else:
        for p in pair_files(a.folder):
            print(p)
