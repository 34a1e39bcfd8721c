"""Speculative rounds reproduce plain greedy decoding bit for bit (tokens, counts and cache contents), whatever the
drafter proposes; acceptance statistics match what the drafter deserved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import Cycle, Pair, Scripted, oracle_rounds, plain, same_cache
from helpers import spec as run_spec
from synth import write_tiny

from cuca.errors import ContextLengthError
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.layers import Ops
from cuca.speculative.drafters import Drafter
from cuca.speculative.drafters.prompt_lookup import PromptLookupDrafter

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


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    path: Path = write_tiny(tmp_path_factory.mktemp("m") / f"{request.param}.gguf", arch=request.param)
    return load_model(open_gguf(path), Ops(2))


def spec(model: Any, prompt: list[int], max_tokens: int, drafter: Drafter, k: int | Cycle,
         n_ctx: int = 128) -> tuple[list[int], Any, Any, Any]:
    """helpers.spec with a drafter that needs nothing of the engine."""
    pair: Pair = (model, lambda eng: drafter)
    return run_spec(pair, prompt, max_tokens, k, n_ctx)


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


LENGTHS = [[0, 1, 3, 2, 5, 0, 0, 4, 1], [2, 0], [7, 1, 6, 0, 3]]  # the governor's picks, in turn, plain rounds among


@pytest.mark.parametrize("lengths", LENGTHS)
def test_variable_round_lengths_equal_plain(model, lengths: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Whatever length the governor picks each round (0 included), greedy output and the cache equal plain
    decoding: with an oracle (every draft accepted), a wrong drafter (none) and prompt lookup (some)."""
    for prompt in PROMPTS[:5]:
        want, peng, _ = plain(model, prompt, 40)
        for drafter in (Scripted(want[1:], len(prompt) + 1), Scripted(want[1:], len(prompt) + 1, wrong=True),
                        PromptLookupDrafter()):
            gov = Cycle(lengths)
            got, seng, _, stats = spec(model, prompt, 40, drafter, gov)  # type: ignore[arg-type]
            assert got == want and same_cache(peng, seng)
            assert gov.requests == 1
            picked = [d for _, d, _, _ in gov.rounds]
            assert sum(stats.rounds_per_depth) == len(gov.rounds) and all(d <= room for room, d, _, _ in gov.rounds)
            assert stats.rounds_per_depth == [picked.count(d) for d in range(len(stats.rounds_per_depth))]
            # the governor is told the drafts proposed (a lookup without a match: none), never more than decided
            assert all(a <= n <= d for _, d, n, a in gov.rounds)
            if isinstance(drafter, Scripted):
                assert all(n == d for _, d, n, _ in gov.rounds)
                if not drafter.wrong:
                    assert all(a == d for _, d, _, a in gov.rounds)  # every draft asked for was accepted

    # a drafter that finds nothing (a lookup with no match in the prompt): the rounds are plain steps, and the
    # governor hears 0 drafts whatever length it decided
    gov = Cycle(lengths)
    got, _, _, _ = spec(model, PROMPTS[0], 12, PromptLookupDrafter(min_ngram=32, max_ngram=32), gov)  # type: ignore[arg-type]
    assert got == plain(model, PROMPTS[0], 12)[0] and any(d for _, d, _, _ in gov.rounds)
    assert all(n == 0 for _, _, n, _ in gov.rounds)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 9])
def test_max_tokens_edges(model, max_tokens: int) -> None:  # type: ignore[no-untyped-def]
    """1, 2, one less than a round (k = 3: a round emits up to 4), exactly a round, one more, two rounds + 1."""
    prompt = PROMPTS[0]
    want, _, _ = plain(model, prompt, max_tokens)
    future, _, _ = plain(model, prompt, 20)
    got, _, gen, stats = spec(model, prompt, max_tokens, Scripted(future[1:], len(prompt) + 1), 3)
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
    got, _, _, _ = spec(model, prompt, n_ctx - 16, Scripted(want[1:], 17), 6, n_ctx)
    assert got == want
    with pytest.raises(ContextLengthError):
        spec(model, prompt, n_ctx - 15, PromptLookupDrafter(), 3, n_ctx)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_oracle_accepts_everything_and_wrong_drafter_nothing(model, k: int) -> None:  # type: ignore[no-untyped-def]
    prompt = PROMPTS[3]
    want, peng, _ = plain(model, prompt, 30)
    got, seng, _, stats = spec(model, prompt, 30, Scripted(want[1:], len(prompt) + 1), k)
    assert got == want and same_cache(peng, seng)
    assert stats.drafted > 0 and stats.accepted == stats.drafted
    assert stats.rounds == oracle_rounds(k, 29)
    got, seng, _, stats = spec(model, prompt, 30, Scripted(want[1:], len(prompt) + 1, wrong=True), k)
    assert got == want and same_cache(peng, seng)
    assert stats.drafted > 0 and stats.accepted == 0


def test_stop_token_inside_accepted_drafts(model) -> None:  # type: ignore[no-untyped-def]
    prompt = PROMPTS[3]
    future, _, _ = plain(model, prompt, 30)
    stop = frozenset({future[6]})
    want, _, pgen = plain(model, prompt, 30, stop=stop)
    pair: Pair = (model, lambda eng: Scripted(future[1:], len(prompt) + 1))
    got, _, sgen, _ = run_spec(pair, prompt, 30, 8, stop=stop)
    assert got == want and got[-1] == future[6] and sgen.finish_reason == pgen.finish_reason == "stop"


def _committed(d: PromptLookupDrafter, tokens: list[int]) -> PromptLookupDrafter:
    """`d` after a request whose history is `tokens` (the prompt's first token, then one commit of the rest)."""
    d.begin(tokens[:1])
    d.commit(tokens[1:], np.arange(len(tokens) - 1, dtype=np.int32), np.zeros((len(tokens) - 1, 0), np.float32))
    return d


def test_prompt_lookup_proposals() -> None:
    d = _committed(PromptLookupDrafter(max_ngram=3), [1, 2, 3, 4, 5, 9, 2, 3])
    assert d.propose(3).tokens == [4, 5, 9]  # longest match "2 3" -> what followed it
    d.commit([7, 1, 2, 3], np.arange(7, 11, dtype=np.int32), np.zeros((4, 0), np.float32))
    assert d.propose(2).tokens == [4, 5]  # "1 2 3" occurred once before: what followed it
    assert _committed(d, [5, 6]).propose(3).tokens == []  # nothing repeats
    assert _committed(d, [5, 6, 5]).propose(3).tokens == [6, 5, 6]  # the period-2 pattern continues
    with pytest.raises(ValueError, match="does not continue"):
        d.commit([1], np.array([7], np.int32), np.zeros((1, 0), np.float32))  # a gap: drafter and target disagree
