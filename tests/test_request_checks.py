"""Every bad request or configuration value is a typed error, checked before any work is done (issue 13, defects
8-12, 15 and 16 on the library side), on a tiny synthetic gemma3 file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from synth import Tiny, write_tiny

from cuca import ConfigError, DrafterSource, LocalModel, LocalModelConfig
from cuca.errors import ContextLengthError
from cuca.sampling import SamplingParams, next_token, to_probs
from cuca.speculative.drafters.prompt_lookup import PromptLookupDrafter


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # trained context: 256
    return write_tiny(tmp_path_factory.mktemp("checks") / "tiny.gguf", arch="gemma3", shape=Tiny(untied=True))


@pytest.fixture(scope="module")
def model(path: Path) -> LocalModel:
    return LocalModel.load_sync(LocalModelConfig(path, threads=1))


# defect 8
def test_context_length_past_the_trained_length_or_past_memory_is_a_config_error(path: Path) -> None:
    with pytest.raises(ConfigError, match="exceeds the model's trained context length of 256 .*allow_long_context"):
        LocalModel.load_sync(LocalModelConfig(path, context_length=10**6, threads=1))
    with pytest.raises(ConfigError, match=r"context_length 1000000000 needs [\d,]+ bytes .* of KV cache, more than"):
        LocalModel.load_sync(LocalModelConfig(path, context_length=10**9, allow_long_context=True, threads=1))
    m = LocalModel.load_sync(LocalModelConfig(path, context_length=512, allow_long_context=True, threads=1))
    assert m.engine.n_ctx == 512 and len(m.complete_sync("abc", max_tokens=4).tokens) == 4


# defect 9
def test_threads_past_what_the_kernels_take_is_a_config_error(path: Path) -> None:
    with pytest.raises(ConfigError, match=r"threads must be an integer in 0\.\.65536, got 65537"):
        LocalModel.load_sync(LocalModelConfig(path, threads=65537))


# defect 10
def test_stop_strings_given_as_an_iterator_are_used(model: LocalModel) -> None:
    full = model.complete_sync("hello", max_tokens=12).text
    stop = full[3:5]
    want = full[: full.index(stop)]
    assert model.complete_sync("hello", max_tokens=12, stop=iter([stop])).text == want
    assert model.complete_sync("hello", max_tokens=12, stop=(s for s in ["zzzz", stop])).text == want
    with pytest.raises(ConfigError, match="stop"):
        model.complete_sync("hello", stop=b"ab")


# defect 11
@pytest.mark.parametrize(
    "prompt, says",
    [
        (b"abc", "bytes prompt is ambiguous"),
        ([5, 320], r"prompt token 1 is 320, not a token id \(an integer in 0\.\.319\)"),
        ([5, -1], "prompt token 1 is -1"),
        ([10**30], "prompt token 0 is 1000000000000000000000000000000"),
        ([5, 6, 7.0], "prompt token 2 is 7.0"),
        ([True, 5], "prompt token 0 is True"),
        (["5"], "prompt token 0 is '5'"),
        (np.array([5.5]), r"prompt token 0 is np.float64\(5.5\)"),
    ],
)
def test_bad_token_id_prompts_name_the_first_bad_id(model: LocalModel, prompt: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        model.complete_sync(prompt, max_tokens=2)
    with pytest.raises(ConfigError):
        list(model.stream_ids_sync(prompt, max_tokens=2))


def test_numpy_token_ids_are_token_ids(model: LocalModel) -> None:
    want = model.complete_sync([5, 6, 7], max_tokens=4).tokens
    assert model.complete_sync(np.array([5, 6, 7], np.int64), max_tokens=4).tokens == want
    assert model.complete_sync(list(np.array([5, 6, 7], np.int32)), max_tokens=np.int64(4)).tokens == want


# defect 12
def test_a_denormal_temperature_is_the_arg_max_limit_not_nan(model: LocalModel) -> None:
    logits = np.array([0.5, 3.0, -1.0, 2.999], np.float32)
    p = to_probs(logits, SamplingParams(temperature=5e-324))
    assert np.isfinite(p).all() and p[1] == 1.0
    assert next_token(logits, SamplingParams(temperature=5e-324, seed=1), np.random.default_rng(1)) == 1
    greedy = model.complete_sync("hello", max_tokens=8).tokens
    assert model.complete_sync("hello", max_tokens=8, temperature=5e-324, seed=3).tokens == greedy


# defect 15
def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(
    model: LocalModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_encode(*a: Any, **k: Any) -> list[int]:
        raise AssertionError("the whole prompt was tokenized before the context check")

    monkeypatch.setattr(model.tokenizer, "encode", no_encode)
    with pytest.raises(ContextLengthError, match=r"needs at least [\d,]+ tokens.*context length of 256"):
        model.complete_sync("a" * 10**6, max_tokens=4)
    with pytest.raises(ContextLengthError, match="needs at least"):
        model.chat_sync([{"role": "user", "content": "a" * 10**6}], max_tokens=4)


def test_prompt_lookup_max_ngram_is_bounded() -> None:
    with pytest.raises(ConfigError, match=r"max_ngram must be an integer in 1\.\.32"):
        DrafterSource.prompt_lookup(10**6)
    with pytest.raises(ConfigError, match="max_ngram"):
        DrafterSource.prompt_lookup(True)
    with pytest.raises(ConfigError, match="max_ngram"):
        PromptLookupDrafter(max_ngram=10**6)
    assert DrafterSource.prompt_lookup(np.int64(4)).max_ngram == 4


# defect 16
@pytest.mark.parametrize(
    "kw, field",
    [({"temperature": True}, "temperature"), ({"top_k": True}, "top_k"), ({"seed": True}, "seed"),
     ({"top_p": False}, "top_p"), ({"max_tokens": True}, "max_tokens"), ({"temprature": 1.0}, "temprature")],
)
def test_bools_are_not_numbers_anywhere(model: LocalModel, kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        model.complete_sync("abc", **kw)


def test_numpy_integers_and_floats_are_numbers_everywhere(model: LocalModel) -> None:
    kw: dict[str, Any] = dict(max_tokens=6, temperature=0.9, top_k=20, top_p=0.95, seed=11)
    want = model.complete_sync("abc", **kw).tokens
    np_kw = dict(max_tokens=np.int64(6), temperature=np.float32(0.9), top_k=np.int32(20), top_p=np.float64(0.95),
                 seed=np.int64(11))
    assert model.complete_sync("abc", **np_kw).tokens == want
    assert SamplingParams(seed=np.int64(11)) == SamplingParams(seed=11)


def test_the_memory_check_counts_the_drafters_own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An MTP head keeps its own K/V: memory that fits the target's cache alone but not both is a ConfigError."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import synth_qwen35

    from cuca import DrafterSource
    from cuca import local as local_mod

    q = synth_qwen35.write(tmp_path / "q.gguf")
    plain = LocalModel.load_sync(LocalModelConfig(q, threads=1, context_length=256))
    target = plain.engine.cache.nbytes
    monkeypatch.setattr(local_mod, "available_memory", lambda: target + 1)
    assert LocalModel.load_sync(LocalModelConfig(q, threads=1, context_length=256)).engine.n_ctx == 256
    with pytest.raises(ConfigError, match=r"context_length 256 needs [\d,]+ bytes .*\(target and drafter\)"):
        LocalModel.load_sync(LocalModelConfig(q, threads=1, context_length=256, drafter=DrafterSource.IN_TRUNK))


@pytest.mark.parametrize("gen", [0, "", "g", []])
def test_a_gen_that_is_not_a_generation_is_a_config_error(model: LocalModel, gen: object) -> None:
    with pytest.raises(ConfigError, match="gen must be a Generation"):
        model.complete_sync("abc", max_tokens=2, gen=gen)
