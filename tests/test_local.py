"""LocalModel and the CLI on a tiny synthetic gemma3 file: requests, streaming, stops, errors, drafting stats."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from synth import write_tiny

from cuca import ConfigError, CucaError, LocalModel, LocalModelConfig, ProviderError
from cuca.cli import main
from cuca.errors import ContextLengthError
from cuca.speculative.source import DrafterSource


@pytest.fixture(scope="module")
def path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("lm") / "tiny.gguf", arch="gemma3")


@pytest.fixture(scope="module")
def model(path: Path) -> LocalModel:
    return LocalModel.load_sync(LocalModelConfig(path, threads=1))


def test_complete_stream_and_async_agree(model: LocalModel) -> None:
    reply = model.complete_sync("hello world", max_tokens=12)
    assert reply.finish_reason == "length" and len(reply.tokens) == 12
    assert reply.timings.n_prompt == len(model.tokenizer.encode("hello world"))
    assert "".join(model.stream_sync("hello world", max_tokens=12)) == reply.text
    assert asyncio.run(model.complete("hello world", max_tokens=12)).text == reply.text

    async def collect() -> str:
        return "".join([p async for p in model.stream("hello world", max_tokens=12)])

    assert asyncio.run(collect()) == reply.text


def test_stop_string_cuts_text(model: LocalModel) -> None:
    full = model.complete_sync("hello world", max_tokens=12).text
    stop = full[3:5]
    reply = model.complete_sync("hello world", max_tokens=12, stop=[stop])
    assert reply.finish_reason == "stop" and reply.text == full[: full.index(stop)]


def test_seeded_sampling_reproduces(model: LocalModel) -> None:
    a = model.complete_sync("abc", max_tokens=10, temperature=1.0, top_k=20, seed=5)
    b = model.complete_sync("abc", max_tokens=10, temperature=1.0, top_k=20, seed=5)
    assert a.tokens == b.tokens


def test_context_overflow_is_a_clear_error(path: Path) -> None:
    m = LocalModel.load_sync(LocalModelConfig(path, context_length=16, threads=1))
    with pytest.raises(ContextLengthError, match="exceeds the context length of 16"):
        m.complete_sync("hello world", max_tokens=10)


def test_concurrent_requests_are_served_in_order(model: LocalModel) -> None:
    want = model.complete_sync("hello", max_tokens=8).tokens
    results: list[list[int]] = []

    def worker() -> None:
        results.append(model.complete_sync("hello", max_tokens=8).tokens)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [want] * 4


def test_prompt_lookup_drafting_equals_plain_and_counts(path: Path, model: LocalModel) -> None:
    m = LocalModel.load_sync(LocalModelConfig(path, drafter=DrafterSource.prompt_lookup(), draft_tokens=4, threads=1))
    assert m.draft_stats().acceptance_rate() is None
    prompt = "abcabcabcabc"
    reply = m.complete_sync(prompt, max_tokens=20)
    assert reply.tokens == model.complete_sync(prompt, max_tokens=20).tokens
    total = m.draft_stats()
    assert reply.draft is not None and total.drafted == reply.draft.drafted and total.rounds == reply.draft.rounds
    again = m.complete_sync(prompt, max_tokens=20).draft
    assert again is not None and m.draft_stats().drafted == total.drafted + again.drafted  # summed over requests
    assert max(again.drafted_per_position) > 0 and len(again.accepted_per_position) > 1


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"threads": -1}, "threads"),
        ({"context_length": -5}, "context_length"),
        ({"drafter": "prompt-lookup", "draft_tokens": 0}, "draft_tokens"),
        ({"device": "vulkan"}, "device"),
    ],
)
def test_config_errors_name_the_field(path: Path, kw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        LocalModel.load_sync(LocalModelConfig(path, **kw))


def test_unavailable_drafters_say_why(path: Path, tmp_path: Path) -> None:
    with pytest.raises(ProviderError, match="no prediction head"):
        LocalModel.load_sync(LocalModelConfig(path, drafter=DrafterSource.IN_TRUNK))
    other = write_tiny(tmp_path / "f.gguf", arch="falcon")
    with pytest.raises(ProviderError, match=r"architecture 'falcon' is neither a drafter file .* nor a model cuca"):
        LocalModel.load_sync(LocalModelConfig(path, drafter=DrafterSource.file(other)))
    with pytest.raises(ConfigError, match="in-trunk prediction head runs on the CPU only"):
        LocalModel.load_sync(LocalModelConfig(path, drafter="in-trunk", device="cuda"))


def test_missing_file_is_a_cuca_error(tmp_path: Path) -> None:
    with pytest.raises(CucaError, match="does not exist"):
        LocalModel.load_sync(LocalModelConfig(tmp_path / "nope.gguf"))


def test_cli_generate_json(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["generate", str(path), "--prompt", "hello", "--max-tokens", "6", "--threads", "1", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_generated"] == len(out["tokens"]) == 6 and out["n_prompt_tokens"] > 0
    assert {"text", "prompt_tokens_per_second", "tokens_per_second"} <= set(out)
    rc = main(["generate", str(path), "--chat", "hi", "--max-tokens", "4", "--threads", "1", "--json",
               "--drafter", "prompt-lookup"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and "draft" in out and set(out["draft"]) >= {"rounds", "drafted", "accepted"}


def test_cli_reports_errors_without_traceback(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["generate", str(path), "--prompt", "hello", "--max-tokens", "100000", "--context-length", "64"])
    assert rc == 2 and "context length" in capsys.readouterr().err
