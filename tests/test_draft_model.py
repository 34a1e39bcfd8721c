"""A small model of the target's family as the drafter (DrafterSource.file naming an ordinary model file): greedy
output equals plain decoding bit for bit, its cache follows the accepted text (one batched catch-up per round), the
pair is checked as llama.cpp checks it, and `auto` picks the drafter a target pairs with.

Pairs, on the converted fixtures of tests/test_dense.py: each family's F32 target drafted by its own Q8_0 file (the
same weights rounded: most drafts accepted, some not) and by the family's tiny random drafter; the qwen35 hybrid as
a drafter (its cache rolls back one batch deep only: snapshots); SmolLM2-135M drafting for itself (every draft
accepted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import real_model_path
from helpers import plain, spec

from cuca import DrafterSource, LocalModel, LocalModelConfig, ProviderError
from cuca.gguf import open_gguf
from cuca.models import load_model
from cuca.models.layers import Ops
from cuca.speculative import AlwaysDraft
from cuca.speculative.drafters.draft_model import DraftModelDrafter
from cuca.speculative.drafters.load import resolve_auto
from cuca.speculative.drafters.pairing import check_pairing
from cuca.tokenizer import Tokenizer

DIR = Path(__file__).parent / "fixtures" / "converted"
PROMPT = [251, 78, 32, 89, 124, 244, 135, 27, 100, 180, 243, 218]  # partial acceptance in every family
FAMILIES = ["qwen3", "qwen2", "llama3"]
_models: dict[str, Any] = {}


def model(name: str) -> Any:
    if name not in _models:
        _models[name] = load_model(open_gguf(DIR / f"{name}.gguf"), Ops(1))
    return _models[name]


def pair(target: str, drafter: str) -> tuple[Any, Any]:
    t, d = model(target), model(drafter)
    return t, lambda eng: DraftModelDrafter(d, eng.cache.n_ctx, t.n_vocab)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_with_a_draft_model_equals_plain(family: str) -> None:
    """draft_tokens 1-8 with the rounded twin (partial acceptance: rollbacks of every depth) and the random drafter
    (almost nothing accepted); the caches end equal too."""
    ref, eng_ref, _ = plain(model(f"{family}-f32"), PROMPT, 40)
    accepted = []
    for k in range(1, 9):
        out, eng, _, st = spec(pair(f"{family}-f32", f"{family}-q8_0"), PROMPT, 40, k)
        assert out == ref, k
        assert eng.cache.n == eng_ref.cache.n and np.array_equal(eng.cache.k[0][:, : eng.cache.n],
                                                                  eng_ref.cache.k[0][:, : eng.cache.n])
        accepted.append((st.accepted, st.drafted))
    assert all(0 < a for a, _ in accepted) and any(a < d for a, d in accepted)
    for k in (1, 4, 8):
        assert spec(pair(f"{family}-f32", f"{family}-draft-f32"), PROMPT, 24, k)[0] == ref[:24]


class Counting(DraftModelDrafter):
    """Records the size of every forward pass of the draft model."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.passes: list[int] = []
        inner = self.model

        class Spy:
            def __getattr__(self, k: str) -> Any:
                return getattr(inner, k)

            def forward_hidden(s, ids: np.ndarray, *rest: Any) -> np.ndarray:  # noqa: N805
                self.passes.append(len(ids))
                return inner.forward_hidden(ids, *rest)

            def forward(s, ids: np.ndarray, *rest: Any) -> np.ndarray:  # noqa: N805
                self.passes.append(len(ids))
                return inner.forward(ids, *rest)

        self.model = Spy()


def test_catch_up_is_one_pass_of_the_uncached_tokens() -> None:
    """SmolLM2-135M-like self-drafting on the llama3 file: after the prompt's pass, every round feeds n - 1 drafts
    one at a time and then catches up on exactly the tokens its cache lacks (here 2: the last draft, the bonus)."""
    t = model("llama3-f32")
    drafters: list[Counting] = []

    def make(eng: Any) -> Counting:
        drafters.append(Counting(t, eng.cache.n_ctx, t.n_vocab))
        return drafters[-1]

    out, _, _, st = spec((t, make), PROMPT, 21, 4)
    assert st.accepted == st.drafted == 16 and out == plain(t, PROMPT, 21)[0]
    p = drafters[0].passes
    assert p[0] == len(PROMPT) + 1  # the prompt and the first token, in one batch
    assert p[1:] == [1, 1, 1] + [2, 1, 1, 1] * 3  # then per round: catch up on 2, then 3 chained drafts


def test_hybrid_drafter_rolls_back_through_snapshots() -> None:
    """A qwen35 file drafting for itself: its cache rolls back one forward batch only, so the drafter restores the
    state it saved after its last catch-up (every depth 1-8, every draft accepted)."""
    t, d = model("qwen35-f32"), model("qwen35-nomtp-f32")
    prompt = [320, *PROMPT[1:]]
    ref = plain(t, prompt, 30)[0]
    for k in (1, 3, 8):
        out, _, _, st = spec((t, lambda eng: DraftModelDrafter(d, eng.cache.n_ctx, t.n_vocab)), prompt, 30, k)
        assert out == ref and st.accepted == st.drafted > 0


def test_smollm2_drafting_for_itself_accepts_everything() -> None:
    """Real weights: SmolLM2-135M as its own draft model through LocalModel; output equals plain, 100% accepted."""
    path = real_model_path("smollm2")
    plain_lm = LocalModel.load_sync(LocalModelConfig(path, threads=1, context_length=256))
    lm = LocalModel.load_sync(LocalModelConfig(path, drafter=DrafterSource.file(path), draft_tokens=5, threads=1,
                                               context_length=256))
    lm.governor = AlwaysDraft()  # drafting with itself is slower than plain: the speed governor would stop it
    prompt = "The three primary colors are"
    ref = plain_lm.complete_sync(prompt, max_tokens=32)
    r = lm.complete_sync(prompt, max_tokens=32)
    assert r.tokens == ref.tokens
    assert r.draft is not None and r.draft.drafted >= 25 and r.draft.accepted == r.draft.drafted


# -- pairing ----------------------------------------------------------------------------------------------------------


def tok(name: str) -> Tokenizer:
    return Tokenizer.from_gguf(DIR / f"{name}.gguf")


def edited(name: str, **changes: Any) -> Tokenizer:
    base = tok(name)
    meta = dict(open_gguf(DIR / f"{name}.gguf").metadata)
    meta.update(changes)
    return Tokenizer(meta, source=f"edited {base.source}")


def test_pairs_of_one_family_pass_the_check() -> None:
    for family in FAMILIES:
        check_pairing(tok(f"{family}-f32"), tok(f"{family}-draft-f32"))
    check_pairing(tok("qwen3-f32"), tok("qwen2-f32"))  # Qwen 2.5 and Qwen 3 share a vocabulary here, as for real


@pytest.mark.parametrize("target, changes, says", [
    ("qwen3-f32", {"tokenizer.ggml.model": "llama", "tokenizer.ggml.scores": [0.0] * 384},
     r"tokenizer model 'llama' differs from the target's 'gpt2'"),
    ("llama3-f32", {"tokenizer.ggml.add_bos_token": False}, r"BOS differs \(target adds BOS: True, id 321; drafter "
                                                             r"adds BOS: False"),
    ("llama3-f32", {"tokenizer.ggml.bos_token_id": 320}, r"BOS differs .* id 321; drafter adds BOS: True, id 320"),
    ("qwen3-f32", {"tokenizer.ggml.add_eos_token": True}, r"EOS differs"),
    ("qwen3-f32", {"tokenizer.ggml.tokens": None}, r"token 300 differs: target 'tk', drafter 'zz'"),
    ("qwen3-f32", {"tokenizer.ggml.tokens": 129}, r"vocabulary sizes 255 and the target's 384 differ by more than 128"),
])
def test_mismatched_pairs_name_the_difference(target: str, changes: dict[str, Any], says: str) -> None:
    meta_tokens = list(open_gguf(DIR / f"{target}.gguf").metadata["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.tokens" in changes:
        cut = changes["tokenizer.ggml.tokens"]
        if cut is None:
            meta_tokens[300] = "zz"
            changes = {"tokenizer.ggml.tokens": meta_tokens}
        else:
            n = len(meta_tokens) - cut
            changes = {"tokenizer.ggml.tokens": meta_tokens[:n], "tokenizer.ggml.token_type": [1] * n,
                       "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1}
    with pytest.raises(ProviderError, match=says):
        check_pairing(tok(target), edited(target, **changes))


def test_ids_below_5_may_differ_and_sizes_within_128() -> None:
    meta_tokens = list(open_gguf(DIR / "qwen3-f32.gguf").metadata["tokenizer.ggml.tokens"])
    check_pairing(tok("qwen3-f32"), edited("qwen3-f32", **{"tokenizer.ggml.tokens": ["x", *meta_tokens[1:]]}))
    check_pairing(tok("qwen3-f32"), edited("qwen3-f32", **{"tokenizer.ggml.tokens": meta_tokens[:-64],
                                                          "tokenizer.ggml.token_type": [1] * 320}))


def test_a_draft_model_of_another_vocabulary_fails_at_load() -> None:
    with pytest.raises(ProviderError, match=r"cannot draft for .*llama3-f32.gguf: BOS differs"):
        LocalModel.load_sync(LocalModelConfig(DIR / "llama3-f32.gguf", drafter=str(DIR / "qwen3-draft-f32.gguf"),
                                              threads=1))


def test_auto_picks_head_then_preset_pair_then_prompt_lookup() -> None:
    from cuca import ModelSource

    assert resolve_auto(DrafterSource.AUTO, model("qwen35-f32")) is DrafterSource.IN_TRUNK
    got = resolve_auto(DrafterSource.AUTO, model("qwen3-f32"), ModelSource.parse("qwen3-8b-q4_k_m"))
    assert got == DrafterSource.file("qwen3-0.6b-q8_0")
    by_name = resolve_auto(DrafterSource.AUTO, model("qwen3-f32"), ModelSource.parse("/x/Qwen3-8B-Q4_K_M.gguf"))
    assert by_name == got
    assert resolve_auto(DrafterSource.AUTO, model("qwen3-f32"), ModelSource.parse("a.gguf")).kind == "prompt_lookup"
    assert DrafterSource.parse("auto") is DrafterSource.AUTO
    lm = LocalModel.load_sync(LocalModelConfig(DIR / "qwen35-f32.gguf", drafter="auto", threads=1))
    assert lm.drafter_source is DrafterSource.IN_TRUNK
