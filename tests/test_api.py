"""The public API a user meets: what `cuca` exports, every request form with every parameter, the reply, and the
config checks (each a ConfigError that names the field)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from synth import write_tiny

import cuca
from cuca import ConfigError, DrafterSource, DraftStats, LocalModel, LocalModelConfig, ModelSource, Reply


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LocalModel:
    path = write_tiny(tmp_path_factory.mktemp("api") / "tiny.gguf", arch="gemma3")
    return LocalModel.load_sync(LocalModelConfig(path, drafter=DrafterSource.prompt_lookup(), threads=1))


def test_exports_only_the_public_api() -> None:
    assert sorted(cuca.__all__) == [
        "ConfigError", "CucaError", "DraftStats", "DrafterSource", "LocalModel", "LocalModelConfig", "ModelSource",
        "ProviderError", "RemoteModel", "Reply",
    ]
    assert issubclass(cuca.ConfigError, cuca.CucaError) and issubclass(cuca.ProviderError, cuca.CucaError)


def test_config_defaults() -> None:
    c = LocalModelConfig()
    assert (c.source, c.drafter, c.draft_tokens, c.context_length, c.threads, c.device) == (
        "gemma3-270m-q4_k_m", None, 3, 0, 0, "cpu")


KW: dict[str, Any] = dict(max_tokens=6, temperature=0.8, top_k=20, top_p=0.9, seed=3, stop=["zzzz"])


def test_every_request_form_takes_every_parameter(model: LocalModel) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    before = model.draft_stats()
    r = model.complete_sync("abcabc", **KW)
    assert isinstance(r, Reply) and len(r.tokens) == 6 and r.finish_reason == "length"
    # a seeded request at temperature > 0 drafts every round; the reply repeats a token, so lookup proposes
    assert r.timings.n_generated == 6 and r.draft is not None and r.draft.rounds > 0
    assert "".join(model.stream_sync("abcabc", **KW)) == r.text
    c = model.chat_sync(msgs, **KW)
    assert "".join(model.stream_chat_sync(msgs, **KW)) == c.text

    async def go() -> tuple[Reply, Reply, str, str]:
        a = await model.complete("abcabc", **KW)
        b = await model.chat(msgs, **KW)
        s1 = "".join([p async for p in model.stream("abcabc", **KW)])
        s2 = "".join([p async for p in model.stream_chat(msgs, **KW)])
        return a, b, s1, s2

    a, b, s1, s2 = asyncio.run(go())
    assert (a.text, b.text, s1, s2) == (r.text, c.text, r.text, c.text)
    assert c.draft is not None and a.draft == r.draft and b.draft == c.draft
    stats = model.draft_stats()  # every form's drafting is counted: 4 seeded runs of each prompt, each alike
    assert isinstance(stats, DraftStats)
    assert stats.drafted - before.drafted == 4 * (r.draft.drafted + c.draft.drafted)
    assert stats.rounds - before.rounds == 4 * (r.draft.rounds + c.draft.rounds)


def test_a_single_stop_string_is_one_stop_string(model: LocalModel) -> None:
    full = model.complete_sync("abcabc", max_tokens=12).text
    stop = full[2:4]
    assert model.complete_sync("abcabc", max_tokens=12, stop=stop).text == full[: full.index(stop)]


def test_a_request_can_decode_plainly_on_a_drafting_model(model: LocalModel) -> None:
    before = model.draft_stats().drafted
    r = model.complete_sync("abcabcabcabc", max_tokens=10, draft=False)
    assert r.draft is None and model.draft_stats().drafted == before
    assert r.tokens == model.complete_sync("abcabcabcabc", max_tokens=10).tokens


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"seed": -2}, "seed"),
        ({"stop": [1]}, "stop"),
    ],
)
def test_bad_request_parameters_name_the_parameter(model: LocalModel, kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        model.complete_sync("abc", **kw)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"source": 42}, "source"),
        ({"drafter": 3.5}, "drafter"),
        ({"draft_tokens": "3"}, "draft_tokens"),
        ({"threads": True}, "threads"),
        ({"context_length": 1.5}, "context_length"),
        ({"device": "cuda"}, "device"),
    ],
)
def test_config_fields_are_checked_at_load(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        LocalModel.load_sync(LocalModelConfig(**kw))


def test_a_source_is_a_string_or_a_model_source() -> None:
    assert DrafterSource.parse("gemma4-e2b-mtp-f16").source == ModelSource.preset("gemma4-e2b-mtp-f16")
    assert DrafterSource.file(ModelSource.parse("hf:a/b/c.gguf")).source == ModelSource.parse("hf:a/b/c.gguf")
