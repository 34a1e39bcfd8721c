"""The product page's verification test for the target/drafter pairs: load the target alone and with its drafter,
generate greedily, and the tokens (and caches) are identical. Synthetic files in the real layouts.

Pairs: Gemma 4 + gemma4-assistant (drafter file), Qwen 3.5 + its in-trunk MTP head (hybrid: DeltaNet state
restored from per-token snapshots, at most 16 drafts per verification). Each pair gives a target and a function that
binds its drafter to an engine's cache.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from synth_gemma4 import write_gemma4, write_gemma4_assistant

from cuca.engine import Engine, Generation, Speculation
from cuca.errors import ContextLengthError
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.gemma4_assistant import load_assistant
from cuca.models.layers import Ops
from cuca.sampling import SamplingParams
from cuca.speculative.drafters.assistant import AssistantDrafter
from cuca.speculative.drafters.mtp import MTPDrafter
from cuca.speculative.governor import AlwaysDraft
from cuca.speculative.proposal import Proposal
from cuca.speculative.stats import RequestDraftStats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import synth_qwen35  # noqa: E402

GREEDY = SamplingParams()
PROMPTS = [
    [2, 10, 11, 12, 13, 14, 10, 11, 12],
    [2, 20, 21, 22, 23, 24, 25],
    [2, 0, 1, 2, 0, 1, 2, 0],
    [2, 7, 9, 7, 9, 7, 9, 7, 9, 7, 9, 7],
    [2, 300],
    [2, 299, 298, 297, 296, 295, 294, 293, 292, 291, 290, 289, 288, 287, 286, 285, 284, 283],
    [2, 120, 1, 120, 1, 120],
    [2, 70, 80, 90, 100, 110, 120, 130],
]


class Scripted:
    """Runs the real drafter (so its state is exercised) but proposes a script: the target's own continuation
    (every draft accepted) or that continuation shifted by one id (none accepted)."""

    def __init__(self, inner: Any, future: list[int], prompt_len: int, wrong: bool = False):
        self.inner, self.future, self.prompt_len, self.wrong = inner, future, prompt_len, wrong
        self.uses_hidden = inner.uses_hidden

    def begin(self, prompt: list[int], params: SamplingParams, rng: np.random.Generator) -> None:
        self.inner.begin(prompt, params, rng)

    def observe(self, hidden: np.ndarray, positions: np.ndarray, next_tokens: list[int]) -> None:
        self.inner.observe(hidden, positions, next_tokens)

    def propose(self, history: list[int], n: int) -> Proposal:
        real = self.inner.propose(history, n)
        k = len(history) - self.prompt_len
        toks = self.future[k : k + len(real.tokens)]
        return Proposal([(t + 1) % 256 for t in toks] if self.wrong else toks, None)


Pair = tuple[Any, Callable[[Engine], Any]]


@pytest.fixture(scope="module", params=["gemma4", "qwen35"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    d = tmp_path_factory.mktemp(request.param)
    if request.param == "qwen35":
        target = load_model(open_gguf(synth_qwen35.write(d / "q.gguf")), Ops(2))
        return target, lambda eng: MTPDrafter(target, eng.cache.n_ctx, draft_vocab=synth_qwen35.DRAFT_VOCAB_TINY)
    target = load_model(open_gguf(write_gemma4(d / "t.gguf")), Ops(2))
    assistant = load_assistant(open_gguf(write_gemma4_assistant(d / "a.gguf")), target.ops, target)
    return target, lambda eng: AssistantDrafter(assistant, eng.cache)


def plain(model: Any, prompt: list[int], max_tokens: int, n_ctx: int = 96, stop: frozenset[int] = frozenset()):  # type: ignore[no-untyped-def]
    eng = Engine(model, n_ctx)
    gen = Generation()
    return list(eng.stream(prompt, max_tokens, GREEDY, stop, gen)), eng, gen


def spec(pair: Pair, prompt: list[int], max_tokens: int, k: int, n_ctx: int = 96, stop: frozenset[int] = frozenset(),
         script: tuple[list[int], bool] | None = None):  # type: ignore[no-untyped-def]
    model, make = pair
    eng = Engine(model, n_ctx)
    drafter = make(eng)
    if script is not None:
        drafter = Scripted(drafter, script[0], len(prompt) + 1, script[1])
    gen = Generation()
    s = Speculation(drafter, k, AlwaysDraft(), RequestDraftStats(), getattr(model, "rollback_limit", None))  # type: ignore[arg-type]
    return list(eng.stream(prompt, max_tokens, GREEDY, stop, gen, s)), eng, gen, s.stats


def same_cache(a: Engine, b: Engine) -> bool:
    """K/V of every cached position and (hybrid) the conv and recurrent states, bit for bit."""
    ca, cb = a.cache, b.cache
    n = ca.n
    kva, kvb = getattr(ca, "kv", ca), getattr(cb, "kv", cb)
    sa = getattr(ca, "conv", []) + getattr(ca, "ssm", [])
    states = list(zip(sa, getattr(cb, "conv", []) + getattr(cb, "ssm", []), strict=True))
    return n == cb.n and all(
        np.array_equal(x[:, :n], y[:, :n]) for x, y in zip(kva.k + kva.v, kvb.k + kvb.v, strict=True)
    ) and all(np.array_equal(x, y) for x, y in states)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6, 8, 16])
def test_greedy_with_drafter_equals_plain(pair: Pair, k: int) -> None:
    drafted = 0
    for prompt in PROMPTS:
        want, peng, pgen = plain(pair[0], prompt, 20)
        got, seng, sgen, stats = spec(pair, prompt, 20, k)
        assert got == want and len(got) == len(want) and sgen.finish_reason == pgen.finish_reason
        assert same_cache(peng, seng)
        drafted += stats.drafted
    assert drafted > 0


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 9])
def test_max_tokens_edges(pair: Pair, max_tokens: int) -> None:
    """1, 2, one less than a round (k = 3 emits up to 4), a round, one more, two rounds + 1."""
    prompt = PROMPTS[0]
    want, _, _ = plain(pair[0], prompt, max_tokens)
    future, _, _ = plain(pair[0], prompt, 20)
    got, _, gen, stats = spec(pair, prompt, max_tokens, 3, script=(future[1:], False))
    assert got == want and gen.finish_reason == "length"
    assert stats.drafted <= max(0, max_tokens - 1) and stats.accepted == stats.drafted


def test_context_limit(pair: Pair) -> None:
    """A prompt that ends one token before the context limit, and drafts that would run past it."""
    n_ctx = 32
    prompt = (PROMPTS[5] * 2)[: n_ctx - 1]
    want, _, _ = plain(pair[0], prompt, 1, n_ctx)
    got, _, _, _ = spec(pair, prompt, 1, 4, n_ctx)
    assert got == want
    prompt = prompt[:20]
    want, peng, _ = plain(pair[0], prompt, n_ctx - 20, n_ctx)
    got, seng, _, _ = spec(pair, prompt, n_ctx - 20, 8, n_ctx, script=(want[1:], False))
    assert got == want and same_cache(peng, seng)
    with pytest.raises(ContextLengthError):
        spec(pair, prompt, n_ctx - 19, 3, n_ctx)


@pytest.mark.parametrize("k", [1, 3, 8, 16])
def test_oracle_accepts_everything_and_wrong_drafter_nothing(pair: Pair, k: int) -> None:
    prompt = PROMPTS[3]
    want, peng, _ = plain(pair[0], prompt, 30)
    got, seng, _, stats = spec(pair, prompt, 30, k, script=(want[1:], False))
    assert got == want and same_cache(peng, seng)
    assert stats.drafted > 0 and stats.accepted == stats.drafted
    rounds, rem = 0, 29  # every round drafts min(k, remaining - 1) and emits drafts + 1
    while rem > 0:
        n = min(k, rem - 1)
        rounds += n > 0
        rem -= n + 1
    assert stats.rounds == rounds
    assert stats.accepted_per_position[:k] == stats.drafted_per_position[:k]
    got, seng, _, stats = spec(pair, prompt, 30, k, script=(want[1:], True))
    assert got == want and same_cache(peng, seng)
    assert stats.drafted > 0 and stats.accepted == 0 and stats.rounds == 28  # the last token has no room to draft


def test_stop_token_inside_accepted_drafts(pair: Pair) -> None:
    prompt = PROMPTS[1]
    future, _, _ = plain(pair[0], prompt, 30)
    i = next(i for i in range(4, 30) if future[i] not in future[:i])  # a token the reply first emits at i
    stop = frozenset({future[i]})
    want, peng, pgen = plain(pair[0], prompt, 30, stop=stop)
    got, seng, sgen, stats = spec(pair, prompt, 30, 8, stop=stop, script=(future[1:], False))
    assert got == want == future[: i + 1] and sgen.finish_reason == pgen.finish_reason == "stop"
    assert stats.accepted > len(got) - 1  # the stop token arrived inside a round's accepted drafts


def test_local_model_in_trunk_equals_plain(tmp_path: Path) -> None:
    """Through the public API: DrafterSource.IN_TRUNK on a qwen35 file with its head; a head-less file says so."""
    from cuca import DrafterSource, LocalModel, LocalModelConfig, ProviderError

    path = synth_qwen35.write(tmp_path / "q.gguf")
    plain_model = LocalModel.load_sync(LocalModelConfig(path, threads=2, context_length=96))
    spec_model = LocalModel.load_sync(LocalModelConfig(path, drafter=DrafterSource.IN_TRUNK, draft_tokens=4,
                                                       threads=2, context_length=96))
    for prompt in ("hello world", "abc abc abc abc"):
        a, b = plain_model.complete_sync(prompt, max_tokens=16), spec_model.complete_sync(prompt, max_tokens=16)
        assert a.tokens == b.tokens
    assert spec_model.draft_stats().rounds > 0
    bare = synth_qwen35.write(tmp_path / "bare.gguf", mtp=False)
    with pytest.raises(ProviderError, match="has no prediction head"):
        LocalModel.load_sync(LocalModelConfig(bare, drafter="in-trunk"))


def test_hybrid_target_never_drafts_past_its_rollback_limit(pair: Pair) -> None:
    """draft_tokens 20: a hybrid target (rollback_limit 16) gets at most 16 drafts per verification call."""
    limit = getattr(pair[0], "rollback_limit", None)
    prompt = PROMPTS[3]
    want, peng, _ = plain(pair[0], prompt, 40)
    got, seng, _, stats = spec(pair, prompt, 40, 20, script=(want[1:], False))
    assert got == want and same_cache(peng, seng)
    assert len(stats.drafted_per_position) == (limit if limit is not None else 20)
