"""Speculation as a LocalModel user meets it: configs that cannot be invalid (DrafterSource, device), a drafter that
does not match its target, the governor kept across requests; and CI's guard that the C kernels are in use."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from synth import write_tiny
from synth_gemma4 import AssistantOpts, write_gemma4, write_gemma4_assistant

from cuca import ConfigError, DrafterSource, LocalModel, LocalModelConfig, ModelSource, ProviderError, kernels
from cuca.device import Device
from cuca.speculative.drafters.load import check_device


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("cfg") / "tiny.gguf", arch="gemma3")


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"kind": "bogus"}, "drafter kind must be one of"),
        ({"kind": "file"}, "needs a ModelSource"),
        ({"kind": "file", "source": "a.gguf"}, "needs a ModelSource"),
        ({"kind": "in_trunk", "source": ModelSource.parse("a.gguf")}, "reads no file"),
        ({"kind": "prompt_lookup", "max_ngram": 0}, "max_ngram"),
        ({"kind": "prompt_lookup", "max_ngram": True}, "max_ngram"),
    ],
)
def test_drafter_source_is_checked_when_built(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DrafterSource(**kw)


def test_drafter_source_forms() -> None:
    assert DrafterSource.parse("in-trunk") is DrafterSource.IN_TRUNK
    assert DrafterSource.parse("prompt_lookup") == DrafterSource("prompt_lookup")
    assert DrafterSource.file("x.gguf") == DrafterSource("file", ModelSource.parse("x.gguf"))


def test_device_is_one_value_checked_once() -> None:
    assert Device.parse("CPU") is Device.CPU and Device.parse(Device.CPU) is Device.CPU and Device.CPU == "cpu"
    with pytest.raises(ConfigError, match="device must be one of"):
        Device.parse("tpu")
    with pytest.raises(ConfigError, match="device must be one of"):
        Device.parse(3)
    with pytest.raises(ConfigError, match="not available in this build"):
        Device.VULKAN.check_available()
    with pytest.raises(ConfigError, match="in-trunk prediction head runs on the CPU only"):
        check_device(DrafterSource.IN_TRUNK, Device.CUDA)
    check_device(DrafterSource.prompt_lookup(), Device.CUDA)  # only the in-trunk head is tied to the CPU
    check_device(DrafterSource.IN_TRUNK, Device.CPU)
    with pytest.raises(ConfigError, match="device must be one of"):
        LocalModelConfig(device="tpu").validate()


@pytest.mark.parametrize("kw, match", [({"n_embd_out": 96}, r"embedding_length_out 96 .* embedding_length 64"),
                                       ({"n_vocab": 480}, r"480 tokens .* 512")])
def test_a_mismatched_drafter_fails_at_load(tmp_path: Path, kw: dict, match: str) -> None:
    target = write_gemma4(tmp_path / "t.gguf")
    drafter = write_gemma4_assistant(tmp_path / "a.gguf", opts=AssistantOpts(**kw))
    with pytest.raises(ProviderError, match=match):
        LocalModel.load_sync(LocalModelConfig(target, drafter=DrafterSource.file(drafter), threads=1))


def test_a_drafter_for_another_architecture_fails_at_load(tmp_path: Path, gemma3: Path) -> None:
    drafter = write_gemma4_assistant(tmp_path / "a.gguf")
    with pytest.raises(ProviderError, match=r"needs a gemma4 target, got 'gemma3'"):
        LocalModel.load_sync(LocalModelConfig(gemma3, drafter=str(drafter), threads=1))


def test_the_governor_is_kept_across_requests(gemma3: Path) -> None:
    """The warm-up (plain rounds, then speculative ones, then a decision) happens once per model: a second
    request continues the first one's schedule instead of measuring again."""
    lm = LocalModel.load_sync(LocalModelConfig(gemma3, drafter="prompt-lookup", draft_tokens=2, threads=1))
    gov = lm.governor
    first = lm.complete_sync("abcabcabcabc", max_tokens=24)
    rounds = gov.rounds  # type: ignore[attr-defined]
    assert first.draft is not None and rounds > 0
    decisions = [(e.kind, e.round) for e in first.draft.governor_events if e.kind in ("spec_on", "spec_off")]
    assert decisions[:1] and decisions[0][1] == 4  # 2 plain + 2 speculative rounds measured, then decided
    second = lm.complete_sync("abcabcabcabc", max_tokens=24)
    assert lm.governor is gov and gov.rounds > rounds  # type: ignore[attr-defined]
    assert second.draft is not None and all(e.round >= rounds for e in second.draft.governor_events)
    timed = sum(c.count for c in gov.costs.values())  # type: ignore[attr-defined]
    assert timed == gov.rounds  # type: ignore[attr-defined]  # every round of both requests measured, none again
    assert sum(first.draft.rounds_per_depth) + sum(second.draft.rounds_per_depth) == gov.rounds  # type: ignore[attr-defined]


def test_ci_runs_the_c_kernels(gemma3: Path) -> None:
    """Under CI (CUCA_REQUIRE_C=1) the C extension must be the backend in use, not the silent numpy fallback."""
    if os.environ.get("CUCA_REQUIRE_C") != "1" and kernels.BACKEND != "c":
        pytest.skip("the C extension is not built (CI sets CUCA_REQUIRE_C=1, which makes this a failure)")
    c = kernels.implementations().get("c")
    assert kernels.BACKEND == "c" and c is not None and kernels.impl is c
    lm = LocalModel.load_sync(LocalModelConfig(gemma3, threads=1))
    assert lm.model.ops.k is c
    assert np.isfinite(lm.engine.prefill([2, 3, 4])).all()
