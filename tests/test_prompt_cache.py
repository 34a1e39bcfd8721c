"""The prompt cache: a request that shares a prefix with the previous one keeps those rows and prefills the rest,
with output bit for bit equal to a cold run: K/V models (any prefix, plain and drafting), the Qwen 3.5 hybrid
(the live state or the previous prompt's checkpoint, only where a cold prefill reaches the same state), the MTP
and prompt-lookup drafters resumed on the kept rows, and LocalModel's multi-turn chat."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from synth import write_tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import synth_qwen35 as S  # noqa: E402
from helpers import GREEDY  # noqa: E402

from cuca import LocalModel, LocalModelConfig  # noqa: E402
from cuca.engine import Engine, Generation  # noqa: E402
from cuca.gguf import open_gguf  # noqa: E402
from cuca.models import load_model  # noqa: E402
from cuca.models.layers import Ops  # noqa: E402
from cuca.prompt_cache import recurrent_exact  # noqa: E402
from cuca.speculative import AlwaysDraft, SpeculativeDecoder  # noqa: E402
from cuca.speculative.drafters.mtp import MTPDrafter  # noqa: E402
from cuca.speculative.drafters.prompt_lookup import PromptLookupDrafter  # noqa: E402


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory):
    """The tiny hybrid with an MTP head that repeats its input token (as in test_qwen35): some drafts accepted."""
    s, t = S.TINY, S.weights(S.TINY, 0)
    p = f"blk.{s.n_layer}."
    t[p + "nextn.eh_proj.weight"] = np.concatenate([np.eye(s.n_embd), np.zeros((s.n_embd, s.n_embd))], 1)
    t[p + "attn_output.weight"] = np.zeros_like(t[p + "attn_output.weight"])
    t[p + "ffn_down.weight"] = np.zeros_like(t[p + "ffn_down.weight"])
    path = S.write(tmp_path_factory.mktemp("pc") / "qwen35-copy.gguf", s, edits=S.Edits(tensors=t))
    return load_model(open_gguf(path), Ops(1))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("pc") / "tiny.gguf", arch="gemma3")


def _run(eng: Engine, prompt: list[int], n: int, drafter: object = None) -> Generation:
    gen = Generation()
    spec = SpeculativeDecoder(eng.model, eng.cache, drafter, AlwaysDraft(), 3) if drafter is not None else None
    for _ in eng.stream(prompt, n, GREEDY, frozenset(), gen, spec):  # type: ignore[arg-type]
        pass
    gen.draft = spec.stats if spec is not None else None
    return gen


def _cold(model: object, prompt: list[int], n: int, mtp: bool = False) -> list[int]:
    eng = Engine(model, 160)  # type: ignore[arg-type]
    return _run(eng, prompt, n, MTPDrafter(model, eng.n_ctx) if mtp else None).tokens


def _turns(first: list[int]) -> list[list[int]]:
    """Three prompts, each the previous prompt, its reply's tokens (filled in by the caller) and a new turn."""
    return [first, [7, 8, 9, 10], [11, 12]]


@pytest.mark.parametrize("mtp", [False, True], ids=["plain", "mtp"])
def test_hybrid_turns_equal_cold_and_reuse_rows(qwen: object, mtp: bool) -> None:
    eng = Engine(qwen, 160, prompt_cache=True)  # type: ignore[arg-type]
    drafter = MTPDrafter(qwen, eng.n_ctx) if mtp else None
    prompt: list[int] = []
    cached = []
    for turn in _turns([1, 5, 9, 3, 14, 2, 6]):
        prompt = prompt + turn
        gen = _run(eng, prompt, 6, drafter)
        assert gen.tokens == _cold(qwen, prompt, 6, mtp)
        cached.append(gen.timings.n_cached)
        prompt = prompt + gen.tokens  # the next prompt extends everything this request fed (and its last token)
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    assert cached[2] == len(prompt) - 6 - 2 - 1  # everything the previous request fed


def test_hybrid_checkpoint_when_the_reply_is_not_reused(qwen: object) -> None:
    eng = Engine(qwen, 160, prompt_cache=True)  # type: ignore[arg-type]
    p1 = [3, 1, 4, 1, 5, 9, 2, 6]
    _run(eng, p1, 5)
    p2 = p1 + [30, 31, 32]  # extends the previous prompt, not its reply: the checkpoint at its end serves
    gen = _run(eng, p2, 5)
    assert gen.timings.n_cached == len(p1) and gen.tokens == _cold(qwen, p2, 5)
    p3 = p1[:5] + [40, 41]  # shares a prefix but extends neither state: cold
    gen = _run(eng, p3, 5)
    assert gen.timings.n_cached == 0 and gen.tokens == _cold(qwen, p3, 5)


def test_hybrid_long_prompt_resumes_on_the_cpu(qwen: object) -> None:
    """The CPU prefills the DeltaNet layers row by row at any length (Ops.deltanet_chunk_min None): a 100-token prompt
    leaves a checkpoint a cold prefill of its extension reaches too, so the next request keeps all 100 rows."""
    assert qwen.chunked_prefill_min is None  # type: ignore[attr-defined]
    eng = Engine(qwen, 160, prompt_cache=True)  # type: ignore[arg-type]
    p1 = [int(t) for t in np.random.default_rng(3).integers(1, 300, 100)]
    _run(eng, p1, 4)
    p2 = p1 + [20, 21, 22]
    gen = _run(eng, p2, 4)
    assert gen.timings.n_cached == len(p1) and gen.tokens == _cold(qwen, p2, 4)


def test_hybrid_chunked_prefill_falls_back_to_cold(qwen: object) -> None:
    """Batches of chunked_prefill_min rows or more take the chunked form, whose rounding depends on where the batch
    starts: resuming inside such a chunk would not be exact, so the request starts cold (and still agrees)."""
    qwen.chunked_prefill_min = 6  # type: ignore[attr-defined]
    try:
        eng = Engine(qwen, 160, prompt_cache=True)  # type: ignore[arg-type]
        p1 = [2, 7, 1, 8, 2, 8, 1, 8]
        _run(eng, p1, 4)
        p2 = p1 + [20, 21, 22]
        gen = _run(eng, p2, 4)
        assert gen.timings.n_cached == 0 and gen.tokens == _cold(qwen, p2, 4)
    finally:
        del qwen.chunked_prefill_min  # type: ignore[attr-defined]


def test_recurrent_exact_rule() -> None:
    spans = (256, 65)
    assert recurrent_exact(40, 40, 60, spans)  # one short chunk, row by row in both runs
    assert not recurrent_exact(40, 40, 100, spans)  # the cold chunk 0..100 is chunked
    assert recurrent_exact(256, 300, 900, spans)  # a chunk boundary inside the previous prompt
    assert not recurrent_exact(256, 200, 900, spans)  # ... reached by decoding: the cold run chunks it
    assert recurrent_exact(300, 280, 310, spans) and not recurrent_exact(300, 280, 400, spans)
    assert recurrent_exact(10, 10, 12, (256, None))  # no batch takes the chunked form: row by row in both runs


def test_kv_prefix_reuse_with_prompt_lookup(tiny: Path) -> None:
    model = load_model(open_gguf(tiny), Ops(1))
    eng = Engine(model, 128, prompt_cache=True)
    drafter = PromptLookupDrafter(2)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    ga = _run(eng, a, 8, drafter)
    b = a[:6] + [9, 9, 1, 2]  # a shorter common prefix: K/V rows are kept up to it
    gb = _run(eng, b, 8, drafter)
    assert gb.timings.n_cached == 6 and gb.timings.n_prefilled == len(b) - 6
    for p, g in ((a, ga), (b, gb)):
        fresh = Engine(model, 128)
        assert g.tokens == _run(fresh, p, 8, PromptLookupDrafter(2)).tokens
    same = _run(eng, b, 8, drafter)  # the same prompt again: all but its last row kept
    assert same.timings.n_cached == len(b) - 1 and same.tokens == gb.tokens


def test_local_model_chat_turns_equal_cold(tiny: Path) -> None:
    warm = LocalModel.load_sync(LocalModelConfig(tiny, threads=1, drafter="prompt-lookup"))
    cold = LocalModel.load_sync(LocalModelConfig(tiny, threads=1, drafter="prompt-lookup", prompt_cache=False))
    history: list[dict[str, str]] = []
    cached = []
    for msg in ("hello there", "and then", "once more"):
        history.append({"role": "user", "content": msg})
        r = warm.chat_sync(history, max_tokens=10)
        c = cold.chat_sync(history, max_tokens=10)
        assert (r.text, r.tokens) == (c.text, c.tokens) and c.timings.n_cached == 0
        cached.append(r.timings.n_cached)
        history.append({"role": "assistant", "content": r.text})
    assert cached[0] == 0 and cached[1] > 0 and cached[2] > cached[1]


def test_hybrid_resumes_at_a_full_prefill_chunk(qwen: object) -> None:
    """A prompt that shares 280 tokens with the previous 300-token one but extends neither its reply nor its end
    resumes from the state after the first full 256-row prefill chunk: a cold prefill reaches that same state."""
    rng = np.random.default_rng(7)
    p1 = [int(t) for t in rng.integers(1, 200, 300)]
    eng = Engine(qwen, 700, prompt_cache=True)  # type: ignore[arg-type]
    _run(eng, p1, 3)
    p2 = p1[:280] + [5, 6, 7, 8]
    gen = _run(eng, p2, 4)
    cold = Engine(qwen, 700)  # type: ignore[arg-type]
    assert gen.timings.n_cached == 256 and gen.tokens == _run(cold, p2, 4).tokens


def _drafter_pairs(tmp: Path) -> list[tuple[object, object]]:
    """(target, make(engine) -> drafter): gemma4 with its assistant (reads the target's K/V), a llama3 target with
    a draft model of its own (own K/V cache)."""
    from synth_gemma4 import write_gemma4, write_gemma4_assistant

    from cuca.models.gemma4_assistant import load_assistant
    from cuca.speculative.drafters.assistant import AssistantDrafter
    from cuca.speculative.drafters.draft_model import DraftModelDrafter

    g4 = load_model(open_gguf(write_gemma4(tmp / "g4.gguf")), Ops(1))
    a = load_assistant(open_gguf(write_gemma4_assistant(tmp / "a.gguf")), g4.ops, g4)
    conv = Path(__file__).parent / "fixtures" / "converted"
    l3, d3 = (load_model(open_gguf(conv / f"{n}.gguf"), Ops(1)) for n in ("llama3-f32", "llama3-q8_0"))
    return [(g4, lambda eng: AssistantDrafter(a, eng.cache)),
            (l3, lambda eng: DraftModelDrafter(d3, eng.cache.n_ctx, l3.n_vocab))]


def test_assistant_and_draft_model_resume_equal_cold(tmp_path: Path) -> None:
    for target, make in _drafter_pairs(tmp_path):
        eng = Engine(target, 160, prompt_cache=True)  # type: ignore[arg-type]
        drafter = make(eng)  # type: ignore[operator]
        prompt = [251, 78, 32, 89, 124, 244, 135, 27]
        cached = []
        for turn in ([], [100, 180, 243], [18, 77]):
            prompt = prompt + turn
            gen = _run(eng, prompt, 8, drafter)
            fresh = Engine(target, 160)  # type: ignore[arg-type]
            assert gen.tokens == _run(fresh, prompt, 8, make(fresh)).tokens  # type: ignore[operator]
            assert gen.draft is not None and gen.draft.rounds > 0
            cached.append(gen.timings.n_cached)
            prompt = prompt + gen.tokens
        assert cached[0] == 0 and all(c > 0 for c in cached[1:])
