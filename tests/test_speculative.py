"""Speculative rounds reproduce plain greedy decoding bit for bit (tokens, counts and cache contents), whatever the
drafter proposes; acceptance statistics match what the drafter deserved."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synth import write_tiny

from cuca.engine import Engine, Generation, Speculation
from cuca.errors import ContextLengthError
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.layers import Ops
from cuca.sampling import SamplingParams
from cuca.speculative.drafters.prompt_lookup import PromptLookupDrafter
from cuca.speculative.governor import AlwaysDraft
from cuca.speculative.proposal import Proposal
from cuca.speculative.stats import RequestDraftStats

GREEDY = SamplingParams()
# prompts with repeats so that prompt lookup finds matches, and without
PROMPTS = [
    [2, 40, 41, 42, 43, 40, 41, 42, 43, 40, 41],
    [2, 100, 101, 102, 103, 104, 105, 100, 101],
    [2, 7, 7, 7, 7, 7, 7],
    [2, 300, 5, 17, 260, 99, 1, 150],
    [2, 55, 66, 77, 55, 66, 88, 55, 66],
    [2, 9, 8, 7, 6, 5, 4, 3, 9, 8, 7],
    [2, 200, 201, 200, 201, 200, 201],
    [2, 123],
]


class ScriptDrafter:
    """Proposes from a fixed continuation: the target's own future tokens (oracle) or shifted ones (always wrong)."""

    def __init__(self, future: list[int], prompt_len: int, wrong: bool = False):
        self.future, self.prompt_len, self.wrong = future, prompt_len, wrong

    uses_hidden = False

    def begin(self, prompt: list[int], params: object = None, rng: object = None) -> None:
        pass

    def observe(self, hidden: object, positions: object, next_tokens: list[int]) -> None:
        pass

    def propose(self, history: list[int], n: int) -> Proposal:
        k = len(history) - self.prompt_len
        toks = self.future[k : k + n]
        if self.wrong:
            toks = [(t + 1) % 320 for t in toks]
        return Proposal(toks, None)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path: Path = write_tiny(tmp_path_factory.mktemp("m") / f"{request.param}.gguf", arch=request.param)
    return load_model(open_gguf(path), Ops(2))


def plain(model, prompt: list[int], max_tokens: int, n_ctx: int = 128, stop=frozenset()):  # type: ignore[no-untyped-def]
    eng = Engine(model, n_ctx)
    gen = Generation()
    toks = list(eng.stream(prompt, max_tokens, GREEDY, stop, gen))
    return toks, eng, gen


def spec(model, prompt, max_tokens, drafter, k, n_ctx=128, stop=frozenset()):  # type: ignore[no-untyped-def]
    eng = Engine(model, n_ctx)
    gen = Generation()
    s = Speculation(drafter, k, AlwaysDraft(), RequestDraftStats())  # type: ignore[arg-type]
    toks = list(eng.stream(prompt, max_tokens, GREEDY, stop, gen, s))
    return toks, eng, gen, s.stats


def same_cache(a: Engine, b: Engine) -> bool:
    n = a.cache.n
    return n == b.cache.n and all(
        np.array_equal(x[:, :n], y[:, :n]) for x, y in zip(a.cache.k + a.cache.v, b.cache.k + b.cache.v, strict=True)
    )


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8])
def test_prompt_lookup_greedy_equals_plain(model, k: int) -> None:  # type: ignore[no-untyped-def]
    drafted = 0
    for prompt in PROMPTS:
        want, peng, _ = plain(model, prompt, 40)
        got, seng, _, stats = spec(model, prompt, 40, PromptLookupDrafter(), k)
        assert got == want and len(got) == len(want)
        assert same_cache(peng, seng)
        drafted += stats.drafted
    assert drafted > 0  # the drafter did propose, so verification and rollback were exercised


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 9])
def test_max_tokens_edges(model, max_tokens: int) -> None:  # type: ignore[no-untyped-def]
    """1, 2, one less than a round (k = 3: a round emits up to 4), exactly a round, one more, two rounds + 1."""
    prompt = PROMPTS[0]
    want, _, _ = plain(model, prompt, max_tokens)
    future, _, _ = plain(model, prompt, 20)
    got, _, gen, stats = spec(model, prompt, max_tokens, ScriptDrafter(future[1:], len(prompt) + 1), 3)
    assert got == want and gen.finish_reason == "length"
    assert stats.drafted <= max(0, max_tokens - 1)


def test_context_limit(model) -> None:  # type: ignore[no-untyped-def]
    """A prompt that ends one token before the context limit, and drafts that would run past it."""
    n_ctx = 24
    prompt = (PROMPTS[0] * 3)[: n_ctx - 1]
    want, _, _ = plain(model, prompt, 1, n_ctx)
    got, _, _, _ = spec(model, prompt, 1, PromptLookupDrafter(), 4, n_ctx)
    assert got == want
    prompt = prompt[:16]
    want, _, _ = plain(model, prompt, n_ctx - 16, n_ctx)
    future, _, _ = plain(model, prompt, n_ctx - 16, n_ctx)
    got, _, _, _ = spec(model, prompt, n_ctx - 16, ScriptDrafter(future[1:], 17), 6, n_ctx)
    assert got == want
    with pytest.raises(ContextLengthError):
        spec(model, prompt, n_ctx - 15, PromptLookupDrafter(), 3, n_ctx)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_oracle_accepts_everything_and_wrong_drafter_nothing(model, k: int) -> None:  # type: ignore[no-untyped-def]
    prompt = PROMPTS[3]
    want, peng, _ = plain(model, prompt, 30)
    got, seng, _, stats = spec(model, prompt, 30, ScriptDrafter(want[1:], len(prompt) + 1), k)
    assert got == want and same_cache(peng, seng)
    assert stats.drafted > 0 and stats.accepted == stats.drafted
    rounds, rem = 0, 29  # every round drafts min(k, remaining - 1) and emits drafts + 1
    while rem > 0:
        n = min(k, rem - 1)
        rounds += n > 0
        rem -= n + 1
    assert stats.rounds == rounds
    got, seng, _, stats = spec(model, prompt, 30, ScriptDrafter(want[1:], len(prompt) + 1, wrong=True), k)
    assert got == want and same_cache(peng, seng)
    assert stats.drafted > 0 and stats.accepted == 0


def test_stop_token_inside_accepted_drafts(model) -> None:  # type: ignore[no-untyped-def]
    prompt = PROMPTS[3]
    future, _, _ = plain(model, prompt, 30)
    stop = frozenset({future[6]})
    want, _, pgen = plain(model, prompt, 30, stop=stop)
    got, _, sgen, _ = spec(model, prompt, 30, ScriptDrafter(future[1:], len(prompt) + 1), 8, stop=stop)
    assert got == want and got[-1] == future[6] and sgen.finish_reason == pgen.finish_reason == "stop"


def test_prompt_lookup_proposals() -> None:
    d = PromptLookupDrafter(max_ngram=3)
    d.begin([])
    h = [1, 2, 3, 4, 5, 9, 2, 3]
    assert d.propose(h, 3).tokens == [4, 5, 9]  # longest match "2 3" -> what followed it
    h += [7, 1, 2, 3]
    assert d.propose(h, 2).tokens == [4, 5]  # "1 2 3" occurred once before: what followed it
    assert d.propose([5, 6], 3).tokens == []  # nothing repeats
    assert d.propose([5, 6, 5], 3).tokens == [6, 5, 6]  # the period-2 pattern continues
