"""Gemma 4 (`gemma4`) and its drafter (`gemma4-assistant`) on synthetic files in the real layout.

Oracles: transformers' Gemma4ForCausalLM / Gemma4AssistantForCausalLM and llama.cpp on the same F32 weights
(tests/fixtures/gemma4_*.npz, made by tools/make_gemma4_fixtures.py), and a float64 numpy forward written from the
spec (tests/reference_gemma4.py) whose trap switches show that each trap of the spec changes the logits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import reference_gemma4 as ref
from helpers import plain, same_cache
from helpers import spec as run_spec
from synth import Edits
from synth_gemma4 import TINY, AssistantOpts, Q, TargetOpts, write_gemma4, write_gemma4_assistant

import cuca.models.gemma4_assistant as ga
from cuca.errors import GGUFError, ProviderError
from cuca.gguf import GGUFFile, open_gguf
from cuca.kernels import implementations
from cuca.models import layers, load_model
from cuca.models.gemma4_assistant import load_assistant
from cuca.models.layers import Ops
from cuca.sampling import SamplingParams
from cuca.speculative import AlwaysDraft, SpeculativeDecoder
from cuca.speculative.drafters.assistant import AssistantDrafter

FIX = Path(__file__).parent / "fixtures"
HF = np.load(FIX / "gemma4_hf.npz")
LC = np.load(FIX / "gemma4_llamacpp.npz")
TOKENS = [int(t) for t in HF["tokens"]]
N_PROMPT = 40
DRAFT_AT = int(HF["draft_at"])


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b| of a row over that row's largest |b|: "relative" for logits, which cross zero."""
    return float((np.abs(a - b).max(axis=-1) / np.abs(b).max(axis=-1)).max())


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gemma4")
    return {
        "target": write_gemma4(d / "gemma4.gguf"),
        "target_unused_kv": write_gemma4(d / "gemma4-kv.gguf", opts=TargetOpts(shared_kv_tensors=True)),
        "drafter": write_gemma4_assistant(d / "assistant.gguf"),
        "target_q": write_gemma4(d / "gemma4-q.gguf", qtype=Q.Q4_0, opts=TargetOpts(embd_qtype=Q.Q8_0)),
        "drafter_f16": write_gemma4_assistant(d / "assistant-f16.gguf", qtype=Q.F16),
    }


@pytest.fixture(scope="module")
def target(files: dict[str, Path]):  # type: ignore[no-untyped-def]
    return load_model(open_gguf(files["target"]), Ops(2))


def plain_then_decode(model, tokens: list[int], n_prompt: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Logits of a prefill over the first n_prompt tokens, then one decode step per remaining token."""
    cache = model.make_cache(128)
    rows = [model.forward(np.array(tokens[:n_prompt], np.int32), np.arange(n_prompt, dtype=np.int32), cache, "all")]
    for i in range(n_prompt, len(tokens)):
        rows.append(model.forward(np.array([tokens[i]], np.int32), np.array([i], np.int32), cache, "all"))
    return np.concatenate(rows)


# -- 1. logits against transformers and llama.cpp ------------------------------------------------------------------


def test_target_matches_transformers(target) -> None:  # type: ignore[no-untyped-def]
    """40-token prompt + 20 decode steps: every row within 1e-4 (relative to the row's largest logit)."""
    logits = plain_then_decode(target, TOKENS, N_PROMPT)
    assert rel_err(logits, HF["logits"]) < 1e-4
    # the greedy continuation transformers chose is the one cuca chooses
    assert [int(t) for t in logits[N_PROMPT - 1 : -1].argmax(1)] == TOKENS[N_PROMPT:]


def test_target_matches_llamacpp(target) -> None:  # type: ignore[no-untyped-def]
    """llama.cpp rounds GELU inputs to f16 (a lookup table), so it sits further away: within 3e-3 of the row's
    largest logit (measured 1.03e-3, the same as transformers' distance to it), and the same greedy continuation."""
    logits = plain_then_decode(target, TOKENS, N_PROMPT)
    assert rel_err(logits, LC["logits"]) < 3e-3
    assert np.array_equal(logits[N_PROMPT - 1 : -1].argmax(1), LC["logits"][N_PROMPT - 1 : -1].argmax(1))


def test_both_kernel_backends_agree(files: dict[str, Path]) -> None:
    impls = implementations()
    if "c" not in impls:
        pytest.skip("the C extension is not built")
    f = open_gguf(files["target"])
    a = plain_then_decode(load_model(f, Ops(2, impls["c"])), TOKENS[:24], 20)
    b = plain_then_decode(load_model(f, Ops(1, impls["numpy"])), TOKENS[:24], 20)
    assert rel_err(a, b) < 1e-5  # measured 8.5e-7: the same float32 math in a different summation order


def draft_chain(files: dict[str, Path], target, requantize: bool = False):  # type: ignore[no-untyped-def]
    a = load_assistant(open_gguf(files["drafter"]), target.ops, target, requantize)
    cache = target.make_cache(128)
    h = target.forward_hidden(np.array(TOKENS[:DRAFT_AT], np.int32), np.arange(DRAFT_AT, dtype=np.int32), cache)
    tok, hh, out = TOKENS[DRAFT_AT], h[-1:], []
    for _ in range(3):
        logits, hh = a.step(np.array([tok], np.int32), hh, DRAFT_AT, cache)
        out.append((logits[0], hh[0]))
        tok = int(logits[0].argmax())
    return h[-1], out


def test_drafter_matches_transformers(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    """Three chained draft steps: draft logits and the next hidden within 1e-4; the same drafts."""
    h, out = draft_chain(files, target)
    assert rel_err(h, HF["first_h"]) < 1e-4
    for i, (logits, hh) in enumerate(out):
        assert rel_err(logits, HF["draft_logits"][i]) < 1e-4
        assert rel_err(hh, HF["draft_h"][i]) < 1e-4
        assert int(logits.argmax()) == int(HF["draft_tokens"][i])


def test_drafter_requantized_to_q8_0_stays_close(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    _, out = draft_chain(files, target, requantize=True)
    assert rel_err(out[0][0], HF["draft_logits"][0]) < 3e-2  # measured 0.018: Q8_0 weights and activations


# -- traps (shared/specs/gemma4.md §5) -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ref_files(files: dict[str, Path]) -> dict[str, GGUFFile]:
    return {k: open_gguf(v) for k, v in files.items()}


def test_spec_reference_matches_transformers(ref_files: dict[str, GGUFFile]) -> None:
    assert rel_err(ref.forward(ref_files["target"], TOKENS), HF["logits"]) < 1e-4


@pytest.mark.parametrize("trap", ref.TRAPS)
def test_each_trap_changes_the_logits(ref_files: dict[str, GGUFFile], trap: str) -> None:
    """Getting trap `trap` wrong moves the logits far from transformers' (and cuca matches them, above)."""
    f = ref_files["target_unused_kv" if trap == "no_kv_sharing" else "target"]
    assert rel_err(ref.forward(f, TOKENS, trap), HF["logits"]) > 1e-2


def test_spec_drafter_reference_matches_transformers(ref_files: dict[str, GGUFFile]) -> None:
    _, kv, hn = ref.forward(ref_files["target"], TOKENS[:DRAFT_AT], return_kv=True)
    out, toks = ref.draft_steps(ref_files["drafter"], ref_files["target"], kv, (hn[-1], TOKENS[DRAFT_AT], DRAFT_AT), 3)
    assert rel_err(np.stack(out), HF["draft_logits"]) < 1e-4
    assert toks == [int(t) for t in HF["draft_tokens"]]


@pytest.mark.parametrize("trap", ref.DRAFT_TRAPS)
def test_each_drafter_trap_changes_the_drafts(ref_files: dict[str, GGUFFile], trap: str) -> None:
    _, kv, hn = ref.forward(ref_files["target"], TOKENS[:DRAFT_AT], return_kv=True)
    out, _ = ref.draft_steps(ref_files["drafter"], ref_files["target"], kv, (hn[-1], TOKENS[DRAFT_AT], DRAFT_AT), 3,
                             trap)
    assert rel_err(np.stack(out), HF["draft_logits"]) > 1e-2


def test_trap6_kv_sharing_ignores_kv_tensors_on_shared_layers(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    """A file that still carries K/V tensors on the KV-shared layers gives the same logits; the cache holds K/V
    only for the layers that own it."""
    other = load_model(open_gguf(files["target_unused_kv"]), Ops(2))
    a = plain_then_decode(target, TOKENS[:30], 24)
    assert np.array_equal(a, plain_then_decode(other, TOKENS[:30], 24))
    cache = target.make_cache(64)
    first_shared = TINY.n_layer - TINY.n_shared
    assert len(cache.k) == first_shared
    assert [k.shape[2] for k in cache.k] == [TINY.head_dim(i) for i in range(first_shared)]


def test_trap4_7_per_layer_geometry(target) -> None:  # type: ignore[no-untyped-def]
    """Head dims per layer type (key_length is the full layers' one) and the double-wide MLP of shared layers."""
    for il, b in enumerate(target.blk):
        assert b.hd == TINY.head_dim(il)
        assert b.mlp.ffn_gate.n_out == TINY.n_ff_at(il)
        assert b.attn.rope.n_rot == b.hd and (b.attn.rope.freq_factors is None) == TINY.swa()[il]


def test_trap12_mixed_dtypes(files: dict[str, Path], ref_files: dict[str, GGUFFile]) -> None:
    """Q4_0 layers, Q8_0 embeddings, F16 per_layer_model_proj, F32 norms in one file: cuca equals the float64
    spec reference on the same (dequantized) weights within activation-quantization error."""
    f = ref_files["target_q"]
    types = {f.tensors[n].type_name for n in ("blk.0.attn_q.weight", "token_embd.weight", "per_layer_model_proj.weight",
                                              "blk.0.attn_norm.weight")}
    assert types == {"Q4_0", "Q8_0", "F16", "F32"}
    logits = plain_then_decode(load_model(f, Ops(2)), TOKENS[:30], 24)
    assert rel_err(logits, ref.forward(f, TOKENS[:30])) < 8e-2  # measured 0.047: Q8_0 activations, 10 layers


def test_trap15_drafter_writes_nothing(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    a = load_assistant(open_gguf(files["drafter"]), target.ops, target)
    cache = target.make_cache(64)
    target.forward_hidden(np.array(TOKENS[:20], np.int32), np.arange(20, dtype=np.int32), cache)
    before = [k.copy() for k in cache.k] + [v.copy() for v in cache.v]
    d = AssistantDrafter(a, cache)
    d.begin(TOKENS[:20], SamplingParams(), np.random.default_rng(0))
    d.commit([TOKENS[20]], np.array([19], np.int32), np.zeros((1, TINY.n_embd), np.float32))
    assert len(d.propose(4).tokens) == 4
    assert cache.n == 20
    assert all(np.array_equal(x, y) for x, y in zip(before, [*cache.k, *cache.v], strict=True))


def test_trap19_20_tokenizer_and_chat_template(files: dict[str, Path]) -> None:
    from cuca.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(open_gguf(files["target"]))
    ids = tok.encode("hello world")
    assert ids[0] == 2 and ids.count(2) == 1  # BOS always, once
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    chat_ids = tok.encode(text)
    assert chat_ids.count(2) == 1  # the template's <bos> is not doubled
    assert 105 in chat_ids and 106 in chat_ids  # <|turn> / <turn|> parsed as special tokens
    assert tok.decode(chat_ids, skip_special=False).endswith("<|turn>model\n")
    assert 106 in tok.eog_ids and 1 in tok.eog_ids


# -- 2. loading errors ---------------------------------------------------------------------------------------------


def test_drafter_width_mismatch(tmp_path: Path, target) -> None:  # type: ignore[no-untyped-def]
    p = write_gemma4_assistant(tmp_path / "a.gguf", opts=AssistantOpts(n_embd_out=96))
    with pytest.raises(ProviderError, match=r"embedding_length_out 96 .* embedding_length 64"):
        load_assistant(open_gguf(p), target.ops, target)


def test_drafter_vocab_mismatch(tmp_path: Path, target) -> None:  # type: ignore[no-untyped-def]
    p = write_gemma4_assistant(tmp_path / "a.gguf", opts=AssistantOpts(n_vocab=480))
    with pytest.raises(ProviderError, match=r"480 tokens .* 512"):
        load_assistant(open_gguf(p), target.ops, target)


def test_drafter_given_as_target(files: dict[str, Path]) -> None:
    with pytest.raises(ProviderError, match=r"'gemma4-assistant' is a drafter"):
        load_model(open_gguf(files["drafter"]))


def test_target_given_as_drafter(files: dict[str, Path], target) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProviderError, match=r"'gemma4' is not a drafter"):
        load_assistant(open_gguf(files["target"]), target.ops, target)


def test_drafter_for_another_architecture(files: dict[str, Path], tmp_path: Path) -> None:
    from synth import write_tiny

    llama = load_model(open_gguf(write_tiny(tmp_path / "llama.gguf")))
    with pytest.raises(ProviderError, match=r"needs a gemma4 target, got 'llama'"):
        load_assistant(open_gguf(files["drafter"]), llama.ops, llama)


@pytest.mark.parametrize("name", ["blk.3.attn_k.weight", "per_layer_proj_norm.weight", "rope_freqs.weight"])
def test_missing_tensor(tmp_path: Path, name: str) -> None:
    p = write_gemma4(tmp_path / "t.gguf", opts=TargetOpts(edits=Edits(skip=(name,))))
    with pytest.raises(ProviderError, match=rf"missing tensor '{name}'"):
        load_model(open_gguf(p))


def test_missing_drafter_tensor(tmp_path: Path, target) -> None:  # type: ignore[no-untyped-def]
    p = write_gemma4_assistant(tmp_path / "a.gguf",
                               opts=AssistantOpts(edits=Edits(skip=("nextn.pre_projection.weight",))))
    with pytest.raises(ProviderError, match="missing tensor 'nextn.pre_projection.weight'"):
        load_assistant(open_gguf(p), target.ops, target)


@pytest.mark.parametrize("key", ["gemma4.attention.sliding_window_pattern", "gemma4.attention.key_length_swa"])
def test_missing_key(tmp_path: Path, key: str) -> None:
    p = write_gemma4(tmp_path / "t.gguf", opts=TargetOpts(edits=Edits(drop_keys=(key,))))
    with pytest.raises(GGUFError, match=key):
        load_model(open_gguf(p))


# -- speculative decoding with the assistant: exact, and the drafter keeps level -----------------------------------


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculation_with_the_assistant_equals_plain(files: dict[str, Path], target, k: int) -> None:  # type: ignore[no-untyped-def]
    a = load_assistant(open_gguf(files["drafter"]), target.ops, target)
    prompt, n_new, params = TOKENS[:30], 24, SamplingParams()
    cache = target.make_cache(128)
    ids = np.array(prompt, np.int32)
    logits = target.forward(ids, np.arange(len(ids), dtype=np.int32), cache)
    plain, pos = [int(logits[0].argmax())], len(prompt)
    while len(plain) < n_new:
        logits = target.forward(np.array([plain[-1]], np.int32), np.array([pos], np.int32), cache)
        plain.append(int(logits[0].argmax()))
        pos += 1
    cache = target.make_cache(128)
    d = SpeculativeDecoder(target, cache, AssistantDrafter(a, cache), AlwaysDraft(), k)
    spec = list(d.generate(list(prompt), n_new, params, np.random.default_rng(0)))
    assert spec == plain
    assert d.stats.rounds > 0 and d.stats.drafted >= d.stats.accepted


# -- through the public API ----------------------------------------------------------------------------------------


def test_local_model_with_the_assistant_equals_plain(files: dict[str, Path]) -> None:
    from cuca import LocalModel, LocalModelConfig
    from cuca.speculative.source import DrafterSource

    plain = LocalModel.load_sync(LocalModelConfig(files["target"], threads=2, context_length=128))
    spec = LocalModel.load_sync(LocalModelConfig(files["target"], drafter=DrafterSource.file(files["drafter"]),
                                                 draft_tokens=3, threads=2, context_length=128))
    for prompt in ("hello world", "abc abc abc", "the cat sat on the mat."):
        a, b = plain.complete_sync(prompt, max_tokens=24), spec.complete_sync(prompt, max_tokens=24)
        assert a.tokens == b.tokens and a.text == b.text
    stats = spec.draft_stats()
    assert stats.rounds > 0 and stats.drafted >= stats.accepted
    # a drafter file given as the drafter of a drafter, or for a mismatched target, fails at load
    with pytest.raises(ProviderError, match="is a drafter"):
        LocalModel.load_sync(LocalModelConfig(files["drafter"]))


# -- the dense head's coarse ranking (gemma4_assistant.RESCORE) ------------------------------------------------------
def test_assistant_coarse_head(files: dict[str, Path], target, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A Q4_0 copy of the dense head ranks the vocabulary: sampled drafts get its logits; a greedy draft gets the
    head's own values on the copy's RESCORE best ids (every other id below them), so its arg-max is the head's
    even where the copy's is not. Off below COARSE_MIN_WEIGHTS (the tiny head), without requantizing, when asked,
    and where the backend says so."""
    f = open_gguf(files["drafter_f16"])
    assert load_assistant(f, target.ops, target).coarse_embd is None
    monkeypatch.setattr(layers, "COARSE_MIN_WEIGHTS", 0)
    a = load_assistant(f, target.ops, target)
    assert a.coarse_embd is not None and a.coarse_embd.wtype == Q.Q4_0
    assert (a.coarse_embd.n_out, a.coarse_embd.n_in) == (a.token_embd.n_out, a.token_embd.n_in)
    assert load_assistant(f, target.ops, target, requantize=False).coarse_embd is None
    assert load_assistant(f, target.ops, target, coarse=False).coarse_embd is None

    class NoCoarse(Ops):
        coarse_draft_heads = False

    assert load_assistant(f, NoCoarse(1), target).coarse_embd is None
    ops = target.ops
    zn = np.random.default_rng(5).standard_normal((64, a.c.n_embd)).astype(np.float32)
    dense, rough = ops.matmul(a.token_embd, zn), a.logits(ops, zn, greedy=False)
    assert np.array_equal(rough, ops.matmul(a.coarse_embd, zn)) and not np.array_equal(rough, dense)
    assert (rough.argmax(1) != dense.argmax(1)).sum() >= 3
    greedy = a.logits(ops, zn)
    assert np.array_equal(greedy.argmax(1), dense.argmax(1))
    for i in range(zn.shape[0]):
        ids = np.argsort(-rough[i], kind="stable")[: ga.RESCORE]
        assert np.array_equal(greedy[i, ids], dense[i, ids]) and (np.delete(greedy[i], ids) < dense[i, ids].min()).all()


@pytest.mark.parametrize("k", [1, 3])
def test_assistant_coarse_drafts_equal_the_dense_ones(files: dict[str, Path], monkeypatch, k: int) -> None:
    """Speculation with the coarse-ranked drafter equals plain decoding, with the dense drafter's acceptance."""
    monkeypatch.setattr(layers, "COARSE_MIN_WEIGHTS", 0)
    tgt = load_model(open_gguf(files["target"]), Ops(2))
    stats = []
    for coarse in (True, False):
        a = load_assistant(open_gguf(files["drafter_f16"]), tgt.ops, tgt, coarse=coarse)
        assert (a.coarse_embd is not None) == coarse
        pair = (tgt, lambda eng, a=a: AssistantDrafter(a, eng.cache))
        for prompt in ([2, 10, 11, 12, 13, 14, 10, 11, 12], [2, 7, 9, 7, 9, 7, 9, 7]):
            want, peng, _ = plain(tgt, prompt, 16, 96)
            got, seng, _, st = run_spec(pair, prompt, 16, k, 96, frozenset())
            assert got == want and same_cache(peng, seng)
            stats.append((st.drafted, st.accepted))
    assert stats[:2] == stats[2:] and sum(d for d, _ in stats) > 0
