"""Draft-model pair fixtures written by llama.cpp's own converter: tests/fixtures/converted/{qwen3,qwen2,llama3}-*.gguf
and dense_hf.npz.

Run in a venv with torch and transformers 5.x (Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM):
    /work/venvs/ref/bin/python tools/make_dense_fixtures.py [--work /tmp/cuca-converted]

The converter comes from the llama-cpp-python sdist pinned in tools/make_converted_fixtures.py (fetched into --work,
nothing of it committed). For each family a tiny random target and a tinier random drafter with the same vocabulary
(the pairs a draft model is tested on):
    qwen3    Qwen3ForCausalLM: per-head q/k norms, no biases, tied head (as the 0.6B), NeoX RoPE;
    qwen2    Qwen2ForCausalLM: q/k/v biases, tied head (as the 0.5B);
    llama3   LlamaForCausalLM with rope_scaling llama3 (the converter writes rope_freqs.weight), untied head.
Targets are converted to F32 and Q8_0, drafters to F32. transformers' logits (prompt + greedy decode, every row) go
to dense_hf.npz. As in make_converted_fixtures.py the vocabulary metadata is not the converter's: these checkpoints
have no tokenizer, so `set_vocab` writes the synthetic byte-level BPE vocabulary of tools/synth_qwen35.py with the
family's pre-tokenizer (`qwen2` for both Qwen families, `llama-bpe` for Llama 3) and its BOS/EOS conventions.
llama.cpp's logits and tokenizations on the same files: tools/make_dense_llamacpp_fixture.py.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import make_converted_fixtures as mc  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "converted"
N_PROMPT, N_DECODE, SEED = 24, 12, 0
VOCAB, SPECIALS_AT = 384, 320  # synthetic BPE: bytes, merges, [UNUSED..], specials from id 320
TARGET = dict(hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, ff=96)
DRAFTER = dict(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, ff=64)
# family -> (HF class, pre-tokenizer, add_bos, bos id, eos id, tied head)
FAMILIES = {
    "qwen3": ("Qwen3ForCausalLM", "qwen2", False, SPECIALS_AT, SPECIALS_AT + 2, True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False, SPECIALS_AT, SPECIALS_AT + 2, True),
    "llama3": ("LlamaForCausalLM", "llama-bpe", True, SPECIALS_AT + 1, SPECIALS_AT + 2, False),
}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # short: every band is exercised


def hf_config(family: str, s: dict):  # type: ignore[no-untyped-def,type-arg]
    import transformers

    cls, _, _, bos, eos, tied = FAMILIES[family]
    common = dict(vocab_size=VOCAB, hidden_size=s["hidden"], intermediate_size=s["ff"],
                  num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
                  head_dim=s["head_dim"], rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=tied,
                  bos_token_id=bos, eos_token_id=eos)
    if family == "llama3":
        cfg = transformers.LlamaConfig(**common, rope_parameters=LLAMA3_ROPE, attention_bias=False, mlp_bias=False)
    elif family == "qwen3":
        cfg = transformers.Qwen3Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                       attention_bias=False, use_sliding_window=False)
    else:
        cfg = transformers.Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                       use_sliding_window=False)
    cfg.architectures = [cls]
    return cfg


def build(family: str, s: dict, seed: int):  # type: ignore[no-untyped-def,type-arg]
    import torch
    import transformers

    m = getattr(transformers, FAMILIES[family][0])(hf_config(family, s))
    mc.randomize(m, seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(".bias"):  # Qwen 2's q/k/v biases (zero at init): make them matter
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    m.config._attn_implementation = "eager"
    return m.eval().float()


def _convert_main(argv: list[str]) -> None:
    """Child-process entry: the vendored converter with `set_vocab` replaced (see the module docstring)."""
    tree, family = Path(argv[0]), argv[1]
    sys.path[:0] = [str(tree / "gguf-py"), str(tree)]
    import convert_hf_to_gguf as conv
    import synth_qwen35
    from conversion.llama import LlamaModel
    from conversion.qwen import Qwen2Model, Qwen3Model

    _, pre, add_bos, bos, eos, _ = FAMILIES[family]

    def set_vocab(self) -> None:  # type: ignore[no-untyped-def]
        s = synth_qwen35.replace(synth_qwen35.TINY, n_vocab=self.hparams["vocab_size"], specials_at=SPECIALS_AT)
        toks, types, merges = synth_qwen35.vocab(s)
        w = self.gguf_writer
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(toks)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(bos)
        w.add_eos_token_id(eos)
        w.add_add_bos_token(add_bos)
        w.add_chat_template(synth_qwen35.CHAT_TEMPLATE)

    for cls in (LlamaModel, Qwen2Model, Qwen3Model):
        cls.set_vocab = set_vocab  # type: ignore[method-assign]
    sys.argv = ["convert_hf_to_gguf.py", argv[2], *argv[3:]]
    conv.main()


def convert(tree: Path, family: str, hf_dir: Path, out: Path, outtype: str) -> Path:
    cmd = [sys.executable, __file__, "_convert", str(tree), family, str(hf_dir), "--outtype", outtype, "--outfile",
           str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def prompt_ids(family: str, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    ids = [int(t) for t in rng.integers(0, 300, N_PROMPT)]
    return [FAMILIES[family][3], *ids[1:]] if FAMILIES[family][2] else ids


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_convert":
        _convert_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/cuca-converted"))
    args = ap.parse_args()
    import torch

    torch.manual_seed(SEED)
    tree = mc.llama_cpp_dir(args.work)
    rec: dict[str, np.ndarray] = {}
    for i, family in enumerate(FAMILIES):
        for role, shape in (("target", TARGET), ("drafter", DRAFTER)):
            m = build(family, shape, SEED + 10 * i + (role == "drafter"))
            hf_dir = args.work / "hf" / f"{family}-{role}"
            mc.save_checkpoint(m, hf_dir)
            ids, logits = mc_greedy(m, prompt_ids(family, 7 + i))
            rec[f"{family}_{role}_tokens"], rec[f"{family}_{role}_logits"] = np.array(ids, np.int32), logits
            for dt in ("f32", "q8_0") if role == "target" else ("f32",):
                name = family if role == "target" else f"{family}-draft"
                convert(tree, family, hf_dir, OUT / f"{name}-{dt}.gguf", dt)
    rec["llama3_inv_freq_factors"] = llama3_factors()
    np.savez_compressed(OUT / "dense_hf.npz", **rec)
    print("wrote", sorted(p.name for p in OUT.glob("*.gguf") if p.name.split("-")[0] in FAMILIES))


def mc_greedy(model, ids: list[int]) -> tuple[list[int], np.ndarray]:  # type: ignore[no-untyped-def]
    """Greedy decode N_DECODE tokens, then every row's logits of the whole text (as make_converted_fixtures)."""
    import torch

    ids = list(ids)
    with torch.no_grad():
        for _ in range(N_DECODE):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        logits = model(torch.tensor([ids])).logits[0].numpy()
    return ids, logits.astype(np.float32)


def llama3_factors() -> np.ndarray:
    """transformers' llama3 inverse frequencies over the unscaled ones: the divisors rope_freqs.weight must hold."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = hf_config("llama3", TARGET)
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    d = TARGET["head_dim"]
    base = 1.0 / (LLAMA3_ROPE["rope_theta"] ** (np.arange(0, d, 2) / d))
    return (base / inv.numpy().astype(np.float64)).astype(np.float32)


if __name__ == "__main__":
    main()
