"""The device a config names: "cpu", "cuda", "cuda:N", "torch-cpu"; what is missing for a GPU device is a
ConfigError that says what (PyTorch, a CUDA build, a visible GPU); the in-trunk head stays on the CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cuca import ConfigError, LocalModelConfig
from cuca.device import Device

QWEN35 = Path(__file__).parent / "fixtures" / "converted" / "qwen35-f32.gguf"


def test_device_names() -> None:
    assert Device.locate("cuda") == (Device.CUDA, 0) and Device.locate("CUDA:3") == (Device.CUDA, 3)
    assert Device.locate("torch-cpu") == (Device.TORCH_CPU, 0) and Device.parse("cuda:1") is Device.CUDA
    for bad in ("cuda:", "cuda:x", "cuda:-1", "torch-cpu:1", "cpu:0", "gpu"):
        with pytest.raises(ConfigError, match="device must be one of"):
            Device.locate(bad)
    assert Device.TORCH_CPU.torch and Device.CUDA.torch and not Device.CPU.torch


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "torch-cpu"])
def test_without_torch_the_error_says_so(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(ConfigError, match=r"needs PyTorch, which is not installed \(pip install \"cuca\[gpu\]\"\)"):
        LocalModelConfig(QWEN35, device=device).validate()


def test_without_cuda_the_error_says_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"no CUDA device 99: \d+ visible"):
            LocalModelConfig(QWEN35, device="cuda:99").validate()
        return
    with pytest.raises(ConfigError, match="device 'cuda': needs a CUDA (build of PyTorch|GPU)"):
        LocalModelConfig(QWEN35, device="cuda").validate()
    LocalModelConfig(QWEN35, device="torch-cpu").validate()  # torch alone is enough for CPU tensors


@pytest.mark.parametrize("device", ["cuda", "torch-cpu"])
def test_in_trunk_head_is_cpu_only(device: str) -> None:
    with pytest.raises(ConfigError, match="in-trunk prediction head runs on the CPU only"):
        LocalModelConfig(QWEN35, drafter="in-trunk", device=device).validate()


def test_the_cli_and_bench_take_a_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from synth import write_tiny

    from cuca import LocalModel
    from cuca.bench import add_bench_parser
    from cuca.bench.report import options_from_args
    from cuca.cli import main

    path = write_tiny(tmp_path / "t.gguf", arch="gemma3")
    assert main(["run", str(path), "hi", "--device", "vulkan", "--threads", "1"]) == 2
    assert "device 'vulkan' is not available" in capsys.readouterr().err
    sub = argparse.ArgumentParser().add_subparsers()
    assert options_from_args(add_bench_parser(sub).parse_args(["m.gguf", "--device", "cuda:1"])).device == "cuda:1"
    pytest.importorskip("torch")
    rc = main(["run", str(path), "abcabc", "--device", "torch-cpu", "--max-tokens", "6", "--threads", "1"])
    out = capsys.readouterr().out
    lm = LocalModel.load_sync(LocalModelConfig(path, threads=1, device="torch-cpu"))
    assert rc == 0 and out[:-1] == lm.complete_sync("abcabc", max_tokens=6).text
    assert lm.model.ops.device.type == "cpu"
