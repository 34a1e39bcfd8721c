"""Fixtures written by llama.cpp's own converter: tests/fixtures/converted/*.gguf and converted_hf.npz.

Run in a venv with torch and transformers 5.x (Gemma4ForCausalLM, Gemma4AssistantForCausalLM, Qwen3_5ForCausalLM):
    /work/venvs/ref/bin/python tools/make_converted_fixtures.py [--work /tmp/cuca-converted]

1. Fetches the llama-cpp-python sdist (pinned below, `pip download --no-binary :all: --no-deps`) into --work and
   uses its vendored llama.cpp `convert_hf_to_gguf.py` and `gguf-py` (nothing of it is committed).
2. Builds tiny random HF checkpoints with the published configs' structure, sizes shrunk:
   gemma4      Gemma4ForCausalLM in the E2B layout (PLE, KV sharing, sliding + full layers with their own head
               dims, double-wide MLP on shared layers, proportional RoPE, final softcap);
   assistant   Gemma4AssistantForCausalLM with use_ordered_embeddings=True (centroids + token ordering);
   qwen35      Qwen3_5ForCausalLM with one MTP layer (mtp.* tensors, mtp_num_hidden_layers=1);
   qwen35g     the same with fewer DeltaNet key heads than value heads (the layout of the sizes above 0.8B).
3. Converts each with the converter to F32, F16, BF16 and Q8_0 (qwen35 also with --no-mtp and --mtp; qwen35g F32).
   The converter of this pin drops the assistant's masked_embedding tensors (its Gemma4AssistantModel filters
   them out), so the centroid variant `assistant-centroids-<dtype>.gguf` is the converter's file with the two
   tensors appended by gguf-py as the published E2B files carry them: masked_embd_centroids.weight in the file's
   type and masked_embd_ordering as I32.
4. Records transformers' outputs in converted_hf.npz: target logits (prompt + greedy decode), the assistant's
   three chained draft steps with HF's masked head and with its dense head, and Qwen 3.5 logits.

Not the converter's: the vocabulary metadata. These random checkpoints have no tokenizer, so each model class's
`set_vocab` is replaced by one that writes the synthetic vocabulary of tests/synth_gemma4.py / tools/synth_qwen35.py
(tokens, types, merges, special ids); every tensor and every other key is written by the converter.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "converted"
LLAMA_CPP_PYTHON = "0.3.36"  # newest sdist with Gemma 4, its assistant and Qwen 3.5 MTP in the converter
DTYPES = ("f32", "f16", "bf16", "q8_0")
N_PROMPT, N_DECODE, DRAFT_AT, N_DRAFT = 24, 12, 30, 3
SEED = 0

GEMMA4 = dict(vocab=512, hidden=64, layers=6, heads=4, kv_heads=1, hd_swa=32, hd=64, ff=64, shared=3, window=16,
              ple=16, softcap=30.0)  # layers [S, S, F] * 2, the last 3 KV-shared
ASSISTANT = dict(hidden=32, layers=4, heads=4, ff=64, centroids=64, top_k=32)  # 8 ids per centroid, top 32
QWEN35 = dict(vocab=384, hidden=64, layers=4, heads=4, kv_heads=2, head_dim=32, ff=64, n_rot=8, d_state=16,
              k_heads=4, v_heads=4, specials_at=320)
QWEN35_GROUPED = {**QWEN35, "k_heads": 2, "v_heads": 4}


def llama_cpp_dir(work: Path) -> Path:
    """The vendored llama.cpp of the pinned sdist, downloaded and unpacked once into `work`."""
    tree = work / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if tree.exists():
        return tree
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(work)], check=True)
    with tarfile.open(work / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz") as t:
        t.extractall(work, filter="data")
    return tree


# ---------------------------------------------------------------------------------------------- checkpoints
def randomize(model, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Weights with trained-like scales: matrices N(0, 1/fan_in), norms near their identity, q/k norms ~0.3 (Gemma's
    attention scale is 1.0), layer scalars in [0.5, 1]."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif "layer_scalar" in name:
                p.copy_(0.5 + 0.5 * torch.rand(p.shape, generator=g))
            elif "norm" in name and p.ndim == 1:
                noise = 0.2 * (torch.rand(p.shape, generator=g) - 0.5)
                base = p.detach().clone()
                if ("q_norm" in name or "k_norm" in name) and "qwen" not in type(model).__name__.lower():
                    base = torch.full_like(base, 0.3)
                p.copy_(base + noise * (base.abs().clamp(min=0.1)))


def gemma4_config():  # type: ignore[no-untyped-def]
    from transformers import Gemma4TextConfig

    s = GEMMA4
    types = (["sliding_attention"] * 2 + ["full_attention"]) * (s["layers"] // 3)
    cfg = Gemma4TextConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ff"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["hd_swa"],
        global_head_dim=s["hd"], layer_types=types, sliding_window=s["window"], rms_norm_eps=1e-6,
        max_position_embeddings=512, hidden_activation="gelu_pytorch_tanh", attention_k_eq_v=False,
        final_logit_softcapping=s["softcap"], hidden_size_per_layer_input=s["ple"],
        vocab_size_per_layer_input=s["vocab"], num_kv_shared_layers=s["shared"], use_double_wide_mlp=True,
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )
    cfg.architectures = ["Gemma4ForCausalLM"]
    return cfg


def assistant_config():  # type: ignore[no-untyped-def]
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    s, a = GEMMA4, ASSISTANT
    text = Gemma4TextConfig(
        vocab_size=s["vocab"], hidden_size=a["hidden"], intermediate_size=a["ff"], num_hidden_layers=a["layers"],
        num_attention_heads=a["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["hd_swa"],
        global_head_dim=s["hd"], layer_types=["sliding_attention"] * (a["layers"] - 1) + ["full_attention"],
        sliding_window=s["window"], rms_norm_eps=1e-6, max_position_embeddings=512,
        hidden_activation="gelu_pytorch_tanh", attention_k_eq_v=False, final_logit_softcapping=None,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, num_kv_shared_layers=a["layers"],
        use_double_wide_mlp=False, tie_word_embeddings=True,
    )
    cfg = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=s["hidden"], use_ordered_embeddings=True,
                                num_centroids=a["centroids"], centroid_intermediate_top_k=a["top_k"])
    cfg.architectures = ["Gemma4AssistantForCausalLM"]
    return cfg


def qwen35_config(s: dict):  # type: ignore[no-untyped-def,type-arg]
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ff"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
        linear_conv_kernel_dim=4, linear_key_head_dim=s["d_state"], linear_value_head_dim=s["d_state"],
        linear_num_key_heads=s["k_heads"], linear_num_value_heads=s["v_heads"], rms_norm_eps=1e-6,
        tie_word_embeddings=True, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": s["n_rot"] / s["head_dim"],
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(s["layers"])],
        bos_token_id=s["specials_at"], eos_token_id=s["specials_at"] + 2,
    )
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    return cfg


def qwen35_mtp_tensors(s: dict, seed: int) -> dict:  # type: ignore[type-arg]
    """One MTP layer in the checkpoint's names (transformers ignores them; the converter maps them to nextn)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    e, hd, nh, nkv, ff = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"], s["ff"]

    def mat(o: int, i: int) -> torch.Tensor:
        return torch.randn(o, i, generator=g) / math.sqrt(i)

    def norm(n: int) -> torch.Tensor:
        return 0.1 * (torch.rand(n, generator=g) - 0.5)  # stored as w with the model computing (1 + w)

    p = "mtp.layers.0."
    return {
        "mtp.fc.weight": mat(e, 2 * e), "mtp.pre_fc_norm_embedding.weight": norm(e),
        "mtp.pre_fc_norm_hidden.weight": norm(e), "mtp.norm.weight": norm(e),
        p + "input_layernorm.weight": norm(e), p + "post_attention_layernorm.weight": norm(e),
        p + "self_attn.q_proj.weight": mat(nh * hd * 2, e), p + "self_attn.k_proj.weight": mat(nkv * hd, e),
        p + "self_attn.v_proj.weight": mat(nkv * hd, e), p + "self_attn.o_proj.weight": mat(e, nh * hd),
        p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd),
        p + "mlp.gate_proj.weight": mat(ff, e), p + "mlp.up_proj.weight": mat(ff, e),
        p + "mlp.down_proj.weight": mat(e, ff),
    }


def save_checkpoint(model, folder: Path, extra: dict | None = None) -> None:  # type: ignore[no-untyped-def,type-arg]
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(folder)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings or getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    sd.update(extra or {})
    n_vocab = model.config.get_text_config().vocab_size
    if "gemma" in type(model).__name__.lower():  # the converter trims token_embd to tokenizer.json's vocabulary
        sys.path.insert(0, str(ROOT / "tests"))
        from synth_gemma4 import vocab

        toks = vocab(n_vocab)[0]
        (folder / "tokenizer.json").write_text(json.dumps(
            {"model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(toks)}}, "added_tokens": []}))
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if extra:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["mtp_num_hidden_layers"] = 1
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))


# ---------------------------------------------------------------------------------------------- conversion
def convert(tree: Path, hf_dir: Path, out: Path, outtype: str, *flags: str) -> Path:
    """Run the converter (this file's `_convert` entry, in a child process) -> the written GGUF."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "_convert", str(tree), str(hf_dir), "--outtype", outtype, "--outfile", str(out),
           *flags]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    if "--mtp" in flags:  # the converter names the sidecar itself: mtp-<name>.gguf next to --outfile
        found = sorted(out.parent.glob("mtp-*.gguf"), key=lambda p: p.stat().st_mtime)
        found[-1].rename(out)
    return out


def _convert_main(argv: list[str]) -> None:
    """Child-process entry: import the vendored converter, replace set_vocab (see the module docstring), run it."""
    tree = Path(argv[0])
    sys.path[:0] = [str(tree / "gguf-py"), str(tree), str(ROOT / "tests"), str(ROOT / "tools")]
    import convert_hf_to_gguf as conv
    import synth_gemma4
    import synth_qwen35
    from conversion.gemma import Gemma4Model
    from conversion.qwen import Qwen3_5TextModel

    def gemma_vocab(self) -> None:  # type: ignore[no-untyped-def]
        synth_gemma4._tokenizer(self.gguf_writer, self.hparams.get("vocab_size") or
                                self.hparams["text_config"]["vocab_size"])

    def qwen_vocab(self) -> None:  # type: ignore[no-untyped-def]
        s = synth_qwen35.replace(synth_qwen35.TINY, n_vocab=self.hparams["vocab_size"])
        synth_qwen35.add_tokenizer(self.gguf_writer, s, "qwen35")

    Gemma4Model.set_vocab = gemma_vocab  # type: ignore[method-assign]
    Qwen3_5TextModel.set_vocab = qwen_vocab  # type: ignore[method-assign]
    sys.argv = ["convert_hf_to_gguf.py", argv[1], *argv[2:]]
    conv.main()


# ---------------------------------------------------------------------------------------------- reference runs
def prompt_ids(n_vocab: int, first: int, seed: int = 7) -> list[int]:
    rng = np.random.default_rng(seed)
    return [first] + [int(t) for t in rng.integers(4 if first == 2 else 0, n_vocab if first == 2 else 320,
                                                    N_PROMPT - 1)]


def greedy(model, ids: list[int]) -> tuple[list[int], np.ndarray]:  # type: ignore[no-untyped-def]
    import torch

    ids = list(ids)
    with torch.no_grad():
        for _ in range(N_DECODE):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        logits = model(torch.tensor([ids])).logits[0].numpy()
    return ids, logits.astype(np.float32)


def draft_chain(dft, tgt, ids: list[int], masked: bool) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """Three chained assistant steps at DRAFT_AT, fed the way llama.cpp (and cuca) feed them."""
    import torch

    s = GEMMA4
    with torch.no_grad():
        out = tgt.model(torch.tensor([ids[:DRAFT_AT]]), return_shared_kv_states=True)
        h = out.last_hidden_state[0, -1:].clone()
        kv = {k: (v[0], v[1]) for k, v in dict(out.shared_kv_states).items()}
        w = s["window"] - 1  # a query at position n sees the window-1 keys before it on sliding layers
        kv["sliding_attention"] = (kv["sliding_attention"][0][:, :, -w:], kv["sliding_attention"][1][:, :, -w:])
        dft.config.use_ordered_embeddings = masked
        emb = tgt.model.embed_tokens.weight
        tok, logits, hs, toks = ids[DRAFT_AT], [], [], []
        for _ in range(N_DRAFT):
            e = emb[tok] * math.sqrt(s["hidden"])  # the raw table row, scaled (embed_tokens scales on its own)
            x = torch.cat([e.reshape(1, 1, -1), h.reshape(1, 1, -1)], dim=-1)
            o = dft(inputs_embeds=x, position_ids=torch.tensor([[DRAFT_AT]]), shared_kv_states=kv)
            logits.append(o.logits[0, 0].numpy())
            h = o.last_hidden_state[0, 0]
            hs.append(h.numpy())
            tok = int(o.logits[0, 0].argmax())
            toks.append(tok)
        dft.config.use_ordered_embeddings = True
    return {"logits": np.stack(logits).astype(np.float32), "h": np.stack(hs).astype(np.float32),
            "tokens": np.array(toks, np.int32), "first_h": out.last_hidden_state[0, -1].numpy().astype(np.float32)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_convert":
        _convert_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/cuca-converted"))
    args = ap.parse_args()
    import torch
    from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    torch.manual_seed(SEED)
    tree = llama_cpp_dir(args.work)
    sys.path[:0] = [str(tree / "gguf-py"), str(ROOT / "tests")]
    import synth_gemma4
    work = args.work / "hf"
    rec: dict[str, np.ndarray] = {}

    # gemma4 target + assistant
    tgt = Gemma4ForCausalLM(gemma4_config())
    randomize(tgt, SEED)
    tgt.config._attn_implementation = "eager"
    tgt.eval().float()
    save_checkpoint(tgt, work / "gemma4")
    acfg = assistant_config()
    dft = Gemma4AssistantForCausalLM(acfg)
    randomize(dft, SEED + 1)
    n_c = ASSISTANT["centroids"]
    order = torch.randperm(GEMMA4["vocab"], generator=torch.Generator().manual_seed(SEED + 2))
    dft.masked_embedding.token_ordering.copy_(order)
    dft.config._attn_implementation = "eager"
    dft.config.text_config._attn_implementation = "eager"
    dft.eval().float()
    save_checkpoint(dft, work / "assistant")
    ids, logits = greedy(tgt, prompt_ids(GEMMA4["vocab"], 2))
    rec.update(gemma4_tokens=np.array(ids, np.int32), gemma4_logits=logits, draft_at=np.array(DRAFT_AT))
    for masked in (True, False):
        for k, v in draft_chain(dft, tgt, ids, masked).items():
            rec[f"assistant_{'masked' if masked else 'dense'}_{k}"] = v
    rec["centroids_top_k"] = np.array(ASSISTANT["top_k"])
    rec["centroids_count"] = np.array(n_c)
    for dt in DTYPES:
        convert(tree, work / "gemma4", OUT / f"gemma4-{dt}.gguf", dt)
        plain = convert(tree, work / "assistant", OUT / f"assistant-{dt}.gguf", dt)
        synth_gemma4.append_centroids(plain, OUT / f"assistant-centroids-{dt}.gguf",
                         dft.masked_embedding.centroids.weight.detach().numpy(), order.numpy())

    # qwen35 with MTP, and the grouped-key layout
    for tag, s in (("qwen35", QWEN35), ("qwen35g", QWEN35_GROUPED)):
        m = Qwen3_5ForCausalLM(qwen35_config(s))
        randomize(m, SEED + 3)
        m.eval().float()
        save_checkpoint(m, work / tag, qwen35_mtp_tensors(s, SEED + 4))
        ids, logits = greedy(m, prompt_ids(s["vocab"], s["specials_at"]))
        rec[f"{tag}_tokens"], rec[f"{tag}_logits"] = np.array(ids, np.int32), logits
    for dt in DTYPES:
        convert(tree, work / "qwen35", OUT / f"qwen35-{dt}.gguf", dt)
    convert(tree, work / "qwen35", OUT / "qwen35-nomtp-f32.gguf", "f32", "--no-mtp")
    convert(tree, work / "qwen35", OUT / "mtp-qwen35-f32.gguf", "f32", "--mtp")
    convert(tree, work / "qwen35g", OUT / "qwen35g-f32.gguf", "f32")
    np.savez_compressed(OUT / "converted_hf.npz", **rec)
    (OUT / "VERSION").write_text(f"llama-cpp-python {LLAMA_CPP_PYTHON} convert_hf_to_gguf.py; transformers "
                                 f"{__import__('transformers').__version__}; torch {torch.__version__}\n")
    print("wrote", sorted(p.name for p in OUT.iterdir()))


if __name__ == "__main__":
    main()
