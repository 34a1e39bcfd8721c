"""GGUF dialects in circulation that cuca does not read, recognised so that the error names the dialect and what to
use instead (shared/specs/gemma4.md §3: cuca reads the files llama.cpp's convert_hf_to_gguf.py writes)."""

from __future__ import annotations

from ..errors import ProviderError
from ..gguf import GGUFFile

LLAMA_CPP_ASSISTANT = (
    "cuca reads the Gemma 4 assistant as llama.cpp's converter writes it (general.architecture 'gemma4-assistant', "
    "blk.N.* and nextn.pre_projection / nextn.post_projection tensors): use such a file (e.g. preset "
    "gemma4-e2b-mtp-q4_0, ggml-org/gemma-4-E2B-it-GGUF's mtp-gemma-4-E2B-it-Q4_0.gguf) or convert "
    "google/gemma-4-E2B-it-assistant with llama.cpp's convert_hf_to_gguf.py"
)


def check_dialect(f: GGUFFile) -> None:
    """Raise ProviderError for a known foreign dialect; return for everything else (unknown architectures are
    reported by the caller)."""
    arch = f.architecture
    if arch == "gemma4_assistant":
        mtp = sum(1 for n in f.tensors if n.startswith("mtp."))
        raise ProviderError(
            f"{f.path}: architecture 'gemma4_assistant' ({mtp} mtp.* tensors) is the older fork dialect of the "
            f"Gemma 4 assistant, not llama.cpp's; {LLAMA_CPP_ASSISTANT}"
        )
    if arch == "gemma4_mtp":
        raise ProviderError(
            f"{f.path}: architecture 'gemma4_mtp' is ik_llama.cpp's dialect of the Gemma 4 assistant, which only "
            f"ik_llama.cpp reads; {LLAMA_CPP_ASSISTANT}"
        )
    if arch == "qwen35" and is_mtp_sidecar(f):
        raise ProviderError(
            f"{f.path}: an MTP sidecar (what convert_hf_to_gguf.py --mtp writes: the prediction head only, no trunk "
            f"layers); cuca does not pair sidecars with their trunk file: use one file with the head inside (converted "
            f"without --mtp / --no-mtp, e.g. unsloth/Qwen3.5-0.8B-MTP-GGUF) and drafter in-trunk"
        )


def is_mtp_sidecar(f: GGUFFile) -> bool:
    """A file with nextn tensors and none of the trunk's first layer."""
    return any(".nextn." in n for n in f.tensors) and not any(n.startswith("blk.0.") for n in f.tensors)
