"""Architectures: one module per `general.architecture` (hyphens become underscores)."""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import numpy as np

from ..errors import ProviderError
from ..gguf import GGUFFile
from .cache import Cache
from .layers import Ops

ARCHITECTURES = ("llama", "gemma3", "gemma4", "qwen35")
DRAFTER_ARCHITECTURES = ("gemma4-assistant",)  # drafters only: they need a target to run


class Model(Protocol):
    arch: str
    n_vocab: int
    n_ctx_train: int

    def make_cache(self, n_ctx: int) -> Cache: ...

    def forward(
        self, tokens: np.ndarray, positions: np.ndarray, cache: Cache, logits: str = "last"
    ) -> np.ndarray: ...

    def forward_hidden(self, tokens: np.ndarray, positions: np.ndarray, cache: Cache) -> np.ndarray:
        """Hidden states after the final norm, (M, n_embd): what drafters that read the target consume."""

    def head(self, h: np.ndarray) -> np.ndarray:
        """Post-norm hidden (M, n_embd) -> logits (M, n_vocab), final softcap included."""


def load_model(f: GGUFFile, ops: Ops | None = None) -> Any:
    """Bind the weights of `f` to its architecture's Model (no copies: weights stay memory-mapped)."""
    if f.architecture in DRAFTER_ARCHITECTURES:
        raise ProviderError(
            f"{f.path}: architecture {f.architecture!r} is a drafter, not a model to generate with: load its target "
            f"as the source and pass this file as the drafter (DrafterSource.file(...))"
        )
    if f.architecture not in ARCHITECTURES:
        raise ProviderError(
            f"{f.path}: architecture {f.architecture!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    mod = importlib.import_module(f"{__name__}.{f.architecture.replace('-', '_')}")
    return mod.Model(f, ops or Ops())


def req(f: GGUFFile, suffix: str) -> Any:
    """The required key `{arch}.{suffix}`; a missing key raises naming it and the file."""
    return f.require(f.arch_key(suffix))


def opt(f: GGUFFile, suffix: str, default: Any) -> Any:
    return f.get(f.arch_key(suffix), default)
