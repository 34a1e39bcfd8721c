"""The dense families that draft-model pairs use (qwen3, qwen2, Llama 3 through llama), on files written by llama.cpp's
own converter from tiny random transformers checkpoints (tools/make_dense_fixtures.py), against transformers' logits
on the same checkpoints and (tools/make_dense_llamacpp_fixture.py) llama.cpp's logits and tokens on the same files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.layers import Ops

DIR = Path(__file__).parent / "fixtures" / "converted"
HF = np.load(DIR / "dense_hf.npz")
FAMILIES = ["qwen3", "qwen2", "llama3"]
N_PROMPT = 24
# largest relative logit error vs transformers (F32 checkpoints), measured -> bound
BOUND = {"f32": 1e-5, "q8_0": 1.5e-1}  # measured: f32 <= 1.7e-6, q8_0 <= 6.5e-2

_models: dict[str, Any] = {}


def model(name: str) -> Any:
    if name not in _models:
        _models[name] = load_model(open_gguf(DIR / f"{name}.gguf"), Ops(1))
    return _models[name]


def rows(m: Any, tokens: np.ndarray) -> np.ndarray:
    """Every row's logits: the prompt in one batch, then one token at a time."""
    cache = m.make_cache(64)
    out = [m.forward(tokens[:N_PROMPT], np.arange(N_PROMPT, dtype=np.int32), cache, "all")]
    out += [m.forward(tokens[i : i + 1], np.array([i], np.int32), cache, "all") for i in range(N_PROMPT, len(tokens))]
    return np.concatenate(out)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.abs(a - b).max(axis=-1) / np.abs(b).max(axis=-1)).max())


@pytest.mark.parametrize("name,role", [(f"{f}-{dt}", "target") for f in FAMILIES for dt in ("f32", "q8_0")]
                         + [(f"{f}-draft-f32", "drafter") for f in FAMILIES])
def test_logits_match_transformers(name: str, role: str) -> None:
    family, dt = name.split("-")[0], name.split("-")[-1]
    tokens = HF[f"{family}_{role}_tokens"]
    logits = rows(model(name), tokens)
    assert rel_err(logits, HF[f"{family}_{role}_logits"]) < BOUND[dt]
    if dt == "f32":  # the greedy continuation is transformers' own
        assert [int(t) for t in logits[N_PROMPT - 1 : -1].argmax(1)] == [int(t) for t in tokens[N_PROMPT:]]


def test_llama3_rope_scaling_reaches_the_model() -> None:
    """The converter's rope_freqs.weight equals transformers' llama3 scaling (every band: 1, smoothed, factor),
    and cuca's llama rotates with it (dropping it moves the logits far off)."""
    m = model("llama3-f32")
    ff = m.c.rope_freqs
    assert ff is not None and np.allclose(ff, HF["llama3_inv_freq_factors"], rtol=1e-5)
    assert ff.min() == 1.0 and ff.max() == 8.0 and ((ff > 1) & (ff < 8)).any()
    assert m.arch == "llama" and not m.blk[0].attn.rope.neox
    tokens = HF["llama3_target_tokens"]
    saved = [b.attn.rope for b in m.blk]
    try:
        for b in m.blk:
            b.attn.rope = b.attn.spec.rope.__class__(b.attn.rope.n_rot, b.attn.rope.base, neox=False)
        assert rel_err(rows(m, tokens), HF["llama3_target_logits"]) > 1e-2
    finally:
        for b, r in zip(m.blk, saved, strict=True):
            b.attn.rope = r


def test_qwen_families_use_their_parts() -> None:
    q3, q2 = model("qwen3-f32"), model("qwen2-f32")
    assert q3.arch == "qwen3" and q3.blk[0].attn.attn_q_norm is not None and q3.blk[0].attn.bq is None
    assert q2.arch == "qwen2" and q2.blk[0].attn.attn_q_norm is None and q2.blk[0].attn.bq is not None
    assert q2.blk[0].attn.bk is not None and q2.blk[0].attn.bv is not None
    assert q3.blk[0].attn.rope.neox and q2.blk[0].attn.rope.neox
