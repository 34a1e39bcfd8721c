"""The product page's verification test for the target/drafter pairs: load the target alone and with its drafter,
generate greedily, and the tokens (and caches) are identical. Synthetic files in the real layouts.

Pairs: Gemma 4 + gemma4-assistant (drafter file), Qwen 3.5 + its in-trunk MTP head (hybrid: DeltaNet state
restored from per-token snapshots, at most 16 drafts per verification). Each pair gives a target and a function that
binds its drafter to an engine's cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import Cycle, Pair, oracle_rounds, plain, same_cache, scripted
from helpers import spec as run_spec
from synth_gemma4 import write_gemma4, write_gemma4_assistant

from cuca.engine import Engine, Generation
from cuca.errors import ContextLengthError
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.gemma4_assistant import load_assistant
from cuca.models.layers import Ops
from cuca.speculative.drafters.assistant import AssistantDrafter
from cuca.speculative.drafters.mtp import MTPDrafter
from cuca.speculative.stats import RequestDraftStats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import synth_qwen35  # noqa: E402

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


@pytest.fixture(scope="module", params=["gemma4", "qwen35"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    d = tmp_path_factory.mktemp(request.param)
    if request.param == "qwen35":
        target = load_model(open_gguf(synth_qwen35.write(d / "q.gguf")), Ops(2))
        return target, lambda eng: MTPDrafter(target, eng.cache.n_ctx, draft_vocab=synth_qwen35.DRAFT_VOCAB_TINY)
    target = load_model(open_gguf(write_gemma4(d / "t.gguf")), Ops(2))
    assistant = load_assistant(open_gguf(write_gemma4_assistant(d / "a.gguf")), target.ops, target)
    return target, lambda eng: AssistantDrafter(assistant, eng.cache)


def spec(pair: Pair, prompt: list[int], max_tokens: int, k: int, n_ctx: int = 96,
         stop: frozenset[int] = frozenset()) -> tuple[list[int], Engine, Generation, RequestDraftStats]:
    return run_spec(pair, prompt, max_tokens, k, n_ctx, stop)


def oracle(pair: Pair, prompt: list[int], future: list[int], wrong: bool = False) -> Pair:
    """The pair's real drafter, its drafts replaced by `future` (the tokens after the first generated one)."""
    return scripted(pair, future, len(prompt) + 1, wrong)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6, 8, 16])
def test_greedy_with_drafter_equals_plain(pair: Pair, k: int) -> None:
    drafted = 0
    for prompt in PROMPTS:
        want, peng, pgen = plain(pair[0], prompt, 20, 96)
        got, seng, sgen, stats = spec(pair, prompt, 20, k)
        assert got == want and len(got) == len(want) and sgen.finish_reason == pgen.finish_reason
        assert same_cache(peng, seng)
        drafted += stats.drafted
    assert drafted > 0


@pytest.mark.parametrize("lengths", [[0, 1, 3, 2, 5, 0, 0, 4, 1, 16, 8], [2, 0]])
def test_variable_round_lengths_equal_plain(pair: Pair, lengths: list[int]) -> None:
    """The governor's round length changes every round (plain rounds among them): still plain greedy decoding, with
    the real drafter and with an oracle that makes every draft count."""
    for prompt in PROMPTS[:4]:
        want, peng, _ = plain(pair[0], prompt, 24, 96)
        for p in (pair, oracle(pair, prompt, want[1:])):
            gov = Cycle(lengths)
            got, seng, _, stats = run_spec(p, prompt, 24, gov, 96)
            assert got == want and same_cache(peng, seng)
            assert sum(stats.rounds_per_depth) == len(gov.rounds)
            assert all(n <= d <= room for room, d, n, _ in gov.rounds)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 9])
def test_max_tokens_edges(pair: Pair, max_tokens: int) -> None:
    """1, 2, one less than a round (k = 3 emits up to 4), a round, one more, two rounds + 1."""
    prompt = PROMPTS[0]
    want, _, _ = plain(pair[0], prompt, max_tokens, 96)
    future, _, _ = plain(pair[0], prompt, 20, 96)
    got, _, gen, stats = spec(oracle(pair, prompt, future[1:]), prompt, max_tokens, 3)
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
    got, seng, _, _ = spec(oracle(pair, prompt, want[1:]), prompt, n_ctx - 20, 8, n_ctx)
    assert got == want and same_cache(peng, seng)
    with pytest.raises(ContextLengthError):
        spec(pair, prompt, n_ctx - 19, 3, n_ctx)


@pytest.mark.parametrize("k", [1, 3, 8, 16])
def test_oracle_accepts_everything_and_wrong_drafter_nothing(pair: Pair, k: int) -> None:
    prompt = PROMPTS[3]
    want, peng, _ = plain(pair[0], prompt, 30, 96)
    got, seng, _, stats = spec(oracle(pair, prompt, want[1:]), prompt, 30, k)
    assert got == want and same_cache(peng, seng)
    assert stats.drafted > 0 and stats.accepted == stats.drafted
    assert stats.rounds == oracle_rounds(k, 29)
    assert stats.accepted_per_position[:k] == stats.drafted_per_position[:k]
    got, seng, _, stats = spec(oracle(pair, prompt, want[1:], wrong=True), prompt, 30, k)
    assert got == want and same_cache(peng, seng)
    assert stats.drafted > 0 and stats.accepted == 0 and stats.rounds == 28  # the last token has no room to draft


def test_stop_token_inside_accepted_drafts(pair: Pair) -> None:
    prompt = PROMPTS[1]
    future, _, _ = plain(pair[0], prompt, 30, 96)
    i = next(i for i in range(4, 30) if future[i] not in future[:i])  # a token the reply first emits at i
    stop = frozenset({future[i]})
    want, peng, pgen = plain(pair[0], prompt, 30, 96, stop=stop)
    got, seng, sgen, stats = spec(oracle(pair, prompt, future[1:]), prompt, 30, 8, stop=stop)
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
    """draft_tokens 20: a hybrid target (its cache rolls back 16 positions) gets at most 16 drafts per
    verification call, without anyone passing the limit along."""
    limit = pair[0].make_cache(8).max_rollback
    assert limit == (16 if pair[0].arch == "qwen35" else None)
    prompt = PROMPTS[3]
    want, peng, _ = plain(pair[0], prompt, 40, 96)
    got, seng, _, stats = spec(oracle(pair, prompt, want[1:]), prompt, 40, 20)
    assert got == want and same_cache(peng, seng)
    assert len(stats.drafted_per_position) == (limit if limit is not None else 20)
