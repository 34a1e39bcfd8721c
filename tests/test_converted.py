"""Files written by llama.cpp's own converter (convert_hf_to_gguf.py of the llama-cpp-python sdist), from tiny random
Hugging Face checkpoints, against transformers on the same checkpoints: tests/fixtures/converted/, made by
tools/make_converted_fixtures.py (see there what is the converter's and what is not).

Bounds per dtype are the measured figures rounded up: the F16 / BF16 / Q8_0 files round the weights transformers ran
in F32, so they sit further away by the rounding alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from cuca.cli import file_info
from cuca.engine import Engine, Generation
from cuca.errors import ProviderError
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.gemma4_assistant import load_assistant
from cuca.models.layers import Ops
from cuca.sampling import SamplingParams, to_probs
from cuca.speculative import AlwaysDraft, SpeculativeDecoder
from cuca.speculative.drafters.assistant import AssistantDrafter
from cuca.speculative.drafters.load import load_drafter
from cuca.speculative.drafters.mtp import MTPDrafter
from cuca.speculative.source import DrafterSource

DIR = Path(__file__).parent / "fixtures" / "converted"
HF = np.load(DIR / "converted_hf.npz")
DTYPES = ["f32", "f16", "bf16", "q8_0"]
N_PROMPT = 24
DRAFT_AT = int(HF["draft_at"])
G_TOKENS = [int(t) for t in HF["gemma4_tokens"]]
# largest relative logit error vs transformers (F32 weights), measured -> bound
GEMMA4_BOUND = {"f32": 1e-4, "f16": 5e-3, "bf16": 3e-2, "q8_0": 1.5e-1}
QWEN35_BOUND = {"f32": 1e-4, "f16": 3e-2, "bf16": 1.5e-1, "q8_0": 3e-1}
ASSISTANT_BOUND = {"f32": 1e-4, "f16": 5e-3, "bf16": 3e-2, "q8_0": 1e-1}
GREEDY = SamplingParams()


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b| of a row over that row's largest |b|."""
    return float((np.abs(a - b).max(axis=-1) / np.abs(b).max(axis=-1)).max())


def path(name: str) -> Path:
    return DIR / f"{name}.gguf"


_models: dict[str, Any] = {}


def model(name: str) -> Any:
    if name not in _models:
        _models[name] = load_model(open_gguf(path(name)), Ops(2))
    return _models[name]


def prefill_then_decode(m: Any, tokens: list[int]) -> np.ndarray:
    cache = m.make_cache(128)
    rows = [m.forward(np.array(tokens[:N_PROMPT], np.int32), np.arange(N_PROMPT, dtype=np.int32), cache, "all")]
    for i in range(N_PROMPT, len(tokens)):
        rows.append(m.forward(np.array([tokens[i]], np.int32), np.array([i], np.int32), cache, "all"))
    return np.concatenate(rows)


# -- targets against transformers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
def test_gemma4_target_matches_transformers(dt: str) -> None:
    logits = prefill_then_decode(model(f"gemma4-{dt}"), G_TOKENS)
    assert rel_err(logits, HF["gemma4_logits"]) < GEMMA4_BOUND[dt]
    # measured: f32 1.9e-6, f16 1.8e-3, bf16 1.4e-2, q8_0 7.9e-2; the greedy continuation is transformers' in all
    assert [int(t) for t in logits[N_PROMPT - 1 : -1].argmax(1)] == G_TOKENS[N_PROMPT:]


@pytest.mark.parametrize("name", ["qwen35-f32", "qwen35-f16", "qwen35-bf16", "qwen35-q8_0", "qwen35g-f32",
                                  "qwen35-nomtp-f32"])
def test_qwen35_trunk_matches_transformers(name: str) -> None:
    """qwen35g: 2 DeltaNet key heads shared by 4 value heads, in the converter's tiled V-head order."""
    tag = name.split("-")[0]
    tokens = [int(t) for t in HF[f"{tag}_tokens"]]
    logits = prefill_then_decode(model(name), tokens)
    assert rel_err(logits, HF[f"{tag}_logits"]) < QWEN35_BOUND[name.split("-")[-1]]
    # measured: f32 4.2e-6, f16 4.0e-3, bf16 6.7e-2, q8_0 1.9e-1 (random weights rounded), qwen35g f32 3.7e-6
    if name.endswith("f32"):
        assert [int(t) for t in logits[N_PROMPT - 1 : -1].argmax(1)] == tokens[N_PROMPT:]


# -- the assistant, dense and centroid head --------------------------------------------------------------------------


def chain(dt: str, centroids: bool) -> tuple[list[np.ndarray], list[np.ndarray], Any]:
    target = model(f"gemma4-{dt}")
    a = load_assistant(open_gguf(path(f"assistant{'-centroids' if centroids else ''}-{dt}")), target.ops, target,
                       requantize=False)
    cache = target.make_cache(128)
    h = target.forward_hidden(np.array(G_TOKENS[:DRAFT_AT], np.int32), np.arange(DRAFT_AT, dtype=np.int32), cache)
    tok, hh, logits, hs = G_TOKENS[DRAFT_AT], h[-1:], [], []
    for _ in range(3):
        lg, hh = a.step(np.array([tok], np.int32), hh, DRAFT_AT, cache)
        logits.append(lg[0])
        hs.append(hh[0])
        tok = int(lg[0].argmax())
    return logits, hs, a


@pytest.mark.parametrize("dt", DTYPES)
def test_dense_assistant_matches_transformers(dt: str) -> None:
    """The converter's assistant file (no centroid tensors): the full tied head, as transformers computes it."""
    logits, hs, a = chain(dt, centroids=False)
    assert a.centroid_head is None
    for i in range(3):
        assert rel_err(logits[i], HF["assistant_dense_logits"][i]) < ASSISTANT_BOUND[dt]
        assert rel_err(hs[i], HF["assistant_dense_h"][i]) < ASSISTANT_BOUND[dt]
        assert int(logits[i].argmax()) == int(HF["assistant_dense_tokens"][i])


@pytest.mark.parametrize("dt", DTYPES)
def test_centroid_head_matches_transformers_masked_drafter(dt: str) -> None:
    """Greedy drafts identical at every dtype; the selected ids are HF's and, at F32, their logits within 1e-4
    (measured 6e-7), the rest filled with min(selected) - 1 as HF does, so q is HF's distribution."""
    logits, hs, a = chain(dt, centroids=True)
    assert a.centroid_head is not None and a.centroid_head.top_k == int(HF["centroids_top_k"])
    for i in range(3):
        ref, got = HF["assistant_masked_logits"][i], logits[i]
        assert int(got.argmax()) == int(HF["assistant_masked_tokens"][i])
        sel = ref > ref.min()
        assert sel.sum() == 32 * 512 // int(HF["centroids_count"])
        if dt == "q8_0" and i == 0:
            continue  # Q8_0 centroid scores tie-break one centroid differently at this step (drafts still equal)
        assert np.array_equal(got > got.min(), sel)
        err = float(np.abs(got[sel] - ref[sel]).max() / np.abs(ref[sel]).max())
        assert err < ASSISTANT_BOUND[dt]
        if dt == "f32":
            assert got.min() == pytest.approx(float(ref.min()), abs=1e-4)
            params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)
            assert np.abs(to_probs(got, params) - to_probs(ref, params)).max() < 1e-6


def test_centroid_logits_equal_the_dense_head_on_the_selected_ids() -> None:
    """Same file with and without the centroid tensors: on the selected ids the logits are the dense head's, bit
    for bit (one kernel on the same rows), and the fill sits one below the smallest of them."""
    dense, _, _ = chain("q8_0", centroids=False)
    masked, _, _ = chain("q8_0", centroids=True)
    sel = masked[0] > masked[0].min()
    assert np.array_equal(masked[0][sel], dense[0][sel])
    assert masked[0].min() == masked[0][sel].min() - 1


# -- greedy speculation equals plain decoding ------------------------------------------------------------------------

PROMPTS = [[2, 10, 11, 12, 13, 14, 10, 11, 12], [2, 300, 301, 7, 9, 7, 9], [2, 120, 1, 120, 1, 120, 1]]


def run(m: Any, prompt: list[int], drafter: Any = None) -> list[int]:
    eng = Engine(m, 96)
    s = None
    if drafter is not None:
        s = SpeculativeDecoder(eng.model, eng.cache, drafter(eng), AlwaysDraft(), 4)
    out = list(eng.stream(prompt, 16, GREEDY, frozenset(), Generation(), s))
    if s is not None:
        assert s.stats.drafted > 0
    return out


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("centroids", [False, True])
def test_greedy_with_converted_assistant_equals_plain(dt: str, centroids: bool) -> None:
    target = model(f"gemma4-{dt}")
    a = load_assistant(open_gguf(path(f"assistant{'-centroids' if centroids else ''}-{dt}")), target.ops, target)
    for prompt in PROMPTS:
        assert run(target, prompt, lambda eng: AssistantDrafter(a, eng.cache)) == run(target, prompt)


@pytest.mark.parametrize("dt", DTYPES)
def test_greedy_with_converted_qwen35_mtp_head_equals_plain(dt: str) -> None:
    target = model(f"qwen35-{dt}")
    assert target.mtp is not None
    for prompt in ([320, 5, 6, 7, 5, 6, 7], [320, 100, 200, 100, 200]):
        assert run(target, prompt, lambda eng: MTPDrafter(target, eng.cache.n_ctx)) == run(target, prompt)


# -- other dialects, head-less files, sidecars -----------------------------------------------------------------------


def test_no_mtp_file_with_in_trunk_says_it_has_no_head() -> None:
    target = model("qwen35-nomtp-f32")
    with pytest.raises(ProviderError, match="has no prediction head"):
        load_drafter(DrafterSource.IN_TRUNK, target, target.make_cache(64), target.ops,
                     target_path=path("qwen35-nomtp-f32"))


def test_mtp_sidecar_is_refused_naming_what_to_use() -> None:
    with pytest.raises(ProviderError, match="MTP sidecar .* drafter in-trunk"):
        load_model(open_gguf(path("mtp-qwen35-f32")))
    target = model("qwen35-f32")
    with pytest.raises(ProviderError, match="MTP sidecar"):
        load_drafter(DrafterSource.file(path("mtp-qwen35-f32")), target, target.make_cache(64), target.ops)


def foreign(tmp: Path, arch: str, tensors: list[str]) -> Path:
    w = gguf.GGUFWriter(str(tmp / f"{arch}.gguf"), arch)
    w.add_block_count(1)
    for name in tensors:
        w.add_tensor(name, np.ones((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp / f"{arch}.gguf"


@pytest.mark.parametrize(("arch", "tensors", "says"), [
    ("gemma4_assistant", ["mtp.pre_projection.weight", "mtp.layers.0.q_proj.weight"], "older fork dialect"),
    ("gemma4_mtp", ["blk.0.attn_q.weight"], "ik_llama.cpp's dialect"),
])
def test_foreign_assistant_dialects_are_named(tmp_path: Path, arch: str, tensors: list[str], says: str) -> None:
    p = foreign(tmp_path, arch, tensors)
    target = model("gemma4-f32")
    for load in (lambda: load_model(open_gguf(p)),
                 lambda: load_drafter(DrafterSource.file(p), target, target.make_cache(64), target.ops)):
        with pytest.raises(ProviderError, match=f"{says}.*'gemma4-assistant'"):
            load()


# -- cuca info --------------------------------------------------------------------------------------------------------


def test_info_describes_converted_files() -> None:
    t = file_info(path("gemma4-q8_0"))
    assert (t["architecture"], t["block_count"], t["embedding_length"]) == ("gemma4", 6, 64)
    assert "Q8_0" in t["tensors_by_type"] and not t["has_prediction_head"]
    a = file_info(path("assistant-centroids-bf16"))
    assert a["architecture"] == "gemma4-assistant" and "centroid head (64 centroids, top 32)" in a["prediction_head"]
    assert "full tied head" in file_info(path("assistant-bf16"))["prediction_head"]
    q = file_info(path("qwen35-f16"))
    assert q["has_prediction_head"] and "1 nextn layer" in q["prediction_head"]
    assert not file_info(path("qwen35-nomtp-f32"))["has_prediction_head"]
    side = file_info(path("mtp-qwen35-f32"))  # a head cuca cannot pair with its trunk is not a usable head
    assert "not usable" in side["prediction_head"] and "sidecar" in side["prediction_head"]
    assert not side["has_prediction_head"]
