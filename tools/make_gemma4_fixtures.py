"""Golden fixtures for Gemma 4 (`gemma4`) and its drafter (`gemma4-assistant`) on random weights.

Both files are written by tests/synth_gemma4.py (F32, fixed seeds: the tests write the same bytes), then:

    hf        transformers' Gemma4ForCausalLM and Gemma4AssistantForCausalLM (5.x) run on the same weights:
              target logits over a 40-token prompt and 20 greedy steps, and 3 chained drafter steps.
              /path/to/venv-with-torch-and-transformers/bin/python tools/make_gemma4_fixtures.py hf
    llamacpp  llama.cpp (llama-cpp-python) logits for the same 60 tokens on the same target file.
              python tools/make_gemma4_fixtures.py llamacpp

Writes tests/fixtures/gemma4_hf.npz and tests/fixtures/gemma4_llamacpp.npz.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from synth_gemma4 import TINY, TINY_ASSISTANT, write_gemma4, write_gemma4_assistant  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
N_PROMPT, N_DECODE, DRAFT_AT, N_DRAFT = 40, 20, 50, 3
PROMPT_SEED = 7


def prompt_ids() -> list[int]:
    rng = np.random.default_rng(PROMPT_SEED)
    return [2] + [int(t) for t in rng.integers(4, TINY.n_vocab, N_PROMPT - 1)]


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    import gguf

    r = gguf.GGUFReader(str(path))
    return {t.name: np.array(t.data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)]) for t in r.tensors}


def hf_state_dict(t: dict[str, np.ndarray], n_layer: int, prefix: str) -> dict[str, np.ndarray]:
    """GGUF names -> transformers names for the decoder layers (both models)."""
    names = {
        "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj", "post_ffw_norm": "post_feedforward_layernorm",
        "inp_gate": "per_layer_input_gate", "proj": "per_layer_projection", "post_norm": "post_per_layer_input_norm",
    }
    sd = {}
    for il in range(n_layer):
        for g, h in names.items():
            key = f"blk.{il}.{g}.weight"
            if key in t:
                sd[f"{prefix}layers.{il}.{h}.weight"] = t[key]
        sd[f"{prefix}layers.{il}.layer_scalar"] = t[f"blk.{il}.layer_output_scale.weight"].reshape(1)
    return sd


def run_hf(tmp: Path) -> None:
    import torch
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(0)
    s, a = TINY, TINY_ASSISTANT
    tgt_path = write_gemma4(tmp / "gemma4.gguf")
    dft_path = write_gemma4_assistant(tmp / "gemma4-assistant.gguf")
    layer_types = ["sliding_attention" if w else "full_attention" for w in s.swa()]
    common = dict(
        vocab_size=s.n_vocab, num_attention_heads=s.n_head, num_key_value_heads=s.n_head_kv, head_dim=s.hd_swa,
        global_head_dim=s.hd, sliding_window=s.window, rms_norm_eps=1e-6, max_position_embeddings=s.n_ctx_train,
        hidden_activation="gelu_pytorch_tanh", attention_k_eq_v=False, tie_word_embeddings=True,
    )
    cfg = Gemma4TextConfig(
        hidden_size=s.n_embd, intermediate_size=s.n_ff, num_hidden_layers=s.n_layer, layer_types=layer_types,
        final_logit_softcapping=s.softcap, hidden_size_per_layer_input=s.n_ple, vocab_size_per_layer_input=s.n_vocab,
        num_kv_shared_layers=s.n_shared, use_double_wide_mlp=True, **common,
    )
    cfg._attn_implementation = "eager"
    model = Gemma4ForCausalLM(cfg).eval().float()
    t = read_tensors(tgt_path)
    sd = hf_state_dict(t, s.n_layer, "model.")
    sd.update({
        "model.embed_tokens.weight": t["token_embd.weight"], "model.norm.weight": t["output_norm.weight"],
        "model.embed_tokens_per_layer.weight": t["per_layer_token_embd.weight"],
        "model.per_layer_model_projection.weight": t["per_layer_model_proj.weight"],
        "model.per_layer_projection_norm.weight": t["per_layer_proj_norm.weight"],
        "lm_head.weight": t["token_embd.weight"],
    })
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in sd.items()}, strict=False)
    assert not unexpected and not [k for k in missing if "rotary" not in k], (missing, unexpected)

    ids = prompt_ids()
    with torch.no_grad():
        for _ in range(N_DECODE):
            logits = model(torch.tensor([ids])).logits[0]
            ids.append(int(logits[-1].argmax()))
        out = model(torch.tensor([ids]), output_hidden_states=True)
        logits = out.logits[0].numpy()  # rows 0..59: prompt rows, then the 20 decode steps' rows
        # the drafter's state at n = DRAFT_AT: the target holds positions 0..n-1 and has chosen ids[n]
        tgt = model.model(torch.tensor([ids[:DRAFT_AT]]), return_shared_kv_states=True)
        h = tgt.last_hidden_state[0, -1:].clone()  # post-norm hidden of the row that produced ids[n]
        kv = tgt.shared_kv_states
    kv = {k: (v[0], v[1]) for k, v in dict(kv).items()}
    # llama.cpp's mask for the query at position n (what GGUF users get): full layers see 0..n-1, sliding ones the
    # window-1 keys before n; transformers attends to whatever it is given, so give it exactly those keys
    w = s.window - 1
    kv["sliding_attention"] = (kv["sliding_attention"][0][:, :, -w:], kv["sliding_attention"][1][:, :, -w:])

    acfg = Gemma4AssistantConfig(
        text_config=Gemma4TextConfig(
            hidden_size=a.n_embd, intermediate_size=a.n_ff, num_hidden_layers=a.n_layer,
            layer_types=["sliding_attention"] * (a.n_layer - 1) + ["full_attention"], final_logit_softcapping=None,
            hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, num_kv_shared_layers=a.n_layer,
            use_double_wide_mlp=False, **{**common, "num_attention_heads": a.n_head},
        ),
        backbone_hidden_size=s.n_embd, use_ordered_embeddings=False,
    )
    acfg.text_config._attn_implementation = "eager"
    acfg._attn_implementation = "eager"
    dft = Gemma4AssistantForCausalLM(acfg).eval().float()
    d = read_tensors(dft_path)
    dsd = hf_state_dict(d, a.n_layer, "model.")
    dsd.update({
        "model.embed_tokens.weight": d["token_embd.weight"], "model.norm.weight": d["output_norm.weight"],
        "lm_head.weight": d["token_embd.weight"], "pre_projection.weight": d["nextn.pre_projection.weight"],
        "post_projection.weight": d["nextn.post_projection.weight"],
    })
    missing, unexpected = dft.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in dsd.items()}, strict=False)
    assert not unexpected and not [k for k in missing if "rotary" not in k], (missing, unexpected)

    emb = torch.from_numpy(t["token_embd.weight"])
    tok, draft_logits, draft_h, draft_tokens = ids[DRAFT_AT], [], [], []
    with torch.no_grad():
        for _ in range(N_DRAFT):
            e = emb[tok] * math.sqrt(s.n_embd)
            x = torch.cat([e.reshape(1, 1, -1), h.reshape(1, 1, -1)], dim=-1)
            o = dft(inputs_embeds=x, position_ids=torch.tensor([[DRAFT_AT]]), shared_kv_states=kv)
            draft_logits.append(o.logits[0, 0].numpy())
            h = o.last_hidden_state[0, 0]
            draft_h.append(h.numpy())
            tok = int(o.logits[0, 0].argmax())
            draft_tokens.append(tok)
    FIXTURES.mkdir(exist_ok=True)
    np.savez_compressed(
        FIXTURES / "gemma4_hf.npz", tokens=np.array(ids, np.int32), logits=logits.astype(np.float32),
        draft_at=DRAFT_AT, draft_logits=np.stack(draft_logits).astype(np.float32),
        draft_h=np.stack(draft_h).astype(np.float32), draft_tokens=np.array(draft_tokens, np.int32),
        first_h=tgt.last_hidden_state[0, -1].numpy().astype(np.float32),
    )
    print("target tokens", ids[N_PROMPT:], "drafts", draft_tokens)


def run_llamacpp(tmp: Path) -> None:
    import llama_cpp

    path = write_gemma4(tmp / "gemma4.gguf")
    ids = [int(i) for i in np.load(FIXTURES / "gemma4_hf.npz")["tokens"]]
    # f32 K/V cache (llama.cpp defaults to f16, which alone moves logits by ~1e-2 here)
    llm = llama_cpp.Llama(str(path), n_ctx=128, n_batch=128, logits_all=True, n_threads=2, verbose=False,
                          type_k=0, type_v=0)
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], np.float32)
    np.savez_compressed(FIXTURES / "gemma4_llamacpp.npz", tokens=np.array(ids, np.int32), logits=logits)
    print("llama.cpp", llama_cpp.__version__, "greedy:", [int(x) for x in logits[N_PROMPT - 1 : -1].argmax(1)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["hf", "llamacpp"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        (run_hf if args.part == "hf" else run_llamacpp)(Path(d))


if __name__ == "__main__":
    main()
