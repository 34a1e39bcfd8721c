"""Golden fixtures for the qwen35 tests: tests/fixtures/qwen35_golden.npz.

Run with the reference environment (torch + transformers 5.x + gguf + numpy):
    /work/refvenv/bin/python tools/make_qwen35_fixtures.py

It builds the tiny synthetic model of tools/synth_qwen35.py (TINY, F32, seed 0; the test writes the same GGUF),
loads the same weights into transformers' Qwen3.5 text model (undoing the GGUF conventions: norms stored as 1 + w,
ssm_a stored as -exp(A_log)) and saves:
- trunk logits over a 40-token prompt (one prefill pass) and 20 greedy decode steps (transformers' recurrent path);
- the MTP head, which transformers ignores: a float64 numpy reference written from the spec
  (../shared/specs/qwen35.md section 3): its hidden and logits over the prompt rows paired (x_{t+1}, h_t) with the
  trunk's post-norm hidden from transformers, then 4 chained greedy draft steps;
- a checksum of the weights, so the test knows it rebuilt the same file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import synth_qwen35 as S  # noqa: E402

SEED, N_PROMPT, N_DECODE, N_CHAIN = 0, 40, 20, 4
EPS = 1e-6


def hf_model(s: S.Shape, t: dict[str, np.ndarray]) -> Qwen3_5ForCausalLM:
    cfg = Qwen3_5TextConfig(
        vocab_size=s.n_vocab, hidden_size=s.n_embd, intermediate_size=s.n_ff, num_hidden_layers=s.n_layer,
        num_attention_heads=s.n_head, num_key_value_heads=s.n_head_kv, head_dim=s.head_dim,
        linear_conv_kernel_dim=s.conv, linear_key_head_dim=s.d_state, linear_value_head_dim=s.d_state,
        linear_num_key_heads=s.k_heads, linear_num_value_heads=s.v_heads, rms_norm_eps=EPS,
        tie_word_embeddings=True, max_position_embeddings=s.n_ctx_train,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": s.n_rot / s.head_dim,
                         "mrope_section": list(s.sections[:3]), "mrope_interleaved": True},
        layer_types=["linear_attention" if S.is_recurrent(s, i) else "full_attention" for i in range(s.n_layer)],
    )
    model = Qwen3_5ForCausalLM(cfg).eval().to(torch.float64)

    def T(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(a, np.float64).copy())

    sd = {"model.embed_tokens.weight": T(t["token_embd.weight"]),
          "model.norm.weight": T(t["output_norm.weight"] - 1), "lm_head.weight": T(t["token_embd.weight"])}
    for i in range(s.n_layer):
        p, q = f"blk.{i}.", f"model.layers.{i}."
        sd[q + "input_layernorm.weight"] = T(t[p + "attn_norm.weight"] - 1)
        sd[q + "post_attention_layernorm.weight"] = T(t[p + "post_attention_norm.weight"] - 1)
        sd[q + "mlp.gate_proj.weight"] = T(t[p + "ffn_gate.weight"])
        sd[q + "mlp.up_proj.weight"] = T(t[p + "ffn_up.weight"])
        sd[q + "mlp.down_proj.weight"] = T(t[p + "ffn_down.weight"])
        if S.is_recurrent(s, i):
            la = q + "linear_attn."
            sd[la + "in_proj_qkv.weight"] = T(t[p + "attn_qkv.weight"])
            sd[la + "in_proj_z.weight"] = T(t[p + "attn_gate.weight"])
            sd[la + "in_proj_b.weight"] = T(t[p + "ssm_beta.weight"])
            sd[la + "in_proj_a.weight"] = T(t[p + "ssm_alpha.weight"])
            sd[la + "conv1d.weight"] = T(t[p + "ssm_conv1d.weight"][:, None, :])
            sd[la + "dt_bias"] = T(t[p + "ssm_dt.bias"])
            sd[la + "A_log"] = T(np.log(-t[p + "ssm_a"].astype(np.float64)))
            sd[la + "norm.weight"] = T(t[p + "ssm_norm.weight"])
            sd[la + "out_proj.weight"] = T(t[p + "ssm_out.weight"])
        else:
            sa = q + "self_attn."
            sd[sa + "q_proj.weight"] = T(t[p + "attn_q.weight"])
            sd[sa + "k_proj.weight"] = T(t[p + "attn_k.weight"])
            sd[sa + "v_proj.weight"] = T(t[p + "attn_v.weight"])
            sd[sa + "o_proj.weight"] = T(t[p + "attn_output.weight"])
            sd[sa + "q_norm.weight"] = T(t[p + "attn_q_norm.weight"] - 1)
            sd[sa + "k_norm.weight"] = T(t[p + "attn_k_norm.weight"] - 1)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and not [m for m in missing if not m.endswith("inv_freq")], (missing, unexpected)
    return model


# ---------------------------------------------------------------------------------------------- MTP reference
def rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + EPS) * w


class MTPRef:
    """The spec's MTP step in float64: e = enorm(embed[x]), hh = hnorm(h), u = eh_proj([e, hh]), one gated
    full-attention block with its own K/V (partial NeoX RoPE), shared_head_norm, tied head."""

    def __init__(self, s: S.Shape, t: dict[str, np.ndarray]):
        self.s = s
        self.t = {k: v.astype(np.float64) for k, v in t.items()}
        self.p = f"blk.{s.n_layer}."
        self.keys: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []

    def rope(self, x: np.ndarray, pos: int) -> np.ndarray:
        n = self.s.n_rot
        half = n // 2
        inv = 1e7 ** (-np.arange(half) * 2.0 / n)
        c, sn = np.cos(pos * inv), np.sin(pos * inv)
        y = x.copy()
        x0, x1 = x[..., :half], x[..., half:n]
        y[..., :half] = x0 * c - x1 * sn
        y[..., half:n] = x0 * sn + x1 * c
        return y

    def step(self, tok: int, h: np.ndarray, pos: int) -> np.ndarray:
        s, t, p = self.s, self.t, self.p
        assert pos == len(self.keys)
        hd, nh, nkv = s.head_dim, s.n_head, s.n_head_kv
        e = rms(t["token_embd.weight"][tok], t[p + "nextn.enorm.weight"])
        hh = rms(h, t[p + "nextn.hnorm.weight"])
        u = t[p + "nextn.eh_proj.weight"] @ np.concatenate([e, hh])
        a = rms(u, t[p + "attn_norm.weight"])
        qg = (t[p + "attn_q.weight"] @ a).reshape(nh, 2 * hd)
        q, gate = rms(qg[:, :hd], t[p + "attn_q_norm.weight"]), qg[:, hd:]
        k = rms((t[p + "attn_k.weight"] @ a).reshape(nkv, hd), t[p + "attn_k_norm.weight"])
        v = (t[p + "attn_v.weight"] @ a).reshape(nkv, hd)
        q, k = self.rope(q, pos), self.rope(k, pos)
        self.keys.append(k)
        self.vals.append(v)
        K, V = np.stack(self.keys, 1), np.stack(self.vals, 1)  # (nkv, L, hd)
        o = np.empty((nh, hd))
        for i in range(nh):
            sc = K[i // (nh // nkv)] @ q[i] / np.sqrt(hd)
            pr = np.exp(sc - sc.max())
            o[i] = (pr / pr.sum()) @ V[i // (nh // nkv)]
        o = o.reshape(-1) / (1.0 + np.exp(-gate.reshape(-1)))
        u = u + t[p + "attn_output.weight"] @ o
        f = rms(u, t[p + "post_attention_norm.weight"])
        g = t[p + "ffn_gate.weight"] @ f
        u = u + t[p + "ffn_down.weight"] @ (g / (1.0 + np.exp(-g)) * (t[p + "ffn_up.weight"] @ f))
        return rms(u, t[p + "nextn.shared_head_norm.weight"])

    def logits(self, h: np.ndarray) -> np.ndarray:
        return self.t["token_embd.weight"] @ h


def main() -> None:
    s = S.TINY
    t = S.weights(s, SEED, mtp=True)
    model = hf_model(s, t)
    rng = np.random.default_rng(1234)
    prompt = rng.integers(0, s.specials_at, N_PROMPT)
    with torch.no_grad():
        out = model(torch.tensor(prompt[None]), use_cache=True, output_hidden_states=True)
        logits = [out.logits[0].numpy()]
        hidden = [out.hidden_states[-1][0].numpy()]
        cache = out.past_key_values
        toks: list[int] = []
        nxt = int(np.argmax(logits[-1][-1]))
        for i in range(N_DECODE):
            toks.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=cache, use_cache=True, output_hidden_states=True,
                        position_ids=torch.tensor([[N_PROMPT + i]]))
            cache = out.past_key_values
            logits.append(out.logits[0].numpy())
            hidden.append(out.hidden_states[-1][0].numpy())
            nxt = int(np.argmax(logits[-1][-1]))
    all_logits = np.concatenate(logits).astype(np.float32)
    all_hidden = np.concatenate(hidden)
    # MTP over the prompt: pair (x_{t+1}, h_t) at position t; the last row pairs the first generated token
    seq = [*prompt.tolist(), toks[0]]
    ref = MTPRef(s, t)
    mtp_h = [ref.step(seq[i + 1], all_hidden[i], i) for i in range(N_PROMPT)]
    mtp_logits = [ref.logits(h) for h in mtp_h]
    chain: list[int] = []
    h, pos = mtp_h[-1], N_PROMPT
    for _ in range(N_CHAIN):
        d = int(np.argmax(ref.logits(h)[: S.DRAFT_VOCAB_TINY]))
        chain.append(d)
        h = ref.step(d, h, pos)
        mtp_logits.append(ref.logits(h))
        pos += 1
    dst = ROOT / "tests" / "fixtures" / "qwen35_golden.npz"
    np.savez_compressed(
        dst, prompt=prompt.astype(np.int32), decode=np.array(toks, np.int32), logits=all_logits,
        hidden=all_hidden.astype(np.float32), mtp_logits=np.array(mtp_logits, np.float32),
        chain=np.array(chain, np.int32), checksum=np.array(S.checksum(t)),
    )
    print(f"wrote {dst}: logits {all_logits.shape}, chain {chain}")


if __name__ == "__main__":
    main()
